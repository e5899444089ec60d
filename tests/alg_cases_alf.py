"""The alf family's cases of tests/test_alg_interface.py: a small config per algorithm
(``SMALL``) and the (name, observation space, action space) it runs on (``CASES``)."""

from algorithms.config_alf import OacConfig, PpgConfig, TaacConfig
from tests.alg_spaces import BOX, CARTPOLE_OBS, DISCRETE, PENDULUM_OBS  # noqa: F401

SMALL: dict = {
    "oac": OacConfig(actor_fc_layer_params=[8], critic_fc_layer_params=[8]),
    # An auxiliary phase every second unroll, so the contract covers both phases.
    "ppg": PpgConfig(actor_fc_layer_params=[8], value_fc_layer_params=[8], mini_batch_size=8,
                     num_epochs=2, aux_interval=2, aux_epochs=2, aux_mini_batch_size=8),
}
CASES: list = [("oac", PENDULUM_OBS, BOX), ("ppg", CARTPOLE_OBS, DISCRETE),
               ("ppg", PENDULUM_OBS, BOX)]
SMALL["taac"] = TaacConfig(actor_fc_layer_params=[8], critic_fc_layer_params=[8])
CASES.append(("taac", PENDULUM_OBS, BOX))
