"""Every algorithm with a target network: after one update, each target is exactly
``(1 - tau) * target + tau * online``, and it moved.

The algorithms are walked from the registry and their target networks found by name
(``target_<online>``), so an algorithm added with a target network is tested here without a
line added.
"""

import gymnasium as gym
import numpy as np
import pytest
import torch

from algorithms import configs, registry
from algorithms.data import Experience
from algorithms.steps import TimeStep
from tests.test_alg_interface import FAMILIES

TAU = 0.25
BATCH, WINDOW, OBS_DIM = 16, 2, 3

# The action space each algorithm is built for here (a new algorithm must name one).
ACTION_SPACES = {
    "dqn": gym.spaces.Discrete(3),
    "sac": gym.spaces.Box(-1, 1, (2,), np.float32),
    "qrsac": gym.spaces.Box(-1, 1, (2,), np.float32),
    "ddpg": gym.spaces.Box(-1, 1, (2,), np.float32),
    "td3": gym.spaces.Box(-1, 1, (2,), np.float32),
    "ppo": gym.spaces.Discrete(3),
    "a2c": gym.spaces.Discrete(3),
}
# Each family's: its TARGET_ACTION_SPACES, else the action space of its first interface case.
for _family in FAMILIES:
    for _name, _, _space in _family.CASES:
        ACTION_SPACES.setdefault(_name, getattr(_family, "TARGET_ACTION_SPACES", {}).get(
            _name, _space))


def _build(name: str):
    """``name`` with small networks, a soft target update after every gradient step."""
    fields = {f.name for f in configs.dataclasses.fields(configs.config_class(name))}
    overrides = {k: [16] for k in fields if k.endswith("fc_layer_params")
                 and k != "shared_encoder_fc_layer_params"}
    overrides.update({k: v for k, v in (("target_update_tau", TAU), ("target_update_period", 1),
                                        ("actor_update_period", 1)) if k in fields})
    config = configs.parse({"name": name, **overrides})
    obs_space = gym.spaces.Box(-1, 1, (OBS_DIM,), np.float32)
    return registry.make(config, obs_space, ACTION_SPACES[name])


def _targets(alg) -> list[tuple[str, str]]:
    """``(target, online)`` attribute names of every target network the algorithm holds."""
    children = dict(alg.named_children())
    pairs = [(n, n[len("target_"):]) for n in children if n.startswith("target_")]
    for target, online in pairs:
        assert online in children, f"{target} has no online network {online!r}"
    return pairs


def _batch(alg, action_space) -> Experience:
    """Windows of two MID steps (nothing masked), random observations and rewards; the
    ``rollout_info`` (an algorithm that keeps some: TAAC's previous action) is what the
    algorithm's own ``rollout_step`` gives on those steps."""
    g = torch.Generator().manual_seed(1)
    if isinstance(action_space, gym.spaces.Discrete):
        action = torch.randint(0, int(action_space.n), (BATCH, WINDOW), generator=g)
    else:
        action = torch.rand(BATCH, WINDOW, *action_space.shape, generator=g) * 2 - 1
    step_type = torch.ones(BATCH, WINDOW, dtype=torch.int64)
    observation = torch.randn(BATCH, WINDOW, OBS_DIM, generator=g)
    reward = torch.randn(BATCH, WINDOW, generator=g)
    n = BATCH * WINDOW
    step = alg.rollout_step(TimeStep(step_type.reshape(n), reward.reshape(n), torch.ones(n),
                                     observation.reshape(n, OBS_DIM),
                                     action.reshape(n, *action.shape[2:]), torch.arange(n)),
                            alg.get_initial_state(n))
    info = {k: v.reshape(BATCH, WINDOW, *v.shape[1:]) for k, v in (step.info or {}).items()
            if isinstance(v, torch.Tensor)}
    return Experience(step_type=step_type, reward=reward, discount=torch.ones(BATCH, WINDOW),
                      observation=observation, action=action, rollout_info=info or ())


def test_every_action_space_is_named():
    assert set(registry.algorithm_names()) <= set(ACTION_SPACES), (
        "name the action space of the new algorithm in ACTION_SPACES")


@pytest.mark.parametrize("name", registry.algorithm_names())
def test_target_networks_follow_by_tau_after_an_update(name):
    alg = _build(name)
    pairs = _targets(alg)
    if not pairs:
        pytest.skip(f"{name} has no target network")
    before = {t: {k: v.clone() for k, v in getattr(alg, t).state_dict().items()}
              for t, _ in pairs}
    alg.train_on(_batch(alg, ACTION_SPACES[name]))
    for target, online in pairs:
        now = getattr(alg, online).state_dict()
        moved = False
        for k, v in getattr(alg, target).state_dict().items():
            torch.testing.assert_close(v, (1 - TAU) * before[target][k] + TAU * now[k],
                                       msg=f"{name}.{target}.{k}")
            moved |= not torch.equal(v, before[target][k])
        # Adam moves every parameter whose gradient is not zero, and the last layer's bias
        # has the TD error (or the actor loss's gradient) for its gradient: never all zero here.
        assert moved, f"{name}: the update moved no parameter of {online}"
