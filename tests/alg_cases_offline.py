"""The offline family's cases of tests/test_alg_interface.py: a small config per algorithm
(``SMALL``) and the (name, observation space, action space) it runs on (``CASES``).

Also what the registry-walking tests need of this family, for their tables:
``TARGET_ACTION_SPACES`` (tests/test_alg_target_networks.py's ``ACTION_SPACES``: IQL's target
critics) and ``SCHEMA_CASES`` (tests/test_alg_schema.py's ``CASES``)."""

import gymnasium as gym
import numpy as np

from algorithms.config_offline import BcConfig, CqlConfig, IqlConfig
from tests.alg_spaces import BOX, CARTPOLE_OBS, DISCRETE, PENDULUM_OBS  # noqa: F401

SMALL: dict = {
    "bc": BcConfig(actor_fc_layer_params=[8], rollout_noise=0.1),  # noisy: not its own greedy actions
    "iql": IqlConfig(actor_fc_layer_params=[8], critic_fc_layer_params=[8],
                     value_fc_layer_params=[8]),
    "cql": CqlConfig(actor_fc_layer_params=[8], critic_fc_layer_params=[8], cql_num_actions=2),
}
CASES: list = [("bc", CARTPOLE_OBS, DISCRETE), ("bc", PENDULUM_OBS, BOX),
               ("iql", PENDULUM_OBS, BOX), ("cql", PENDULUM_OBS, BOX)]

TARGET_ACTION_SPACES = {"bc": gym.spaces.Discrete(3),
                        "iql": gym.spaces.Box(-1, 1, (2,), np.float32),
                        "cql": gym.spaces.Box(-1, 1, (2,), np.float32)}
_OBS = gym.spaces.Box(-1, 1, (4,), np.float32)
SCHEMA_CASES = [("bc", {}, _OBS, [gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,), np.float32)]),
                ("iql", {}, _OBS, [gym.spaces.Box(-1, 1, (2,), np.float32)]),
                ("cql", {}, _OBS, [gym.spaces.Box(-1, 1, (2,), np.float32)])]
