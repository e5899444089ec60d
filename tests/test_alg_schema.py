"""Every algorithm's declared experience schema is what its ``rollout_step`` really produces
(names, dtypes, shapes), so a hop that checks a batch against it never refuses a correct one;
and a batch with a missing, extra or mistyped field is one line naming the field."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from algorithms import configs, registry
from algorithms.schema import FieldSpec, SchemaError, agent_schema
from algorithms.steps import TimeStep
from tests.test_alg_interface import FAMILIES

OBS = gym.spaces.Box(-1, 1, (4,), np.float32)
PIXELS = gym.spaces.Box(0, 255, (10, 10, 3), np.uint8)
DISCRETE, BOX = gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,), np.float32)
# (algorithm, extra config, observation space, action spaces it takes)
CASES = [
    ("dqn", {}, OBS, [DISCRETE]),
    ("dqn", {"encoder": "minatar_cnn"}, PIXELS, [DISCRETE]),
    ("sac", {}, OBS, [DISCRETE, BOX]),
    ("qrsac", {}, OBS, [BOX]),
    ("ddpg", {}, OBS, [BOX]),
    ("td3", {}, OBS, [BOX]),
    ("ppo", {}, OBS, [DISCRETE, BOX]),
    ("ppo", {"rnn_size": 8, "shared_encoder_fc_layer_params": [16]}, OBS, [DISCRETE]),
    ("a2c", {}, OBS, [DISCRETE, BOX]),
    ("random", {}, OBS, [DISCRETE, BOX]),
]
# Each family's: its SCHEMA_CASES, else one case per algorithm from its interface cases.
for _family in FAMILIES:
    if hasattr(_family, "SCHEMA_CASES"):
        CASES += _family.SCHEMA_CASES
    else:
        CASES += [(name, {}, obs, [act]) for name, obs, act in _family.CASES]


def test_every_algorithm_is_covered():
    assert {c[0] for c in CASES} >= {*registry.algorithm_names(), "random"}


def _rows(config, obs_space, action_space, batch: int = 3) -> dict:
    """One step as the unroller sends it: the time step, the action, ``rollout_info.*``."""
    alg = registry.make(config, obs_space, action_space)
    obs = np.stack([obs_space.sample() for _ in range(batch)])
    prev = np.stack([action_space.sample() for _ in range(batch)]).astype(
        np.int64 if isinstance(action_space, gym.spaces.Discrete) else np.float32)
    ts = TimeStep(step_type=np.zeros(batch, np.int64), reward=np.zeros(batch, np.float32),
                  discount=np.ones(batch, np.float32), observation=obs, prev_action=prev,
                  env_id=np.arange(batch, dtype=np.int64))
    with torch.no_grad():
        step = alg.rollout_step(ts, alg.get_initial_state(batch))
    out = lambda x: x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)  # noqa: E731
    return {**ts._asdict(), "action": out(step.output),
            **{f"rollout_info.{k}": out(v) for k, v in (step.info or {}).items()}}


@pytest.mark.parametrize("name,extra,obs_space,action_spaces", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_the_declared_schema_is_what_rollout_step_produces(name, extra, obs_space,
                                                           action_spaces):
    config = configs.parse({"name": name, **extra})
    for action_space in action_spaces:
        agent_schema(config, obs_space, action_space).check(
            _rows(config, obs_space, action_space), 1, f"{name} {action_space}")


def test_a_wrong_batch_names_the_field_expected_and_got():
    config = configs.parse({"name": "ppo"})
    schema = agent_schema(config, OBS, DISCRETE)
    rows = _rows(config, OBS, DISCRETE)
    with pytest.raises(SchemaError, match=r"unroller: field 'rollout_info.value' is missing"):
        schema.check({k: v for k, v in rows.items() if k != "rollout_info.value"}, 1,
                     "unroller")
    with pytest.raises(SchemaError, match=r"field 'observation': expected float32\[4\], "
                                          r"got float64\[4\]"):
        schema.check({**rows, "observation": rows["observation"].astype(np.float64)}, 1, "x")
    with pytest.raises(SchemaError, match=r"field 'nstep.return' is not in the schema"):
        schema.check({**rows, "nstep.return": rows["reward"]}, 1, "x")
    schema.with_extras("nstep.").check({**rows, "nstep.return": rows["reward"]}, 1, "x")
    assert schema.fields["rollout_info.log_prob"] == FieldSpec((), "float32")
