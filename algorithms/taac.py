"""Temporally Abstract Actor-Critic (Yu et al. 2021, "TAAC: Temporally Abstract Actor-Critic
for Continuous Control"; ALF's ``TaacAlgorithm``, action repetition).

A SAC-like actor proposes a new action each step, and a second stage decides whether to take
it or to repeat the previous action. Repeating lets the policy commit to an action for as
long as it pays (smoother, more persistent exploration), and steps where the behaviour and the
current policy both repeat can be backed up through, as a multi-step return without
importance weights. With ``a^-`` the previous action (zero, the middle of the bounds, at an
episode's first step)::

    a~ ~ pi(.|s, a^-)                                   (tanh Gaussian on [s, a^-])
    q_0 = min_r Q_r(s, a^-),   q_1 = min_r Q_r(s, a~)
    beta(b|s, a^-, a~) = softmax([q_0, q_1] / alpha_b)  (b = 1: switch to a~; closed form)
    a = a~ if b else a^-                                (greedy: b = q_1 > q_0, a~ its mode)

Training on batch-major ``[B, T]`` windows (``T = mini_batch_length``; each row ``t`` keeps
the action it started from, ``rollout_info["prev_action"]``, and whether it switched,
``rollout_info["switch"]``). For every row, ``a~_t`` and ``beta_t`` are drawn again from the
current policy; rows ``0..T-2`` are trained::

    V_t   = beta_0 Q'(s_t, a^-_t) + beta_1 Q'(s_t, a~_t)         (target critics' minimum)
    G_t   = r_{t+1} + gamma d_{t+1} X_{t+1},    X_{T-1} = V_{T-1},
    X_n   = V_n if switched_n or step n is LAST, else G_n      (compare-through: switched_n =
            the rollout's b_n or a fresh b_n ~ beta_n; while neither switched, the behaviour's
            repeated action is the one the current policy takes)
    critic = sum_r (Q_r(s_t, a_t) - G_t)^2          (a_t: the action executed; LAST rows masked)
    actor  = alpha_a log pi(a~_t|s_t, a^-_t) - beta_1 q_1(s_t, a~_t)  (critic parameters fixed;
             ALF's gradient: SAC's scaled by the probability of switching)
    alpha  = log alpha_b (H(beta) - target_b) + log alpha_a (H(pi) - target_a)

As ALF's, the target has no entropy term. The carried state is the previous action per
environment (``get_initial_state``); ``rollout_step``/``predict_step`` return the action they
took as the new state. Acting needs the critics, so they travel with the policy parameters.
The first ``initial_random_steps`` draw ``a~`` uniformly and switch with probability 1/2.
Not implemented: ALF's ``max_repeat_steps``, ``b1_advantage_clipping``, randomized first
actions, and the linear/quadratic trajectories (TaacL, TaacQ).
"""

from __future__ import annotations

import copy
import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from algorithms.base import RLAlgorithm
from algorithms.config_alf import TaacConfig
from algorithms.data import AlgStep, Experience, LossInfo, StepType, TimeStep
from algorithms.networks import ActorDistributionNetwork, ParallelCriticNetwork
from algorithms.sac import _sample_and_log_prob


# ----- the pure parts (checked by hand in tests/test_alg_taac.py) ------------------------------
def switch_probabilities(q_repeat: torch.Tensor, q_new: torch.Tensor,
                         alpha: torch.Tensor) -> torch.Tensor:
    """``beta [..., 2]`` = softmax of ``[q_repeat, q_new] / alpha``: the probabilities of
    repeating (0) and of switching to the new action (1)."""
    return torch.softmax(torch.stack([q_repeat, q_new], -1) / alpha.clamp(min=1e-10), -1)


