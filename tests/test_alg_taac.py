"""TAAC: the compare-through return, the switch probabilities and the entropy targets against
numbers worked by hand, and the act-or-repeat decision and the targets through stub networks
(the contract every algorithm keeps is checked for TAAC with the others, in
``tests/test_alg_interface.py``)."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

import algorithms
from algorithms.config_alf import TaacConfig
from algorithms.data import Experience, StepType, TimeStep
from algorithms.networks import SquashedNormal, _ActionScaler
from algorithms.taac import (
    compare_through_returns,
    default_action_entropy,
    default_switch_entropy,
    switch_probabilities,
)

OBS = gym.spaces.Box(-1, 1, (3,), np.float32)
BOX = gym.spaces.Box(-1, 1, (1,), np.float32)


def t(*x):
    return torch.tensor(x, dtype=torch.float32)


def row(*x):
    return t(*x).view(1, -1)


# gamma 0.5, rewards [0, 1, 2, 4] (r[t] arrives at t), values V = [10, 20, 40, 80]:
#   nobody switches:    G_2 = 4 + 40 = 44, G_1 = 2 + 22 = 24, G_0 = 1 + 12 = 13
#   a switch at step 2: X_2 = V_2 = 40 -> G_1 = 2 + 20 = 22, G_0 = 1 + 11 = 12
#   a switch at step 1: G_0 = 1 + 10 = 11 (G_1 runs on: 24)
#   a switch at step 0: changes nothing (no row bootstraps at its own step)
#   step 2 LAST with discount 0: G_1 = 2 + 0, G_0 = 1 + 0.5 * 2 = 2 (row 2's G is masked later)
@pytest.mark.parametrize("switched,step_type,discount,expected", [
    ([0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1], [13, 24, 44]),
    ([0, 0, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1], [12, 22, 44]),
    ([0, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1], [11, 24, 44]),
    ([1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1], [13, 24, 44]),
    ([0, 0, 0, 0], [1, 1, 2, 0], [1, 1, 0, 1], [2, 2, 44]),
    ([1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [11, 22, 44]),  # every step: one-step targets
])
def test_compare_through_returns_by_hand(switched, step_type, discount, expected):
    g = compare_through_returns(row(0, 1, 2, 4), row(*discount), torch.tensor([step_type]),
                                torch.tensor([switched]).bool(), row(10, 20, 40, 80), 0.5)
    torch.testing.assert_close(g, row(*expected))


def test_switch_probabilities_are_a_softmax_of_q_over_alpha():
    e = math.e
    torch.testing.assert_close(switch_probabilities(t(1.0), t(2.0), torch.tensor(1.0)),
                               row(1 / (1 + e), e / (1 + e)))
    # alpha 0.5 doubles the gap; alpha near 0 picks the larger Q.
    torch.testing.assert_close(switch_probabilities(t(1.0), t(2.0), torch.tensor(0.5)),
                               row(1 / (1 + e * e), e * e / (1 + e * e)))
    torch.testing.assert_close(switch_probabilities(t(3.0), t(2.0), torch.tensor(0.0)), row(1.0, 0.0))


def test_default_entropy_targets_are_alfs():
    # Four dimensions on [-1, 1] at 0.1 of each range: 4 log 0.2.
    box4 = gym.spaces.Box(-1, 1, (4,), np.float32)
    assert default_action_entropy(box4, 0.1) == pytest.approx(4 * math.log(0.2))
    # (0.05, 0.95): -0.05 log 0.05 - 0.95 log 0.95.
    assert default_switch_entropy(0.05) == pytest.approx(0.1985152, abs=1e-6)


# ----- the act-or-repeat decision, through stub networks ----------------------------------------
class _Actor(nn.Module):
    """A near-deterministic actor whose action is ``tanh(loc)`` whatever it is given."""

    def __init__(self, loc):
        super().__init__()
        self.loc = loc
        self.scaler = _ActionScaler(BOX)

    def forward(self, x):
        n = x.shape[0]
        return SquashedNormal(torch.full((n, 1), self.loc), torch.full((n, 1), 1e-6),
                              self.scaler.scale, self.scaler.bias)


class _Critics(nn.Module):
    """Two replicas of ``Q(s, a) = -(a - 0.5)^2``."""

    def forward(self, obs, action, detach_params=False):
        q = -(action[:, 0] - 0.5).square()
        return torch.stack([q, q], -1)


def _taac(**kw):
    alg = algorithms.make(TaacConfig(actor_fc_layer_params=[8], critic_fc_layer_params=[8],
                                     **kw), OBS, BOX)
    alg.actor_network = _Actor(math.atanh(0.5))  # proposes 0.5, the best action
    alg.critic_networks = _Critics()
    alg.target_critic_networks = _Critics()
    return alg


def _time_step(step_types):
    b = len(step_types)
    return TimeStep(step_type=torch.tensor(step_types), reward=torch.zeros(b),
                    discount=torch.ones(b), observation=torch.zeros(b, 3), prev_action=(),
                    env_id=torch.arange(b))


def test_greedy_act_switches_to_the_better_action_and_repeats_an_equal_one():
    alg = _taac()
    # Previous actions: 0.9 (worse than 0.5: switch), 0.5 (as good: repeat), 0.5 at an
    # episode's first step (the previous action is reset to 0, the middle: switch).
    prev = t(0.9, 0.5, 0.5).view(3, 1)
    step = alg.predict_step(_time_step([1, 1, 0]), prev)
    torch.testing.assert_close(step.output, t(0.5, 0.5, 0.5).view(3, 1), rtol=0, atol=1e-5)
    torch.testing.assert_close(step.state, step.output)  # the action taken is the new state
    # Without a state (a caller that keeps none) the previous action is the middle, 0.
    assert alg.get_initial_state(2).tolist() == [[0.0], [0.0]]


def test_rollout_samples_the_switch_with_its_probability_and_records_it():
    alg = _taac()
    prev = torch.zeros(4000, 1)  # q_repeat = -0.25, q_new = 0: beta_1 = 1 / (1 + e^-0.25) at alpha 1
    torch.manual_seed(0)
    step = alg.rollout_step(_time_step([1] * 4000), prev)
    switch = step.info["switch"]
    assert switch.mean().item() == pytest.approx(1 / (1 + math.exp(-0.25)), abs=0.025)
    torch.testing.assert_close(step.info["prev_action"], prev)
    expected = torch.where(switch[:, None] > 0.5, torch.full_like(prev, 0.5), prev)
    torch.testing.assert_close(step.output, expected, rtol=0, atol=1e-5)
    assert alg.env_steps == 4000


def test_random_steps_switch_half_the_time_to_uniform_actions():
    alg = _taac(initial_random_steps=10_000)
    torch.manual_seed(0)
    step = alg.rollout_step(_time_step([1] * 4000), torch.full((4000, 1), 0.25))
    switched = step.info["switch"] > 0.5
    assert switched.float().mean().item() == pytest.approx(0.5, abs=0.03)
    assert (step.output[~switched] == 0.25).all()
    assert step.output[switched].min() < -0.9 and step.output[switched].max() > 0.9


def test_train_targets_are_the_two_stage_value_through_the_window_by_hand():
    # Every row starts from the previous action 0 and the actor proposes 0.5: target
    # Q'(s, 0) = -0.25, Q'(s, 0.5) = 0, beta_1 = 1 / (1 + e^-0.25) at alpha 1, so
    # V = -0.25 * beta_0 for every row. With the rollout switching at every step the
    # targets are one-step: G_t = r_{t+1} + 0.5 * d_{t+1} * V.
    alg = _taac(gamma=0.5, mini_batch_length=3)
    v = -0.25 * (1 - 1 / (1 + math.exp(-0.25)))
    exp = Experience(step_type=torch.tensor([[1, 1, 1]]), reward=row(0, 1, 2),
                     discount=row(1, 1, 0), observation=torch.zeros(1, 3, 3),
                     action=torch.full((1, 3, 1), 0.5),
                     rollout_info={"prev_action": torch.zeros(1, 3, 1),
                                   "switch": row(1, 1, 1)})
    info = alg.train_step(exp).info
    torch.testing.assert_close(info["returns"], row(1 + 0.5 * v, 2.0), rtol=0, atol=1e-5)
    # The executed action 0.5 has Q = 0 in both replicas: critic loss = 2 * mean_t G_t^2.
    loss = alg.calc_loss(info)
    expected = 2 * ((1 + 0.5 * v) ** 2 + 4.0) / 2
    torch.testing.assert_close(loss.extra["loss/critic"], t(expected), rtol=1e-5, atol=1e-5)


def test_discrete_actions_and_images_are_refused():
    with pytest.raises(ValueError, match="Box action space"):
        algorithms.make(TaacConfig(), OBS, gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match="flat observations"):
        algorithms.make(TaacConfig(), gym.spaces.Box(0, 255, (4, 10, 10), np.uint8), BOX)


def test_the_acting_temperature_follows_the_trained_one():
    alg = algorithms.make(TaacConfig(actor_fc_layer_params=[8], critic_fc_layer_params=[8],
                                     initial_log_alpha=0.3), OBS, BOX)
    assert "switch_temperature.log_alpha" in alg.policy_state_dict()
    with torch.no_grad():
        alg.log_alpha.copy_(t(-1.0, 2.0))
    alg.after_update()
    assert alg.switch_temperature.log_alpha.item() == -1.0
    assert StepType.FIRST == 0
