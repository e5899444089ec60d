"""OAC: the optimistic shift and the upper bound against numbers worked by hand, and the
algorithm's rollout through stub networks (the contract every algorithm keeps is checked for
OAC with the others, in ``tests/test_alg_interface.py``)."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

import algorithms
from algorithms.config_alf import OacConfig
from algorithms.data import StepType, TimeStep
from algorithms.networks import SquashedNormal
from algorithms.oac import optimistic_shift, upper_bound

OBS = gym.spaces.Box(-1, 1, (3,), np.float32)


def t(*x):
    return torch.tensor(x, dtype=torch.float32)


def test_upper_bound_of_two_critics_is_mean_plus_beta_half_the_gap():
    # mean 2, |3 - 1| / 2 = 1: 2 + 4.6 * 1; three replicas [0, 3, 6]: mean 3, std sqrt(6).
    torch.testing.assert_close(upper_bound(t(3.0, 1.0).view(1, 2), 4.6), t(6.6))
    torch.testing.assert_close(upper_bound(t(0.0, 3.0, 6.0).view(1, 3), 1.0),
                               t(3.0 + math.sqrt(6.0)))


def test_optimistic_shift_by_hand():
    # g = (2, 1), var = (1, 4): var * g = (2, 4), g' var g = 4 + 4 = 8, norm 2 sqrt 2;
    # delta sqrt 2: shift = sqrt 2 * (2, 4) / (2 sqrt 2) = (1, 2).
    mu = optimistic_shift(t(0.5, -0.5).view(1, 2), t(1.0, 4.0).view(1, 2),
                          t(2.0, 1.0).view(1, 2), math.sqrt(2.0))
    torch.testing.assert_close(mu, t(1.5, 1.5).view(1, 2), rtol=0, atol=1e-5)


def test_the_shifted_gaussian_is_delta_squared_over_two_from_the_policy():
    g = torch.Generator().manual_seed(0)
    mean, grad = torch.randn(5, 3, generator=g), torch.randn(5, 3, generator=g)
    var = torch.rand(5, 3, generator=g) + 0.1
    shifted = optimistic_shift(mean, var, grad, 0.7)
    kl = 0.5 * ((shifted - mean).square() / var).sum(-1)
    torch.testing.assert_close(kl, torch.full((5,), 0.5 * 0.7 ** 2), rtol=1e-4, atol=1e-6)
    # A zero gradient (flat critics) keeps the policy's mean.
    torch.testing.assert_close(optimistic_shift(mean, var, torch.zeros(5, 3), 0.7), mean)


# ----- through the algorithm, with stub networks ------------------------------------------------
class _Actor(nn.Module):
    """Pre-tanh mean ``loc`` and std ``scale`` for every state."""

    def __init__(self, loc, scale, action_space):
        super().__init__()
        self.loc, self.scale = loc, scale
        self.scaler = algorithms.networks._ActionScaler(action_space)

    def forward(self, obs):
        n = obs.shape[0]
        return SquashedNormal(self.loc.expand(n, -1), self.scale.expand(n, -1),
                              self.scaler.scale, self.scaler.bias)


class _LinearCritics(nn.Module):
    """``Q_1 = 2 a_1 + a_2 + 1``, ``Q_2 = a_2 - 1``: Q_1 - Q_2 = 2 a_1 + 2 > 0 near a = 0."""

    def forward(self, obs, action, detach_params=False):
        a1, a2 = action[:, 0], action[:, 1]
        return torch.stack([2 * a1 + a2 + 1, a2 - 1], -1)


def _oac(action_space, loc, scale, **kw):
    alg = algorithms.make(OacConfig(actor_fc_layer_params=[8], critic_fc_layer_params=[8],
                                    **kw), OBS, action_space)
    alg.actor_network = _Actor(loc, scale, action_space)
    alg.critic_networks = _LinearCritics()
    return alg


def _time_step(b):
    return TimeStep(step_type=torch.full((b,), StepType.MID), reward=torch.zeros(b),
                    discount=torch.ones(b), observation=torch.zeros(b, 3), prev_action=(),
                    env_id=torch.arange(b))


def test_exploration_mean_by_hand_at_unit_bounds():
    # mu_T = 0 (tanh' = 1), bounds [-1, 1]: dQ_UB/du = (1, 1) + beta (1, 0) = (2, 1) at beta 1;
    # sigma (1, 2): the shift of test_optimistic_shift_by_hand at delta sqrt 2, (1, 2).
    box = gym.spaces.Box(-1, 1, (2,), np.float32)
    alg = _oac(box, t(0.0, 0.0), t(1.0, 2.0), beta_ub=1.0, explore_delta=math.sqrt(2.0))
    mean, std = alg.exploration_gaussian(torch.zeros(4, 3))
    torch.testing.assert_close(mean, t(1.0, 2.0).expand(4, 2), rtol=0, atol=1e-5)
    torch.testing.assert_close(std, t(1.0, 2.0).expand(4, 2))


def test_exploration_gradient_goes_through_tanh_and_the_bounds():
    # Bounds [-2, 2] and mu_T = atanh(0.5): da/du = 2 * (1 - 0.25) = 1.5, so g = 1.5 * (2, 1)
    # at beta 1; the shift's direction is that of var * g, its size fixed by delta: with
    # var (1, 1), shift = delta * (2, 1) / sqrt 5.
    box = gym.spaces.Box(-2, 2, (2,), np.float32)
    u = math.atanh(0.5)
    alg = _oac(box, t(u, u), t(1.0, 1.0), beta_ub=1.0, explore_delta=1.0)
    mean, _ = alg.exploration_gaussian(torch.zeros(1, 3))
    expected = t(u + 2 / math.sqrt(5), u + 1 / math.sqrt(5)).view(1, 2)
    torch.testing.assert_close(mean, expected, rtol=0, atol=1e-5)


def test_rollout_samples_the_shifted_gaussian_and_predict_keeps_the_policy_mode():
    box = gym.spaces.Box(-1, 1, (2,), np.float32)
    alg = _oac(box, t(0.0, 0.0), t(1.0, 2.0), beta_ub=1.0, explore_delta=math.sqrt(2.0))
    torch.manual_seed(3)
    action = alg.rollout_step(_time_step(4)).output
    torch.manual_seed(3)
    eps = torch.randn(4, 2)
    torch.testing.assert_close(action, torch.tanh(t(1.0, 2.0) + t(1.0, 2.0) * eps),
                               rtol=0, atol=1e-5)
    # Evaluation is SAC's: the policy's own mode, tanh(0) = 0, no optimism.
    torch.testing.assert_close(alg.predict_step(_time_step(4)).output, torch.zeros(4, 2))
    # Explore delta 0: the rollout samples SAC's policy.
    sac_like = _oac(box, t(0.0, 0.0), t(1.0, 2.0), explore_delta=0.0)
    torch.manual_seed(3)
    torch.testing.assert_close(sac_like.rollout_step(_time_step(4)).output,
                               torch.tanh(t(1.0, 2.0) * eps), rtol=0, atol=1e-5)


def test_rollout_acts_uniformly_first_and_under_no_grad():
    box = gym.spaces.Box(-1, 1, (2,), np.float32)
    alg = _oac(box, t(0.0, 0.0), t(1.0, 2.0), initial_random_steps=4)
    with torch.no_grad():  # as the unroller calls it: the shift still gets its gradient
        first = alg.rollout_step(_time_step(4)).output
        later = alg.rollout_step(_time_step(4)).output
    assert first.shape == later.shape == (4, 2) and alg.env_steps == 8


def test_the_policy_parameters_carry_the_critics_and_discrete_actions_are_refused():
    alg = algorithms.make(OacConfig(actor_fc_layer_params=[8], critic_fc_layer_params=[8]),
                          OBS, gym.spaces.Box(-1, 1, (2,), np.float32))
    assert any(k.startswith("critic_networks.") for k in alg.policy_state_dict())
    with pytest.raises(ValueError, match="Box action space"):
        algorithms.make(OacConfig(), OBS, gym.spaces.Discrete(2))
