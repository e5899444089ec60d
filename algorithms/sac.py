"""Soft Actor-Critic for continuous (Haarnoja et al. 2018) and discrete (Christodoulou 2019)
actions, with twin critics (``num_critic_replicas``) and automatic entropy tuning.

Training batches are batch-major ``[B, T]`` windows (``T = mini_batch_length``, default 2).
With the entropy reward (ALF's ``use_entropy_reward``) the soft value is::

    V(s')     = min_i Q_target_i(s', a') - alpha * log pi(a'|s'),   a' ~ pi(.|s')
    td_target = r + gamma * d * V(s')                  (TDLoss, λ-return for T > 2)
    actor     = alpha * log pi(a~|s) - min_i Q_i(s, a~)   (critic parameters held fixed)
    alpha     = log_alpha * (H(pi) - target_entropy)
For discrete actions the expectations over ``a'`` and ``a~`` are computed exactly.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
from torch import nn

from algorithms.base import RLAlgorithm
from algorithms.data import AlgStep, Experience, LossInfo, TimeStep
from algorithms.losses import TDLoss, alpha_loss, critic_td_loss, one_step_window
from algorithms.networks import (
    ActorDistributionNetwork,
    ParallelCriticNetwork,
    ParallelQNetwork,
)


class SacAlgorithm(RLAlgorithm):
    """SAC / discrete SAC.

    actor_fc_layer_params: hidden sizes of the actor.
    critic_fc_layer_params: hidden sizes of each critic.
    actor_learning_rate: Adam learning rate of the actor.
    critic_learning_rate: Adam learning rate of the critics.
    alpha_learning_rate: Adam learning rate of ``log_alpha``.
    gamma: discount factor.
    mini_batch_length: replay window length T (2 = one-step targets).
    td_lambda: λ of the critic target when ``mini_batch_length > 2``.
    td_error_loss_fn: ``"squared"`` or ``"huber"``.
    num_critic_replicas: number of critics; the target takes their minimum.
    target_entropy: entropy target; None = ``-action_dim`` (continuous) or
        ``target_entropy_scale * log(n)`` (discrete).
    target_entropy_scale: see ``target_entropy`` (discrete only).
    initial_log_alpha: initial ``log_alpha``.
    max_log_alpha: cap of ``log_alpha`` (None = no cap).
    use_entropy_reward: include ``-alpha log pi`` in the target value.
    target_update_tau: soft-update factor of the target critics.
    target_update_period: soft-update every this many gradient steps.
    initial_random_steps: rollout env steps with uniformly random actions.
    max_grad_norm: gradient clipping norm (None = off).
    """

    on_policy = False
    _policy_modules = ("actor_network",)

    def __init__(self, observation_space, action_space, *, actor_fc_layer_params=(256, 256),
                 critic_fc_layer_params=(256, 256), actor_learning_rate: float = 3e-4,
                 critic_learning_rate: float = 3e-4, alpha_learning_rate: float = 3e-4,
                 gamma: float = 0.99, mini_batch_length: int = 2, td_lambda: float = 0.95,
                 td_error_loss_fn: str = "squared", num_critic_replicas: int = 2,
                 target_entropy: float | None = None, target_entropy_scale: float = 0.5,
                 initial_log_alpha: float = 0.0, max_log_alpha: float | None = None,
                 use_entropy_reward: bool = True, target_update_tau: float = 0.005,
                 target_update_period: int = 1, initial_random_steps: int = 0,
                 max_grad_norm: float | None = None, device="cpu", encoder: str = "mlp",
                 image_layout: str = "auto",
                 data_transformers=(), precision: str = "float32"):
        super().__init__(observation_space, action_space, device, max_grad_norm,
                         encoder=encoder, image_layout=image_layout,
                         data_transformers=data_transformers, precision=precision)
        self.actor_network = ActorDistributionNetwork(
            self.input_space, action_space, actor_fc_layer_params,
            continuous_projection="tanh_normal", **self.net_kwargs)
        if self.discrete:
            self.critic_networks = ParallelQNetwork(
                self.input_space, action_space, critic_fc_layer_params, num_critic_replicas,
                **self.net_kwargs)
            default_target = target_entropy_scale * math.log(action_space.n)
        else:
            self.critic_networks = ParallelCriticNetwork(
                self.input_space, action_space, critic_fc_layer_params, num_critic_replicas,
                **self.net_kwargs)
            default_target = -float(np.prod(action_space.shape))
        self.target_critic_networks = copy.deepcopy(self.critic_networks).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(float(initial_log_alpha)))
        self.target_entropy = default_target if target_entropy is None else target_entropy
        self.max_log_alpha = max_log_alpha
        self.use_entropy_reward = use_entropy_reward
        self.mini_batch_length = mini_batch_length + self.history_length
        self.td_loss = TDLoss(gamma=gamma, td_error_loss_fn=td_error_loss_fn,
                              td_lambda=td_lambda if mini_batch_length > 2 else 0.0)
        self.target_update_tau = target_update_tau
        self.target_update_period = target_update_period
        self.initial_random_steps = initial_random_steps
        self.to(self.device)
        self._add_optimizer("actor", self.actor_network.parameters(), actor_learning_rate)
        self._add_optimizer("critic", self.critic_networks.parameters(), critic_learning_rate)
        self._add_optimizer("alpha", [self.log_alpha], alpha_learning_rate)

    # ----- acting -----------------------------------------------------------------------------
    @torch.no_grad()
    def predict_step(self, time_step: TimeStep, state=()) -> AlgStep:
        dist = self.actor_network(self._policy_input(time_step))
        action = dist.probs.argmax(-1) if self.discrete else dist.mode
        return AlgStep(output=action, state=state, info={})

    @torch.no_grad()
    def rollout_step(self, time_step: TimeStep, state=()) -> AlgStep:
        obs = self._policy_input(time_step)
        b = obs.shape[0]
        if self.env_steps < self.initial_random_steps:
            action = self._uniform_actions(b)
        else:
            action = self.actor_network(obs).sample()
        self._count_env_steps(b)
        return AlgStep(output=action, state=state, info={})

    def _uniform_actions(self, b: int) -> torch.Tensor:
        """Uniform random actions from torch's generator (seeded runs stay reproducible)."""
        if self.discrete:
            return torch.randint(0, int(self.action_space.n), (b,), device=self.device)
        low = torch.as_tensor(self.action_space.low, device=self.device)
        high = torch.as_tensor(self.action_space.high, device=self.device)
        return low + (high - low) * torch.rand(b, *low.shape, device=self.device)

    # ----- training ---------------------------------------------------------------------------
    def train_step(self, experience: Experience, state=()) -> AlgStep:
        """``experience``: batch-major ``[B, T]``. Rows ``0..T-2`` are trained on (critic, actor,
        alpha); rows ``1..T-1`` provide the soft target values."""
        return self._train_step(experience, one_step_window(self.td_loss, experience))

    def _train_step(self, exp: Experience, one_step: bool) -> AlgStep:
        """``one_step``: the short target path of :func:`~algorithms.losses.critic_td_loss`."""
        B, T = exp.step_type.shape[:2]
        obs_cur = exp.observation[:, :-1].flatten(0, 1)
        obs_next = exp.observation[:, 1:].flatten(0, 1)
        alpha = self.log_alpha.detach().exp()
        dist = self.actor_network(obs_cur)
        with torch.no_grad():
            next_dist = self.actor_network(obs_next)
        if self.discrete:
            log_probs = torch.log_softmax(dist.logits, -1)
            probs = log_probs.exp()
            q_all = self.critic_networks(obs_cur)                                    # [N, R, A]
            a = exp.action[:, :-1].flatten(0, 1)
            q = q_all.gather(-1, a[:, None, None].expand(-1, q_all.shape[1], 1)).squeeze(-1)
            with torch.no_grad():
                next_log_probs = torch.log_softmax(next_dist.logits, -1)
                q_targ = self.target_critic_networks(obs_next).min(1).values         # [N, A]
                soft = q_targ - alpha * next_log_probs if self.use_entropy_reward else q_targ
                target_value = (next_log_probs.exp() * soft).sum(-1)
            q_pi = q_all.detach().min(1).values
            actor_loss = (probs * (alpha * log_probs - q_pi)).sum(-1)
            entropy = -(probs * log_probs).sum(-1)
        else:
            q = self.critic_networks(obs_cur, exp.action[:, :-1].flatten(0, 1))      # [N, R]
            with torch.no_grad():
                a_next, log_pi_next = _sample_and_log_prob(next_dist)
                q_targ = self.target_critic_networks(obs_next, a_next).min(1).values
                target_value = q_targ - alpha * log_pi_next if self.use_entropy_reward else q_targ
            a_pi, log_pi = _sample_and_log_prob(dist)
            # Critic weights are detached here so the actor loss only trains the actor.
            q_pi = self.critic_networks(obs_cur, a_pi, detach_params=True).min(1).values
            actor_loss = alpha * log_pi - q_pi
            entropy = -log_pi
        R = q.shape[1]
        return AlgStep(info={
            "exp": exp, "one_step": one_step, "q": q.view(B, T - 1, R),
            "next_value": target_value.view(B, T - 1),
            "actor_loss": actor_loss.view(B, T - 1), "entropy": entropy.view(B, T - 1)})

    def calc_loss(self, info) -> LossInfo:
        q = info["q"]
        critic_loss, td_error = critic_td_loss(self.td_loss, info["exp"], q,
                                               info["next_value"], info["one_step"])
        actor_loss = info["actor_loss"].mean(1)                                   # [B]
        entropy = info["entropy"]
        a_loss = alpha_loss(self.log_alpha, entropy.mean(), self.target_entropy)
        return LossInfo(
            loss=critic_loss + actor_loss, scalar_loss=a_loss,
            priority=td_error.abs().mean(-1).detach(),
            extra={"loss/critic": critic_loss.detach(), "loss/actor": actor_loss.detach(),
                   "loss/alpha": a_loss.detach(), "alpha": self.log_alpha.detach().exp(),
                   "entropy": entropy.detach(), "q/mean": q.detach()})

    def after_update(self, info=None) -> None:
        if self.max_log_alpha is not None:
            with torch.no_grad():
                self.log_alpha.clamp_(max=self.max_log_alpha)
        if self.num_updates % self.target_update_period == 0:
            self._soft_update(self.target_critic_networks, self.critic_networks,
                              self.target_update_tau)


def _sample_and_log_prob(dist) -> tuple[torch.Tensor, torch.Tensor]:
    """A reparameterized action and its log-probability (one pass where the distribution has
    one: :meth:`SquashedNormal.rsample_and_log_prob`)."""
    fast = getattr(dist, "rsample_and_log_prob", None)
    if fast is not None:
        return fast()
    action = dist.rsample()
    return action, dist.log_prob(action)
