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
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch import nn

from algorithms.base import RLAlgorithm
from algorithms.config_core import SacConfig
from algorithms.data import AlgStep, Experience, LossInfo, TimeStep, TrainResult
from algorithms.losses import (
    TDLoss,
    alpha_loss,
    critic_td_loss,
    importance_weighted_mean,
    one_step_window,
)
from algorithms.networks import (
    ActorDistributionNetwork,
    ParallelCriticNetwork,
    ParallelQNetwork,
)


class SacAlgorithm(RLAlgorithm):
    """SAC / discrete SAC; hyperparameters: see :class:`SacConfig` (``parallel_update``: see
    :meth:`_update`)."""

    _policy_modules = ("actor_network",)

    def __init__(self, observation_space, action_space, config: SacConfig, device="cpu"):
        super().__init__(observation_space, action_space, config, device)
        c = config
        self.actor_network = ActorDistributionNetwork(
            self.input_space, action_space, c.actor_fc_layer_params,
            continuous_projection="tanh_normal", **self.net_kwargs)
        if self.discrete:
            self.critic_networks = ParallelQNetwork(
                self.input_space, action_space, c.critic_fc_layer_params,
                c.num_critic_replicas, **self.net_kwargs)
            default_target = c.target_entropy_scale * math.log(action_space.n)
        else:
            self.critic_networks = ParallelCriticNetwork(
                self.input_space, action_space, c.critic_fc_layer_params,
                c.num_critic_replicas, **self.net_kwargs)
            default_target = -float(np.prod(action_space.shape))
        self.target_critic_networks = copy.deepcopy(self.critic_networks).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(float(c.initial_log_alpha)))
        self.target_entropy = default_target if c.target_entropy is None else c.target_entropy
        self.max_log_alpha = c.max_log_alpha
        self.use_entropy_reward = c.use_entropy_reward
        self.mini_batch_length = c.mini_batch_length + self.history_length
        self.td_loss = TDLoss(gamma=c.gamma, td_error_loss_fn=c.td_error_loss_fn,
                              td_lambda=c.td_lambda if c.mini_batch_length > 2 else 0.0)
        self.target_update_tau = c.target_update_tau
        self.target_update_period = c.target_update_period
        self.initial_random_steps = c.initial_random_steps
        self.parallel_update = c.parallel_update
        self.to(self.device)
        self._add_optimizer("actor", self.actor_network.parameters(), c.actor_learning_rate)
        self._add_optimizer("critic", self.critic_networks.parameters(), c.critic_learning_rate)
        self._add_optimizer("alpha", [self.log_alpha], c.alpha_learning_rate)

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
        if self.discrete:
            with torch.no_grad():
                next_dist = self.actor_network(obs_next)
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
                target_value = self._soft_target(obs_next, alpha)
            actor_loss, entropy = self._actor_objective(dist, obs_cur, alpha)
        R = q.shape[1]
        return AlgStep(info={
            "exp": exp, "one_step": one_step, "q": q.view(B, T - 1, R),
            "next_value": target_value.view(B, T - 1),
            "actor_loss": actor_loss.view(B, T - 1), "entropy": entropy.view(B, T - 1)})

    def _soft_target(self, obs_next, alpha, eps=None) -> torch.Tensor:
        """``V(s')`` of continuous actions (call without gradient); ``eps``: the policy's
        noise, if drawn beforehand."""
        a_next, log_pi_next = _sample_and_log_prob(self.actor_network(obs_next), eps)
        q_targ = self.target_critic_networks(obs_next, a_next).min(1).values
        return q_targ - alpha * log_pi_next if self.use_entropy_reward else q_targ

    def _actor_objective(self, dist, obs_cur, alpha, eps=None):
        """Per-sample actor loss and entropy of continuous actions."""
        a_pi, log_pi = _sample_and_log_prob(dist, eps)
        # Critic weights are detached here so the actor loss only trains the actor.
        q_pi = self.critic_networks(obs_cur, a_pi, detach_params=True).min(1).values
        return alpha * log_pi - q_pi, -log_pi

    def _update(self, exp: Experience, w: torch.Tensor | None) -> TrainResult:
        """With ``parallel_update`` (continuous actions), the update's two independent halves
        run at once: the actor's (its loss, the temperature's, their backward pass) on a
        second thread, the critics' (the soft target, their loss and backward pass) on this
        one; then one optimizer step for all. Their gradients never meet (the actor loss
        holds the critic weights fixed, the target has no gradient), so the update is the
        one of :meth:`RLAlgorithm._update`, bit for bit: the policy noise of both halves is
        drawn beforehand, in the order that path draws it. Why: on a CPU an update of
        256-unit networks keeps one core busy, and torch releases the GIL inside each
        operation, so the halves overlap on two cores. Only with one torch thread: with
        more, each half would spread over the same cores as the other (measured slower than
        the sequential update at two threads)."""
        if not self.parallel_update or self.discrete or torch.get_num_threads() > 1:
            return super()._update(exp, w)
        one_step = one_step_window(self.td_loss, exp)
        B, T = exp.step_type.shape[:2]
        obs_cur = exp.observation[:, :-1].flatten(0, 1)
        obs_next = exp.observation[:, 1:].flatten(0, 1)
        alpha = self.log_alpha.detach().exp()
        noise_shape = (obs_cur.shape[0], *self.action_space.shape)
        eps_next = torch.randn(noise_shape, device=self.device)
        eps_pi = torch.randn(noise_shape, device=self.device)
        self._zero_gradients()
        # The device this thread computes on, as an index: set_device refuses a bare "cuda".
        cuda_index = None if self.device.type != "cuda" else \
            self.device.index if self.device.index is not None else torch.cuda.current_device()

        def actor_half():
            if cuda_index is not None:  # this thread's CUDA context (else cuBLAS warns)
                torch.cuda.set_device(cuda_index)
            dist = self.actor_network(obs_cur)
            actor_loss, entropy = self._actor_objective(dist, obs_cur, alpha, eps_pi)
            actor_loss = actor_loss.view(B, T - 1).mean(1)
            a_loss = alpha_loss(self.log_alpha, entropy.mean(), self.target_entropy)
            loss = importance_weighted_mean(actor_loss, w) + a_loss
            loss.backward()
            return loss.detach(), actor_loss.detach(), entropy.detach(), a_loss.detach()

        with self.training_precision():
            actor = _second_thread().submit(actor_half)
            try:
                q = self.critic_networks(obs_cur, exp.action[:, :-1].flatten(0, 1))
                with torch.no_grad():
                    target_value = self._soft_target(obs_next, alpha, eps_next)
                critic_loss, td_error = critic_td_loss(
                    self.td_loss, exp, q.view(B, T - 1, q.shape[1]),
                    target_value.view(B, T - 1), one_step)
                critic_total = importance_weighted_mean(critic_loss, w)
                critic_total.backward()
            finally:
                # Never leave with the other half running (it would write gradients into
                # the next update); its error, if any, is raised here.
                actor_total, actor_loss, entropy, a_loss = actor.result()
        extra = self._loss_metrics(critic_loss, actor_loss, a_loss, entropy.view(B, T - 1),
                                   q.view(B, T - 1, -1))
        self._step_optimizers()
        self.after_update()
        return self._train_result(critic_total.detach() + actor_total, extra,
                                  td_error.abs().mean(-1))

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
            extra=self._loss_metrics(critic_loss, actor_loss, a_loss, entropy, q))

    def _loss_metrics(self, critic_loss, actor_loss, a_loss, entropy, q) -> dict:
        """An update's metrics (tensors, read back only when asked for)."""
        return {"loss/critic": critic_loss.detach(), "loss/actor": actor_loss.detach(),
                "loss/alpha": a_loss.detach(), "alpha": self.log_alpha.detach().exp(),
                "entropy": entropy.detach(), "q/mean": q.detach()}

    def after_update(self, info=None) -> None:
        if self.max_log_alpha is not None:
            with torch.no_grad():
                self.log_alpha.clamp_(max=self.max_log_alpha)
        if self.num_updates % self.target_update_period == 0:
            self._soft_update(self.target_critic_networks, self.critic_networks,
                              self.target_update_tau)


