"""Losses against hand-computed numbers."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from algorithms import configs
from algorithms.configs import DqnConfig, SacConfig, Td3Config
from algorithms.data import Experience, StepType
from algorithms.dqn import DqnAlgorithm
from algorithms.losses import (
    ActorCriticLoss,
    PPOLoss,
    TDLoss,
    alpha_loss,
    element_wise_huber_loss,
    element_wise_squared_loss,
    importance_weighted_mean,
)

F, M, L = int(StepType.FIRST), int(StepType.MID), int(StepType.LAST)


def col(x, dtype=torch.float32):
    return torch.tensor(x, dtype=dtype).unsqueeze(1)


def test_element_wise_losses():
    x, y = torch.tensor([0.0, 0.5, -3.0]), torch.zeros(3)
    torch.testing.assert_close(element_wise_squared_loss(x, y), torch.tensor([0.0, 0.25, 9.0]))
    torch.testing.assert_close(element_wise_huber_loss(x, y), torch.tensor([0.0, 0.125, 2.5]))


def test_td_lambda_loss_truncation():
    # λ = 1 with truncation at row 2: G1 = 2 + .5*30 = 17, G0 = 1 + .5*17 = 9.5
    st = col([F, M, L, F], torch.int64)
    li = TDLoss(gamma=0.5, td_lambda=1.0)(st, col([0, 1, 2, 0]), col([1, 1, 1, 1]),
                                          value=col([9.5, 16, 0, 0]),
                                          target_value=col([10, 20, 30, 40]))
    torch.testing.assert_close(li.loss, col([0.0, 1.0, 0.0, 0.0]))


def test_actor_critic_loss():
    # returns (λ = 1): G1 = 2 + .5*4 = 4, G0 = 1 + .5*4 = 3; adv = [2, 2]
    # loss = -adv*logp + (G - V)^2 - 0.1*H = [2 + 4 - .05, 4 + 4 - .05]
    st = col([F, M, M], torch.int64)
    loss = ActorCriticLoss(gamma=0.5, entropy_regularization=0.1)(
        st, col([0, 1, 2]), col([1, 1, 1]), value=col([1, 2, 4]),
        log_prob=col([-1, -2, -3]), entropy=col([0.5, 0.5, 0.5]))
    torch.testing.assert_close(loss.loss, col([5.95, 7.95, 0.0]))
    # advantage clipping to [-1, 1]: pg = [1, 2]
    clipped = ActorCriticLoss(gamma=0.5, advantage_clip=1.0)(
        st, col([0, 1, 2]), col([1, 1, 1]), value=col([1, 2, 4]),
        log_prob=col([-1, -2, -3]), entropy=col([0.5, 0.5, 0.5]))
    torch.testing.assert_close(clipped.extra["pg_loss"], col([1.0, 2.0]))


def test_actor_critic_loss_episode_end_gae():
    # termination at row 1: δ0 = 1 + .5*0*2 - 1 = 0 (row 1 LAST masked) -> adv = [0, 0]
    st = col([F, L, F], torch.int64)
    li = ActorCriticLoss(gamma=0.5, use_gae=True, td_lambda=0.5)(
        st, col([0, 1, 0]), col([1, 0, 1]), value=col([1, 2, 4]),
        log_prob=col([-1, -2, -3]), entropy=col([0.5, 0.5, 0.5]))
    torch.testing.assert_close(li.extra["advantages"], col([0.0, 0.0]))
    torch.testing.assert_close(li.loss, col([0.0, 0.0, 0.0]))


def test_ppo_loss_clipping():
    lp = torch.tensor([0.0, math.log(2.0), math.log(2.0)])
    old = torch.zeros(3)
    adv = torch.tensor([1.0, 1.0, -1.0])
    ret, val, ent = torch.tensor([1.0, 2.0, 0.0]), torch.zeros(3), torch.full((3,), 0.3)
    li = PPOLoss(importance_ratio_clipping=0.2, normalize_advantages=False,
                 entropy_regularization=0.1, td_loss_weight=0.5)(lp, old, adv, ret, val, ent)
    # ratios [1, 2, 2]: pg = [-1, -min(2, 1.2), -min(-2, -1.2)] = [-1, -1.2, 2]
    torch.testing.assert_close(li.extra["pg_loss"], torch.tensor([-1.0, -1.2, 2.0]))
    torch.testing.assert_close(li.loss, torch.tensor([-1 + 0.5 - 0.03, -1.2 + 2 - 0.03, 2 - 0.03]))
    torch.testing.assert_close(li.extra["clip_fraction"], torch.tensor(2 / 3))
    # log-prob clipping to (-0.5, 0.5): ratio = e^0.5 for the last two samples
    li = PPOLoss(normalize_advantages=False, log_prob_clipping=0.5)(lp, old, adv, ret, val, ent)
    torch.testing.assert_close(li.extra["pg_loss"][2], torch.tensor(math.exp(0.5)))


def test_alpha_loss_gradient():
    log_alpha = torch.tensor(0.5, requires_grad=True)
    loss = alpha_loss(log_alpha, torch.tensor(1.0), target_entropy=-1.0)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(1.0)
    assert float(log_alpha.grad) == pytest.approx(2.0)  # entropy above target: shrink alpha


def test_importance_weighted_mean():
    loss = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert float(importance_weighted_mean(loss, None)) == pytest.approx(2.5)
    w = torch.tensor([1.0, 0.5, 0.0, 0.25])
    assert float(importance_weighted_mean(loss, w)) == pytest.approx((1 + 1 + 0 + 1) / 4)


# --- DQN n-step loss through the algorithm, with Q fixed to Q(s, .) = [1, 2] --------------------

def _constant_dqn():
    obs_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    alg = DqnAlgorithm(obs_space, gym.spaces.Discrete(2),
                       DqnConfig(fc_layer_params=[4], gamma=0.5, n_step=3,
                                 td_error_loss_fn="squared"))
    for net in (alg.q_network, alg.target_q_network):
        with torch.no_grad():
            for p in net.parameters():
                p.zero_()
            net.head.bias.copy_(torch.tensor([1.0, 2.0]))
    return alg


DQN_CASES = [
    # name, step types, rewards, discounts, per-sample loss, priority. Q(s, a=0) = 1, V = 2.
    # all MID: G2 = 3 + .5*2 = 4, G1 = 2 + .5*4 = 4, G0 = 1 + .5*4 = 3 -> errors [2, 3, 3]
    ("n_step_full", [M, M, M, M], [0, 1, 2, 3], [1, 1, 1, 1], (4 + 9 + 9) / 3, 2.0),
    # termination at row 2: G1 = 2, G0 = 1 + .5*2 = 2, row 2 masked -> errors [1, 1, 0]
    ("termination_in_window", [M, M, L, F], [0, 1, 2, 0], [1, 1, 0, 1], 2 / 3, 1.0),
    # truncation at row 2: G1 = 2 + .5*2 = 3, G0 = 1 + .5*3 = 2.5 -> errors [1.5, 2, 0]
    ("truncation_in_window", [M, M, L, F], [0, 1, 2, 0], [1, 1, 1, 1], (2.25 + 4) / 3, 1.5),
    # window starts on LAST: row 0 masked; G2 = 2 + 1 = 3, G1 = 1 + 1.5 = 2.5
    ("starts_on_last", [L, F, M, M], [5, 0, 1, 2], [0, 1, 1, 1], (2.25 + 4) / 3, 0.0),
]


@pytest.mark.parametrize("name,st,r,d,loss,prio", DQN_CASES, ids=[c[0] for c in DQN_CASES])
def test_dqn_n_step_loss(name, st, r, d, loss, prio):
    alg = _constant_dqn()
    exp = Experience(step_type=np.array([st]), reward=np.array([r], np.float32),
                     discount=np.array([d], np.float32),
                     observation=np.zeros((1, 4, 2), np.float32), prev_action=(), env_id=(),
                     action=np.zeros((1, 4), np.int64), rollout_info={})
    li = alg.calc_loss(alg.train_step(alg._experience(exp)).info)
    torch.testing.assert_close(li.loss, torch.tensor([loss]))
    torch.testing.assert_close(li.priority, torch.tensor([prio]))


# --- SAC (discrete) and TD3 targets with constant networks ------------------------------------

def _zero(module):
    with torch.no_grad():
        for p in module.parameters():
            p.zero_()


def _set_last_bias(parallel_net, per_replica):
    with torch.no_grad():
        parallel_net.mlp.biases[-1].copy_(torch.tensor(per_replica).view(len(per_replica), 1, -1))


def _window(st, r, d, action, obs_dim):
    return Experience(step_type=np.array([st]), reward=np.array([r], np.float32),
                      discount=np.array([d], np.float32),
                      observation=np.zeros((1, len(st), obs_dim), np.float32),
                      prev_action=(), env_id=(), action=np.array([action]), rollout_info={})


@pytest.mark.parametrize("discount,next_type", [(1.0, M), (0.0, L), (1.0, L)],
                         ids=["mid", "termination", "truncation"])
def test_discrete_sac_soft_target_and_losses(discount, next_type):
    from algorithms.sac import SacAlgorithm

    alg = SacAlgorithm(gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(2),
                       SacConfig(actor_fc_layer_params=[4], critic_fc_layer_params=[4],
                                 gamma=0.5, initial_log_alpha=0.0))
    for m in (alg.actor_network, alg.critic_networks, alg.target_critic_networks):
        _zero(m)
    with torch.no_grad():
        alg.actor_network.head.bias.copy_(torch.tensor([0.0, math.log(3.0)]))  # pi = [.25, .75]
    for net in (alg.critic_networks, alg.target_critic_networks):
        _set_last_bias(net, [[1.0, 2.0], [1.5, 3.0]])  # min over replicas: Q = [1, 2]
    p = [0.25, 0.75]
    v_next = sum(pi * (q - math.log(pi)) for pi, q in zip(p, [1.0, 2.0], strict=True))  # alpha=1
    target = 1.0 + 0.5 * discount * v_next
    critic = (target - 1.0) ** 2 + (target - 1.5) ** 2  # Q_i(s, a=0) = [1, 1.5]
    actor = sum(pi * (math.log(pi) - q) for pi, q in zip(p, [1.0, 2.0], strict=True))
    exp = alg._experience(_window([M, int(next_type)], [0.0, 1.0], [1.0, discount], [0, 0], 2))
    for one_step in (True, False):  # the one-step path and the general window path
        info = alg._train_step(exp, one_step).info
        li = alg.calc_loss(info)
        torch.testing.assert_close(_sac_next_value(info), torch.tensor(v_next))
        torch.testing.assert_close(li.extra["loss/critic"], torch.tensor([critic]))
        torch.testing.assert_close(li.extra["loss/actor"], torch.tensor([actor]))
        torch.testing.assert_close(li.loss, torch.tensor([critic + actor]))
        entropy = -sum(pi * math.log(pi) for pi in p)
        torch.testing.assert_close(li.scalar_loss,
                                   torch.tensor(0.0 * (entropy - alg.target_entropy)))


def _sac_next_value(info) -> torch.Tensor:
    """The soft value V(s') of the first sample."""
    return info["next_value"][0, 0]


@pytest.mark.parametrize("discount,next_type,critic", [
    (1.0, M, 1.25 ** 2 + 1.75 ** 2),   # target = 2 + .5 * min(1.0, 0.5) = 2.25
    (1.0, L, 1.25 ** 2 + 1.75 ** 2),   # truncation: still bootstraps from the final observation
    (0.0, L, 1.0 ** 2 + 1.5 ** 2),     # termination: target = 2
], ids=["mid", "truncation", "termination"])
def test_td3_clipped_double_q_target(discount, next_type, critic):
    import algorithms

    alg = algorithms.make(Td3Config(actor_fc_layer_params=[4], critic_fc_layer_params=[4],
                                    gamma=0.5),
                          gym.spaces.Box(-1, 1, (3,), np.float32),
                          gym.spaces.Box(-2, 2, (1,), np.float32))
    for m in (alg.actor_network, alg.critic_networks, alg.target_critic_networks,
              alg.target_actor_network):
        _zero(m)
    for net in (alg.critic_networks, alg.target_critic_networks):
        _set_last_bias(net, [[1.0], [0.5]])  # Q does not depend on the (noisy) action
    exp = _window([M, int(next_type)], [0.0, 2.0], [1.0, discount], [[0.0], [0.0]], 3)
    li = alg.calc_loss(alg.train_step(alg._experience(exp)).info)
    torch.testing.assert_close(li.extra["loss/critic"], torch.tensor([critic]))
    # train_steps = 0 is an actor step: actor loss = -Q_1(s, mu(s)) = -1
    torch.testing.assert_close(li.extra["loss/actor"], torch.tensor([-1.0]))


class _FixedDist:
    """A policy whose every sample is ``action`` with log-probability ``log_prob``: makes SAC's
    soft target a hand-computable number."""

    def __init__(self, n, action, log_prob):
        self.action = torch.full((n, 1), action)
        self._log_prob = torch.full((n,), log_prob)

    def sample(self):
        return self.action

    def rsample(self):
        return self.action.clone().requires_grad_(True)

    def log_prob(self, a):
        return self._log_prob + 0.0 * a.sum(-1)


class _FixedActor(torch.nn.Module):
    def __init__(self, action, log_prob):
        super().__init__()
        self.action, self.log_prob = action, log_prob

    def forward(self, obs):
        return _FixedDist(obs.shape[0], self.action, self.log_prob)


@pytest.mark.parametrize("discount,next_type", [(1.0, M), (0.0, L)], ids=["mid", "termination"])
def test_continuous_sac_soft_target_subtracts_the_entropy_term(discount, next_type):
    """V(s') = min_i Q_target_i(s', a') - alpha * log pi(a'|s'): with min Q = 2, alpha = 0.5 and
    log pi = -1.2, V = 2 + 0.6 = 2.6 (a flipped sign gives 1.4)."""
    from algorithms.sac import SacAlgorithm

    alg = SacAlgorithm(gym.spaces.Box(-1, 1, (2,), np.float32),
                       gym.spaces.Box(-1, 1, (1,), np.float32),
                       SacConfig(actor_fc_layer_params=[4], critic_fc_layer_params=[4],
                                 gamma=0.9, initial_log_alpha=math.log(0.5)))
    alg.actor_network = _FixedActor(0.3, -1.2)
    for net in (alg.critic_networks, alg.target_critic_networks):
        _zero(net)
        _set_last_bias(net, [[2.0], [3.5]])  # Q_1 = 2, Q_2 = 3.5 whatever (s, a)
    exp = alg._experience(_window([M, int(next_type)], [0.0, 1.0], [1.0, discount],
                                  [[0.3], [0.3]], 2))
    for one_step in (True, False):  # the one-step path and the general window path
        info = alg._train_step(exp, one_step).info
        torch.testing.assert_close(_sac_next_value(info), torch.tensor(2.6))
        li = alg.calc_loss(info)
        target = 1.0 + 0.9 * discount * 2.6
        torch.testing.assert_close(li.extra["loss/critic"],
                                   torch.tensor([(target - 2.0) ** 2 + (target - 3.5) ** 2]))
        # actor: alpha * log pi - min_i Q_i = 0.5 * -1.2 - 2
        torch.testing.assert_close(li.extra["loss/actor"], torch.tensor([-0.6 - 2.0]))


def test_sac_default_target_entropy():
    from algorithms.sac import SacAlgorithm

    obs = gym.spaces.Box(-1, 1, (2,), np.float32)
    cont = SacAlgorithm(obs, gym.spaces.Box(-1, 1, (3,), np.float32),
                        SacConfig(actor_fc_layer_params=[4], critic_fc_layer_params=[4]))
    assert cont.target_entropy == -3.0  # -|A|
    disc = SacAlgorithm(obs, gym.spaces.Discrete(4),
                        SacConfig(actor_fc_layer_params=[4], critic_fc_layer_params=[4],
                                  target_entropy_scale=0.5))
    assert disc.target_entropy == pytest.approx(0.5 * math.log(4))
    # Entropy -5 below the target -3: the alpha loss's gradient is H - target = -2, so a
    # gradient step raises alpha (more exploration).
    log_alpha = torch.zeros((), requires_grad=True)
    alpha_loss(log_alpha, torch.tensor(-5.0), cont.target_entropy).backward()
    assert log_alpha.grad.item() == pytest.approx(-2.0)


def test_soft_update_moves_the_target_by_tau():
    from algorithms.base import RLAlgorithm

    target, source = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    with torch.no_grad():
        target.weight.fill_(2.0), target.bias.fill_(-1.0)
        source.weight.fill_(12.0), source.bias.fill_(9.0)
    RLAlgorithm._soft_update(target, source, 0.1)  # (1 - tau) * target + tau * source
    assert target.weight.item() == pytest.approx(3.0) and target.bias.item() == pytest.approx(0.0, abs=1e-6)
    assert source.weight.item() == 12.0


def _one_step_batch(actions) -> Experience:
    """32 random windows of two steps with 4-dim observations, LAST (masked), terminal and
    truncated rows among them; ``actions(generator, B)`` draws the ``[B, 2, ...]`` actions."""
    g = torch.Generator().manual_seed(0)
    B = 32
    step_type = torch.randint(0, 3, (B, 2), generator=g)
    discount = (torch.rand(B, 2, generator=g) > 0.3).float()
    exp = Experience(step_type=step_type, reward=torch.randn(B, 2, generator=g),
                     discount=discount, observation=torch.randn(B, 2, 4, generator=g),
                     action=actions(g, B))
    assert (step_type[:, 0] == StepType.LAST).any() and (discount[:, 1] == 0).any()
    return exp


@pytest.mark.parametrize("double_q", [True, False])
@pytest.mark.parametrize("loss_fn", ["huber", "squared"])
def test_dqn_one_step_path_equals_the_window_path(double_q, loss_fn):
    """One-step batches take DQN's short path: the same loss, priorities and gradients as the
    general TDLoss path, with LAST (masked), terminal and truncated rows in the batch."""
    obs_space = gym.spaces.Box(-1, 1, (4,), np.float32)
    alg = DqnAlgorithm(obs_space, gym.spaces.Discrete(3),
                       DqnConfig(fc_layer_params=[16], gamma=0.9, double_q=double_q,
                                 td_error_loss_fn=loss_fn))
    with torch.no_grad():  # a target network that differs from the online one
        for p in alg.target_q_network.parameters():
            p.add_(0.1 * torch.randn_like(p))
    exp = _one_step_batch(lambda g, B: torch.randint(0, 3, (B, 2), generator=g))
    results = []
    for step in (alg.train_step, alg._window_train_step):
        alg.zero_grad()
        li = alg.calc_loss(step(exp).info)
        li.loss.mean().backward()
        results.append((li.loss.detach(), li.priority,
                        [p.grad.clone() for p in alg.q_network.parameters()]))
    assert "one_step" in alg.train_step(exp).info
    (loss, prio, grads), (loss_ref, prio_ref, grads_ref) = results
    torch.testing.assert_close(loss, loss_ref, rtol=0, atol=0)
    torch.testing.assert_close(prio, prio_ref, rtol=0, atol=0)
    for a, b in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("kind", ["sac", "sac_discrete", "td3"])
@pytest.mark.parametrize("loss_fn", ["huber", "squared"])
def test_critic_one_step_path_equals_the_window_path(kind, loss_fn):
    """One-step batches take the short path of ``critic_td_loss`` (SAC, DDPG, TD3): the same
    losses, priorities and gradients as the general TDLoss path, with LAST (masked), terminal
    and truncated rows in the batch."""
    import algorithms

    discrete = kind == "sac_discrete"
    obs_space = gym.spaces.Box(-1, 1, (4,), np.float32)
    act_space = gym.spaces.Discrete(3) if discrete else gym.spaces.Box(-1, 1, (2,), np.float32)
    config = configs.config_class("td3" if kind == "td3" else "sac")(
        actor_fc_layer_params=[16], critic_fc_layer_params=[16], gamma=0.9,
        td_error_loss_fn=loss_fn)
    alg = algorithms.make(config, obs_space, act_space)
    with torch.no_grad():  # target critics that differ from the online ones
        for p in alg.target_critic_networks.parameters():
            p.add_(0.1 * torch.randn_like(p))
    exp = _one_step_batch(lambda g, B: torch.randint(0, 3, (B, 2), generator=g) if discrete
                          else torch.rand(B, 2, 2, generator=g) * 2 - 1)
    results = []
    for one_step in (True, False):
        alg.zero_grad()
        torch.manual_seed(1)  # the same sampled actions and noise on both paths
        info = alg._train_step(exp, one_step).info
        assert info["one_step"] is one_step
        li = alg.calc_loss(info)
        total = li.loss.mean()
        if isinstance(li.scalar_loss, torch.Tensor):
            total = total + li.scalar_loss
        total.backward()
        results.append((li.loss.detach(), li.priority, li.extra["loss/critic"],
                        [p.grad.clone() for p in alg.parameters() if p.grad is not None]))
    assert alg.train_step(exp).info["one_step"] is True
    (loss, prio, critic, grads), (loss_ref, prio_ref, critic_ref, grads_ref) = results
    torch.testing.assert_close(loss, loss_ref, rtol=0, atol=0)
    torch.testing.assert_close(prio, prio_ref, rtol=0, atol=0)
    torch.testing.assert_close(critic, critic_ref, rtol=0, atol=0)
    assert len(grads) == len(grads_ref) > 0
    for a, b in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(a, b)