def compare_through_returns(reward: torch.Tensor, discount: torch.Tensor,
                            step_type: torch.Tensor, switched: torch.Tensor,
                            value: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G [B, T-1]`` of batch-major ``[B, T]`` windows (see the module doc): each row's
    return runs on through the steps where neither the behaviour nor the current policy
    switched and bootstraps with ``value`` at the first that did, at a LAST step (with its
    discount) or at the window's end."""
    T = reward.shape[1]
    stop = switched.bool() | (step_type == StepType.LAST)
    x = value[:, T - 1]
    out = []
    for t in range(T - 2, -1, -1):
        g = reward[:, t + 1] + gamma * discount[:, t + 1] * x
        out.append(g)
        x = torch.where(stop[:, t], value[:, t], g)
    return torch.stack(out[::-1], 1)


def default_action_entropy(action_space: gym.spaces.Box, min_prob: float) -> float:
    """ALF's default for continuous actions: ``sum_i log(min_prob * (high_i - low_i))``, the
    entropy of a uniform density on ``min_prob`` of each dimension's range."""
    return float(np.sum(np.log(min_prob * (action_space.high - action_space.low))))


def default_switch_entropy(min_prob: float) -> float:
    """ALF's default for a two-way choice: the entropy of ``(min_prob, 1 - min_prob)``."""
    return -min_prob * math.log(min_prob) - (1 - min_prob) * math.log(max(1 - min_prob, 1e-30))


class TaacAlgorithm(RLAlgorithm):
    """TAAC (action repetition) for a bounded one-dimensional ``Box`` action space and flat
    observations; hyperparameters: see :class:`TaacConfig`."""

    _policy_modules = ("actor_network", "critic_networks", "switch_temperature")

    def __init__(self, observation_space, action_space, config: TaacConfig, device="cpu"):
        super().__init__(observation_space, action_space, config, device)
        if self.discrete or len(action_space.shape) != 1:
            raise ValueError(f"taac takes a one-dimensional Box action space, as ALF's "
                             f"TaacAlgorithm, got {action_space}")
        if len(self.input_space.shape) != 1:
            raise ValueError(f"taac takes flat observations (its actor reads them beside the "
                             f"previous action), got shape {self.input_space.shape}")
        c = config
        n_action = action_space.shape[0]
        actor_input = gym.spaces.Box(-np.inf, np.inf, (self.input_space.shape[0] + n_action,),
                                     np.float32)
        self.actor_network = ActorDistributionNetwork(
            actor_input, action_space, c.actor_fc_layer_params,
            continuous_projection="tanh_normal")
        self.critic_networks = ParallelCriticNetwork(
            self.input_space, action_space, c.critic_fc_layer_params, c.num_critic_replicas,
            **self.net_kwargs)
        self.target_critic_networks = copy.deepcopy(self.critic_networks).requires_grad_(False)
        # [alpha of the switch, alpha of the action] (ALF's two temperatures).
        self.log_alpha = nn.Parameter(torch.full((2,), float(c.initial_log_alpha)))
        # Acting samples the switch with alpha_b: a copy that travels with the policy.
        self.switch_temperature = _Temperature(float(c.initial_log_alpha))
        action_target = (default_action_entropy(action_space, c.action_min_prob)
                         if c.target_entropy is None else c.target_entropy)
        self.register_buffer("target_entropy", torch.tensor(
            [default_switch_entropy(c.switch_min_prob), action_target]))
        self.mini_batch_length = c.mini_batch_length
        self.to(self.device)
        self._add_optimizer("actor", self.actor_network.parameters(), c.actor_learning_rate)
        self._add_optimizer("critic", self.critic_networks.parameters(), c.critic_learning_rate)
        self._add_optimizer("alpha", [self.log_alpha], c.alpha_learning_rate)

    @classmethod
    def rollout_info_spec(cls, config, observation_space, action_space) -> dict:
        """What training needs of each step (:mod:`algorithms.schema`): the action it started
        from and whether it switched to a new one (1.0) or repeated it (0.0)."""
        from algorithms.schema import FieldSpec

        return {"prev_action": FieldSpec(tuple(action_space.shape), "float32"),
                "switch": FieldSpec((), "float32")}

    # ----- acting -----------------------------------------------------------------------------
    def get_initial_state(self, batch_size: int) -> torch.Tensor:
        """The previous action of ``batch_size`` environments before their first step: the
        middle of the bounds."""
        return self.actor_network.scaler.bias.expand(batch_size, -1).clone()

    def _previous_action(self, time_step: TimeStep, state, b: int) -> torch.Tensor:
        if not isinstance(state, torch.Tensor):  # a caller that keeps no state
            state = self.get_initial_state(b)
        first = torch.as_tensor(time_step.step_type, device=self.device) == StepType.FIRST
        return torch.where(first[:, None], self.get_initial_state(b), state.to(self.device))

    def _actor_input(self, obs: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        return torch.cat([obs.flatten(1).float(), prev], -1)

    def _q_pair(self, critics, obs, prev, new, detach_params=False) -> torch.Tensor:
        """``[2, N]``: the critics' minimum at the previous and at the new action (one pass)."""
        q = critics(torch.cat([obs, obs]), torch.cat([prev, new]), detach_params=detach_params)
        return q.min(1).values.view(2, -1)

    @torch.no_grad()
    def _act(self, time_step: TimeStep, state, greedy: bool) -> AlgStep:
        obs = self._policy_input(time_step)
        b = obs.shape[0]
        prev = self._previous_action(time_step, state, b)
        if not greedy and self.env_steps < self.initial_random_steps:
            low, high = self.actor_network.scaler.bias - self.actor_network.scaler.scale, \
                self.actor_network.scaler.bias + self.actor_network.scaler.scale
            new = low + (high - low) * torch.rand_like(prev)
            switch = torch.rand(b, device=self.device) < 0.5
        else:
            dist = self.actor_network(self._actor_input(obs, prev))
            new = dist.mode if greedy else dist.sample()
            q_repeat, q_new = self._q_pair(self.critic_networks, obs, prev, new)
            if greedy:
                switch = q_new > q_repeat
            else:
                beta = switch_probabilities(q_repeat, q_new,
                                            self.switch_temperature.log_alpha.exp())
                switch = torch.rand(b, device=self.device) < beta[:, 1]
        action = torch.where(switch[:, None], new, prev)
        info = {} if greedy else {"prev_action": prev, "switch": switch.float()}
        return AlgStep(output=action, state=action, info=info)

    def predict_step(self, time_step: TimeStep, state=()) -> AlgStep:
        return self._act(time_step, state, greedy=True)

    def rollout_step(self, time_step: TimeStep, state=()) -> AlgStep:
        step = self._act(time_step, state, greedy=False)
        self._count_env_steps(step.output.shape[0])
        return step

    @property
    def initial_random_steps(self) -> int:
        return self.config.initial_random_steps

    # ----- training ---------------------------------------------------------------------------
    def train_step(self, experience: Experience, state=()) -> AlgStep:
        """``experience``: batch-major ``[B, T]`` with ``rollout_info`` ``prev_action`` and
        ``switch``. Rows ``0..T-2`` are trained on; every row gives its target value."""
        exp = experience
        B, T = exp.step_type.shape[:2]
        obs = exp.observation.flatten(0, 1)
        prev = exp.rollout_info["prev_action"].flatten(0, 1).float()
        alpha_switch, alpha_action = self.log_alpha.detach().exp()
        dist = self.actor_network(self._actor_input(obs, prev))
        new, log_pi = _sample_and_log_prob(dist)
        # The actor's gradient reaches the critics' input only (their weights held fixed).
        q_repeat, q_new = self._q_pair(self.critic_networks, obs, prev, new, detach_params=True)
        with torch.no_grad():
            beta = switch_probabilities(q_repeat, q_new, alpha_switch)               # [BT, 2]
            switched = torch.rand(B * T, device=self.device) < beta[:, 1]
            tq = self._q_pair(self.target_critic_networks, obs, prev, new.detach())
            value = (beta * tq.t()).sum(-1).view(B, T)
            switched = switched.view(B, T) | (exp.rollout_info["switch"] > 0.5)
            returns = compare_through_returns(exp.reward, exp.discount, exp.step_type,
                                              switched, value, self.config.gamma)
        q = self.critic_networks(exp.observation[:, :-1].flatten(0, 1),
                                 exp.action[:, :-1].flatten(0, 1).float())          # [N, R]
        rows = lambda x: x.view(B, T, *x.shape[1:])[:, :-1]  # noqa: E731  trained rows
        actor_loss = rows(alpha_action * log_pi - beta[:, 1] * q_new)
        switch_entropy = rows(-(beta * beta.clamp(min=1e-30).log()).sum(-1))
        return AlgStep(info={
            "exp": exp, "q": q.view(B, T - 1, -1), "returns": returns,
            "actor_loss": actor_loss, "action_entropy": rows(-log_pi.detach()),
            "switch_entropy": switch_entropy, "switch_prob": rows(beta[:, 1])})

    def calc_loss(self, info) -> LossInfo:
        exp, q, returns = info["exp"], info["q"], info["returns"]
        valid = (exp.step_type[:, :-1] != StepType.LAST).float()                  # [B, T-1]
        td_error = (returns.unsqueeze(-1) - q) * valid.unsqueeze(-1)              # [B, T-1, R]
        critic_loss = td_error.square().sum(-1).mean(1)                           # [B]
        actor_loss = info["actor_loss"].mean(1)
        entropy = torch.stack([info["switch_entropy"].mean(), info["action_entropy"].mean()])
        a_loss = (self.log_alpha * (entropy.detach() - self.target_entropy)).sum()
        alpha = self.log_alpha.detach().exp()
        return LossInfo(
            loss=critic_loss + actor_loss, scalar_loss=a_loss,
            priority=td_error[:, 0].detach().abs().mean(-1),
            extra={"loss/critic": critic_loss.detach(), "loss/actor": actor_loss.detach(),
                   "loss/alpha": a_loss.detach(), "alpha": alpha[1], "alpha/switch": alpha[0],
                   "entropy": entropy[1].detach(), "entropy/switch": entropy[0].detach(),
                   "switch_prob": info["switch_prob"].detach(), "q/mean": q.detach()})

    def after_update(self, info=None) -> None:
        c = self.config
        with torch.no_grad():
            if c.max_log_alpha is not None:
                self.log_alpha.clamp_(max=c.max_log_alpha)
            self.switch_temperature.log_alpha.copy_(self.log_alpha[0])
        if self.num_updates % c.target_update_period == 0:
            self._soft_update(self.target_critic_networks, self.critic_networks,
                              c.target_update_tau)


class _Temperature(nn.Module):
    """A temperature the acting processes read: ``log_alpha``, a buffer."""

    def __init__(self, log_alpha: float):
        super().__init__()
        self.register_buffer("log_alpha", torch.tensor(log_alpha))
