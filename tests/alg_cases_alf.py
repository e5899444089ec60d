"""The alf family's cases of tests/test_alg_interface.py: a small config per algorithm
(``SMALL``) and the (name, observation space, action space) it runs on (``CASES``)."""

from tests.alg_spaces import BOX, CARTPOLE_OBS, DISCRETE, PENDULUM_OBS  # noqa: F401

SMALL: dict = {}
CASES: list = []