def _sample_and_log_prob(dist, eps=None) -> tuple[torch.Tensor, torch.Tensor]:
    """A reparameterized action and its log-probability (one pass where the distribution has
    one: :meth:`SquashedNormal.rsample_and_log_prob`, which also takes noise drawn
    beforehand)."""
    fast = getattr(dist, "rsample_and_log_prob", None)
    if fast is not None:
        return fast(eps)
    if eps is not None:
        raise ValueError(f"{type(dist).__name__} cannot take noise drawn beforehand")
    action = dist.rsample()
    return action, dist.log_prob(action)


_SECOND_THREAD: ThreadPoolExecutor | None = None


def _second_thread() -> ThreadPoolExecutor:
    """The thread a parallel update runs its actor half on: one per process, made at the
    first such update (never before a fork: a forked child makes its own)."""
    global _SECOND_THREAD
    if _SECOND_THREAD is None:
        threads = torch.get_num_threads()
        _SECOND_THREAD = ThreadPoolExecutor(
            1, thread_name_prefix="sac-actor-half",
            initializer=lambda: torch.set_num_threads(threads))  # this thread's own setting
    return _SECOND_THREAD


def _forget_second_thread() -> None:
    global _SECOND_THREAD
    _SECOND_THREAD = None


os.register_at_fork(after_in_child=_forget_second_thread)
