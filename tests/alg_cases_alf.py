"""The alf family's cases of tests/test_alg_interface.py: a small config per algorithm
(``SMALL``) and the (name, observation space, action space) it runs on (``CASES``)."""

from algorithms.config_alf import OacConfig
from tests.alg_spaces import BOX, CARTPOLE_OBS, DISCRETE, PENDULUM_OBS  # noqa: F401

SMALL: dict = {
    "oac": OacConfig(actor_fc_layer_params=[8], critic_fc_layer_params=[8]),
}
CASES: list = [("oac", PENDULUM_OBS, BOX)]
