"""SAC's entropy temperature (issue 37, item 6): after one update, alpha rises when the
policy's entropy is below ``target_entropy`` and falls when it is above.

The policy's entropy is measured here independently of the algorithm (``-E[log pi(a|s)]`` over
many actions its actor network samples), and the target set a margin below or above it, so
both directions are tested. Mutation this catches: the actor objective returning ``log pi``
as the entropy (the sign of the temperature's gradient flips in one of the two directions;
before, only the 13-minute SAC learning run noticed).
"""

import gymnasium as gym
import numpy as np
import pytest
import torch

from algorithms import configs, registry
from algorithms.data import Experience

BATCH, WINDOW, OBS_DIM = 512, 2, 3
ACTIONS = gym.spaces.Box(-1, 1, (2,), np.float32)


def _sac():
    torch.manual_seed(0)
    config = configs.parse({"name": "sac", "actor_fc_layer_params": [16],
                            "critic_fc_layer_params": [16]})
    return registry.make(config, gym.spaces.Box(-1, 1, (OBS_DIM,), np.float32), ACTIONS)


def _batch() -> Experience:
    g = torch.Generator().manual_seed(1)
    return Experience(step_type=torch.ones(BATCH, WINDOW, dtype=torch.int64),
                      reward=torch.randn(BATCH, WINDOW, generator=g),
                      discount=torch.ones(BATCH, WINDOW),
                      observation=torch.randn(BATCH, WINDOW, OBS_DIM, generator=g),
                      action=torch.rand(BATCH, WINDOW, 2, generator=g) * 2 - 1)


def _entropy(alg, exp: Experience) -> float:
    """``-E[log pi(a|s)]`` over the batch's observations, 16 actions each."""
    with torch.no_grad():
        obs = exp.observation[:, :-1].flatten(0, 1)
        dist = alg.actor_network(obs)
        actions = dist.sample((16,))
        return float(-dist.log_prob(actions).mean())


@pytest.mark.parametrize("side", ["below", "above"])
def test_alpha_moves_toward_the_entropy_target_after_one_update(side):
    alg = _sac()
    exp = _batch()
    entropy = _entropy(alg, exp)
    assert abs(entropy) > 0.1, entropy  # a margin either side that sampling cannot cross
    margin = 0.5 * abs(entropy)
    alg.target_entropy = entropy + margin if side == "below" else entropy - margin
    before = float(alg.log_alpha.detach())
    alg.train_on(exp)
    after = float(alg.log_alpha.detach())
    if side == "below":  # too little entropy: a larger temperature pays for more
        assert after > before, (entropy, alg.target_entropy, before, after)
    else:
        assert after < before, (entropy, alg.target_entropy, before, after)
