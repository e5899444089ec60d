"""The async family's cases of tests/test_alg_interface.py: a small config per algorithm
(``SMALL``) and the (name, observation space, action space) it runs on (``CASES``).

Also what the registry-walking tests need of this family, for their tables:
``TARGET_ACTION_SPACES`` (tests/test_alg_target_networks.py's ``ACTION_SPACES``) and
``SCHEMA_CASES`` (tests/test_alg_schema.py's ``CASES``)."""

import gymnasium as gym
import numpy as np

from algorithms.config_async import AppoConfig, ImpalaConfig
from tests.alg_spaces import BOX, CARTPOLE_OBS, DISCRETE, PENDULUM_OBS  # noqa: F401

SMALL: dict = {
    "impala": ImpalaConfig(actor_fc_layer_params=[8], value_fc_layer_params=[8],
                           mini_batch_size=10, num_epochs=2),
    "appo": AppoConfig(actor_fc_layer_params=[8], value_fc_layer_params=[8], mini_batch_size=8,
                       num_epochs=2),
}
CASES: list = [("impala", CARTPOLE_OBS, DISCRETE), ("impala", PENDULUM_OBS, BOX),
               ("appo", CARTPOLE_OBS, DISCRETE), ("appo", PENDULUM_OBS, BOX)]

TARGET_ACTION_SPACES = {"impala": gym.spaces.Discrete(3), "appo": gym.spaces.Discrete(3)}
_OBS = gym.spaces.Box(-1, 1, (4,), np.float32)
_DISCRETE, _BOX = gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,), np.float32)
SCHEMA_CASES = [
    ("impala", {}, _OBS, [_DISCRETE, _BOX]),
    ("impala", {"rnn_size": 8, "shared_encoder_fc_layer_params": [16]}, _OBS, [_DISCRETE]),
    ("appo", {}, _OBS, [_DISCRETE, _BOX]),
    ("appo", {"rnn_size": 8}, _OBS, [_DISCRETE]),
]
