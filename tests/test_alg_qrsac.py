"""QR-SAC: the quantile Huber loss, the target and the risk measures against numbers worked by
hand, and the algorithm's target and actor terms through stub networks (the contract every
algorithm keeps is checked for QR-SAC with the others, in ``tests/test_alg_interface.py``)."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

import algorithms
from algorithms.configs import QrsacConfig
from algorithms.data import Experience, StepType
from algorithms.qrsac import (
    quantile_fractions,
    quantile_huber_loss,
    quantile_td_target,
    risk_value,
)
from tests import test_alg_interface as contract

OBS = gym.spaces.Box(-1, 1, (3,), np.float32)
BOX = gym.spaces.Box(-1, 1, (1,), np.float32)


def t(*x):
    return torch.tensor(x, dtype=torch.float32)


def test_quantile_fractions_are_the_midpoints():
    torch.testing.assert_close(quantile_fractions(2), t(0.25, 0.75))
    torch.testing.assert_close(quantile_fractions(3), t(1 / 6, 1 / 2, 5 / 6))


# Two quantiles [0, 1] (tau 1/4, 3/4) against targets [0.5, 3]; u_ij = target_j - theta_i:
#   i=0: u = 0.5 (weight 1/4, huber 0.125), 3 (1/4, 2.5)      -> mean_j 0.328125
#   i=1: u = -0.5 (|3/4 - 1|, 0.125), 2 (3/4, 1.5)             -> mean_j 0.578125
# kappa 2 (huber_2(u) / 2: 0.0625 at 0.5, 2 at 3, 1 at 2)       -> 0.2578125 and 0.3828125
@pytest.mark.parametrize("kappa,summed,expected", [
    (1.0, True, 0.90625), (1.0, False, 0.453125), (2.0, True, 0.640625)])
def test_quantile_huber_loss_of_two_quantiles_by_hand(kappa, summed, expected):
    loss = quantile_huber_loss(t(0.0, 1.0), t(0.5, 3.0), kappa, summed)
    torch.testing.assert_close(loss, torch.tensor(expected))


def test_quantile_huber_loss_of_three_quantiles_and_its_gradient_by_hand():
    # Quantiles [-1, 0, 2] (tau 1/6, 1/2, 5/6), one target 1: u = [2, 1, -1].
    #   weights |tau - 1{u < 0}| = [1/6, 1/2, 1/6], huber = [1.5, 0.5, 0.5] -> 1/4 + 1/4 + 1/12
    theta = t(-1.0, 0.0, 2.0).requires_grad_()
    loss = quantile_huber_loss(theta, t(1.0), 1.0, True)
    torch.testing.assert_close(loss, torch.tensor(7 / 12))
    loss.backward()
    # d/dtheta_i = -weight_i * huber'(u_i), huber'(u) = clip(u, -1, 1); the indicator has none.
    torch.testing.assert_close(theta.grad, t(-1 / 6, -1 / 2, 1 / 6))


def test_quantile_huber_loss_keeps_leading_dims_and_is_zero_at_the_target():
    theta = torch.randn(4, 2, 5)
    assert quantile_huber_loss(theta, torch.randn(4, 1, 5), 1.0, True).shape == (4, 2)
    same = t(1.0, 1.0, 1.0)
    assert quantile_huber_loss(same, same, 1.0, True) == 0


def test_quantile_td_target_by_hand():
    # r + gamma * d * Z'_j: 1 + 0.9 * 0.5 * [2, 4]; a termination (d = 0) keeps r alone.
    target = quantile_td_target(t(1.0, 1.0), t(0.5, 0.0), t(2.0, 4.0).expand(2, 2), 0.9)
    torch.testing.assert_close(target, torch.tensor([[1.9, 2.8], [1.0, 1.0]]))


@pytest.mark.parametrize("measure,level,expected", [
    ("mean", 1.0, 1.0),      # (3 - 1 + 2 + 0) / 4
    ("cvar", 1.0, 1.0),      # all four: the mean
    ("cvar", 0.5, -0.5),     # lowest 2 by value (-1, 0): crossed quantiles sort
    ("cvar", 0.3, -0.5),     # ceil(1.2) = 2
    ("cvar", 0.25, -1.0),    # lowest 1
])
def test_risk_measures_by_hand(measure, level, expected):
    torch.testing.assert_close(risk_value(t(3.0, -1.0, 2.0, 0.0), measure, level),
                               torch.tensor(expected))


def test_cvar_counts_the_lowest_ceil_of_level_times_n_without_float_error():
    # 0.3 * 10 is 3.0000000000000004 in floats; ceil must still give 3 quantiles, not 4.
    assert risk_value(torch.arange(10.0), "cvar", 0.3) == 1.0  # (0 + 1 + 2) / 3


# ----- the algorithm's terms, through stub networks --------------------------------------------
class _Dist:
    """A policy whose reparameterized sample is 0 with log-probability ``log_pi``."""

    def __init__(self, n, log_pi):
        self.n, self.log_pi = n, log_pi

    def rsample_and_log_prob(self, eps=None):
        return torch.zeros(self.n, 1), torch.full((self.n,), self.log_pi)


class _Actor(nn.Module):
    def __init__(self, log_pi):
        super().__init__()
        self.log_pi = log_pi

    def forward(self, obs):
        return _Dist(obs.shape[0], self.log_pi)


class _Critics(nn.Module):
    """Replicas of fixed quantiles ``[R, N]`` for every (s, a)."""

    def __init__(self, quantiles):
        super().__init__()
        self.register_buffer("z", quantiles)

    def forward(self, obs, action, detach_params=False):
        return self.z.expand(obs.shape[0], *self.z.shape)


class _PerSampleCritics(_Critics):
    """Fixed quantiles ``[B, R, N]``, one set per sample of a batch of ``B``."""

    def forward(self, obs, action, detach_params=False):
        return self.z


def _qrsac(**kw):
    config = QrsacConfig(actor_fc_layer_params=[8], critic_fc_layer_params=[8], **kw)
    alg = algorithms.make(config, OBS, BOX)
    with torch.no_grad():
        alg.log_alpha.fill_(math.log(2.0))  # alpha = 2
    alg.actor_network = _Actor(-0.25)       # alpha * log pi = -0.5
    return alg


def test_target_is_the_minimum_per_quantile_minus_alpha_log_pi_by_hand():
    alg = _qrsac(num_quantiles=2, gamma=0.9)
    # Replica 0 [1, 5], replica 1 [2, 3]: the minimum per quantile is [1, 3] (ALF's default;
    # the replica of lower mean would be [2, 3]); minus alpha log pi: [1.5, 3.5].
    alg.target_critic_networks = _Critics(t(1.0, 5.0, 2.0, 3.0).view(2, 2))
    exp = Experience(step_type=torch.tensor([[1, 1], [1, 2]]), reward=t(0, 1, 0, 2).view(2, 2),
                     discount=t(1, 1, 1, 0).view(2, 2), observation=torch.zeros(2, 2, 3),
                     action=torch.zeros(2, 2, 1))
    info = alg.train_step(exp).info
    # r + 0.9 * d * [1.5, 3.5]: [1 + 1.35, 1 + 3.15]; a termination gives r alone.
    torch.testing.assert_close(info["target"], torch.tensor([[[2.35, 4.15]], [[2.0, 2.0]]]))
    no_entropy = _qrsac(num_quantiles=2, use_entropy_reward=False)
    no_entropy.target_critic_networks = alg.target_critic_networks
    torch.testing.assert_close(no_entropy._soft_target_quantiles(torch.zeros(1, 3), 2.0),
                               t(1.0, 3.0).view(1, 2))


def test_by_critic_mean_the_target_takes_the_replica_of_the_lower_mean_by_hand():
    alg = _qrsac(num_quantiles=2, min_critic_by_critic_mean=True)
    # Replica 0 [1, 5] (mean 3), replica 1 [2, 3] (mean 2.5): the target takes [2, 3], minus
    # alpha log pi: [2.5, 3.5]. Each sample chooses its own replica.
    critics = torch.tensor([[[1.0, 5.0], [2.0, 3.0]], [[0.0, 1.0], [4.0, 4.0]]])   # [B, R, N]
    alg.target_critic_networks = _PerSampleCritics(critics)
    torch.testing.assert_close(alg._soft_target_quantiles(torch.zeros(2, 3), 2.0),
                               torch.tensor([[2.5, 3.5], [0.5, 1.5]]))


@pytest.mark.parametrize("by_mean,expected", [
    (False, -0.5 - 2.25),  # min per quantile [0, 3, 8, -2], mean 2.25
    (True, -0.5 - 2.75),   # replica means 3.5 and 2.75: the second, [1, 3, 9, -2]
])
def test_actor_value_follows_the_replica_minimum_rule_by_hand(by_mean, expected):
    alg = _qrsac(num_quantiles=4, min_critic_by_critic_mean=by_mean)
    alg.critic_networks = _Critics(t(0, 4, 8, 2, 1, 3, 9, -2).view(2, 4))
    actor_loss, _ = alg._actor_objective(torch.zeros(3, 3), 2.0)
    torch.testing.assert_close(actor_loss, torch.full((3,), expected))


@pytest.mark.parametrize("measure,level,expected", [
    ("mean", 0.25, -0.5 - 2.25),  # min per quantile [0, 3, 8, -2], mean 2.25
    ("cvar", 0.5, -0.5 + 1.0),    # lowest two: -2, 0
])
def test_actor_loss_is_alpha_log_pi_minus_the_risk_of_the_minimum_by_hand(measure, level,
                                                                          expected):
    alg = _qrsac(num_quantiles=4, risk_measure=measure, risk_level=level)
    alg.critic_networks = _Critics(t(0, 4, 8, 2, 1, 3, 9, -2).view(2, 4))
    actor_loss, entropy = alg._actor_objective(torch.zeros(3, 3), 2.0)
    torch.testing.assert_close(actor_loss, torch.full((3,), expected))
    torch.testing.assert_close(entropy, torch.full((3,), 0.25))


def test_critic_loss_sums_the_replicas_and_masks_last_rows():
    alg = _qrsac(num_quantiles=2)
    z = torch.tensor([[0.0, 1.0], [0.0, 1.0]]).expand(2, 1, 2, 2)      # [B, T-1, R, N]
    target = t(0.5, 3.0).expand(2, 1, 2)
    exp = Experience(step_type=torch.tensor([[1, 1], [2, 0]]), reward=torch.zeros(2, 2),
                     discount=torch.ones(2, 2), observation=torch.zeros(2, 2, 3),
                     action=torch.zeros(2, 2, 1))
    li = alg.calc_loss({"exp": exp, "quantiles": z, "target": target,
                        "actor_loss": torch.zeros(2, 1), "entropy": torch.zeros(2, 1)})
    # Two replicas of the two-quantile case above (0.90625 each); the LAST row trains nothing.
    torch.testing.assert_close(li.loss, t(2 * 0.90625, 0.0))
    # Priority: |mean target - mean quantiles| = |1.75 - 0.5|.
    torch.testing.assert_close(li.priority, t(1.25, 0.0))


def test_discrete_actions_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="qrsac takes a Box action space"):
        algorithms.make(QrsacConfig(), OBS, gym.spaces.Discrete(3))


def test_cvar_trains_and_bfloat16_runs():
    for config in (QrsacConfig(critic_fc_layer_params=[8], risk_measure="cvar", risk_level=0.1),
                   QrsacConfig(critic_fc_layer_params=[8], precision="bfloat16")):
        alg = algorithms.make(config, contract.PENDULUM_OBS, contract.BOX)
        batch = contract._batch(alg, contract.PENDULUM_OBS, contract.BOX)
        metrics = alg.train_on(batch).metrics
        assert all(np.isfinite(v) for v in metrics.values())
        assert alg.num_updates == 1 and StepType.LAST in batch.step_type
