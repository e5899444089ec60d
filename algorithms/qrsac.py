"""Quantile-regression SAC (ALF's ``QrsacAlgorithm``): SAC whose critics each give ``N``
quantiles of the return distribution ``Z(s, a)``, at the fractions ``tau_i = (2i + 1) / (2N)``,
trained with the quantile Huber loss of QR-DQN (Dabney et al. 2018, "Distributional
Reinforcement Learning with Quantile Regression"). Continuous actions only, as ALF's.

Training batches are batch-major ``[B, T]`` windows (``T = 2``; a longer window trains each of
its rows on the one-step target of the row after it)::

    Z'(s', a')  = min_r Z_target_r(s', a')   per quantile (ALF's default),   a' ~ pi(.|s')
                  (or, with min_critic_by_critic_mean, the replica of the lowest mean)
    target_j    = r + gamma * d * (Z'_j(s', a') - alpha * log pi(a'|s'))        (no gradient)
    critic      = sum_r sum_i mean_j rho_tau_i(target_j - Z_r,i(s, a))   (mean_i: ALF's default)
    rho_tau(u)  = |tau - 1{u < 0}| * huber_kappa(u) / kappa
    actor       = alpha * log pi(a~|s) - risk(min_r Z_r(s, a~))    (critic parameters held fixed)
    alpha       = log_alpha * (H(pi) - target_entropy)                              (SAC's)

The minimum per quantile is more pessimistic than SAC's clipped double Q (its mean is at or
below the lower replica's mean); ``min_critic_by_critic_mean`` takes the whole replica of the
lower mean instead, whose mean is exactly SAC's ``min_r Q_r``. Both are ALF's options.

``risk`` is the ``mean`` of the quantiles (risk-neutral: SAC's Q) or ``cvar``, the mean of the
lowest ``ceil(risk_level * N)`` of them (the expected return of the worst ``risk_level`` of
outcomes). Acting, the temperature's cap and the target updates are SAC's.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from algorithms.base import RLAlgorithm
from algorithms.config_core import QrsacConfig
from algorithms.data import AlgStep, Experience, LossInfo, StepType
from algorithms.encoders import make_encoder
from algorithms.losses import alpha_loss
from algorithms.networks import ActorDistributionNetwork, ParallelMLP, _encode
from algorithms.sac import SacAlgorithm, _sample_and_log_prob


# ----- the loss, pure (checked by hand in tests/test_alg_qrsac.py) ------------------------------
def quantile_fractions(n: int, device=None) -> torch.Tensor:
    """``tau_i = (2i + 1) / (2n)``, ``i = 0..n-1``: the midpoints of ``n`` equal slices of
    ``[0, 1]``, the fractions whose quantiles minimize the 1-Wasserstein distance."""
    return (torch.arange(n, dtype=torch.float32, device=device) + 0.5) / n


def quantile_huber_loss(quantiles: torch.Tensor, target: torch.Tensor, kappa: float,
                        sum_over_quantiles: bool) -> torch.Tensor:
    """``quantiles [..., N]`` (at :func:`quantile_fractions`) against ``target [..., M]``
    samples (constants) -> ``[...]``: with ``u_ij = target_j - quantiles_i``, the sum (or
    mean) over ``i`` of the mean over ``j`` of ``|tau_i - 1{u_ij < 0}| * L_kappa(u_ij) / kappa``,
    ``L_kappa(u) = u^2 / 2`` for ``|u| <= kappa`` else ``kappa * (|u| - kappa / 2)``."""
    # Broadcast views, not u itself: smooth_l1_loss is L_kappa(u) / kappa in one fused pass
    # each way (a third of the time of writing the Huber loss out, measured at N = 25 and 50).
    z, y = torch.broadcast_tensors(quantiles.unsqueeze(-1), target.unsqueeze(-2))  # [..., N, M]
    tau = quantile_fractions(quantiles.shape[-1], quantiles.device).unsqueeze(-1)
    weight = torch.where(y < z.detach(), 1.0 - tau, tau)                       # u < 0
    rho = (weight * F.smooth_l1_loss(z, y, reduction="none", beta=kappa)).mean(-1)
    return rho.sum(-1) if sum_over_quantiles else rho.mean(-1)


def quantile_td_target(reward: torch.Tensor, discount: torch.Tensor,
                       next_quantiles: torch.Tensor, gamma: float) -> torch.Tensor:
    """``r + gamma * d * Z'_j`` for each quantile ``j``: ``reward``/``discount`` ``[...]``,
    ``next_quantiles [..., N]`` (the soft value's quantiles at the next step)."""
    return reward.unsqueeze(-1) + (gamma * discount).unsqueeze(-1) * next_quantiles


def risk_value(quantiles: torch.Tensor, measure: str, level: float) -> torch.Tensor:
    """The actor's value of ``quantiles [..., N]`` -> ``[...]``: ``mean`` (risk-neutral) or
    ``cvar``, the mean of the lowest ``ceil(level * N)`` values (sorted, so crossed quantiles
    count by value)."""
    if measure == "mean":
        return quantiles.mean(-1)
    if measure != "cvar":
        raise ValueError(f"unknown risk measure {measure!r} (mean or cvar)")
    n = quantiles.shape[-1]
    k = max(1, math.ceil(round(level * n, 6)))  # round: 0.3 * 10 is 3.0000000000000004
    return quantiles.topk(k, -1, largest=False).values.mean(-1)


def replica_minimum(quantiles: torch.Tensor, by_mean: bool) -> torch.Tensor:
    """``quantiles [B, R, N]`` of ``R`` replicas -> ``[B, N]``: the minimum over replicas of
    each quantile, or (``by_mean``) the quantiles of the replica whose mean is lowest."""
    if not by_mean:
        return quantiles.min(1).values
    lowest = quantiles.mean(-1).argmin(1)                                          # [B]
    return quantiles[torch.arange(quantiles.shape[0], device=quantiles.device), lowest]


class ParallelQuantileCritics(nn.Module):
    """``num_replicas`` critics, each the ``num_quantiles`` quantiles of ``Z(s, a)``:
    ``forward(obs, action) -> [B, R, N]`` (a ``ParallelCriticNetwork`` with ``N`` outputs;
    the observation encoder is shared by the replicas)."""

    def __init__(self, observation_space, action_space, fc_layer_params, num_replicas: int,
                 num_quantiles: int, encoder: str, image_layout: str):
        super().__init__()
        self.obs_encoder = make_encoder(observation_space.shape, encoder, image_layout)
        n_in = self.obs_encoder.output_size + int(np.prod(action_space.shape))
        self.mlp = ParallelMLP(n_in, fc_layer_params, num_quantiles, num_replicas)

    def forward(self, obs, action, detach_params: bool = False) -> torch.Tensor:
        x = torch.cat([_encode(self.obs_encoder, obs, detach_params), action.flatten(1)], -1)
        return self.mlp(x, detach_params)


class QrsacAlgorithm(RLAlgorithm):
    """QR-SAC for a bounded ``Box`` action space; hyperparameters: see :class:`QrsacConfig`."""

    _policy_modules = ("actor_network",)

    # SAC's, on the same attributes: acting (uniform actions for the first steps, then the
    # policy's samples; its mode when greedy), the cap of log_alpha and the soft target
    # update after each update, and the metrics.
    predict_step = SacAlgorithm.predict_step
    rollout_step = SacAlgorithm.rollout_step
    _uniform_actions = SacAlgorithm._uniform_actions
    after_update = SacAlgorithm.after_update
    _loss_metrics = SacAlgorithm._loss_metrics

    def __init__(self, observation_space, action_space, config: QrsacConfig, device="cpu"):
        super().__init__(observation_space, action_space, config, device)
        if self.discrete:
            raise ValueError(f"qrsac takes a Box action space, as ALF's QrsacAlgorithm, got "
                             f"{action_space}; sac takes discrete actions")
        c = config
        self.actor_network = ActorDistributionNetwork(
            self.input_space, action_space, c.actor_fc_layer_params,
            continuous_projection="tanh_normal", **self.net_kwargs)
        self.critic_networks = ParallelQuantileCritics(
            self.input_space, action_space, c.critic_fc_layer_params, c.num_critic_replicas,
            c.num_quantiles, **self.net_kwargs)
        self.target_critic_networks = copy.deepcopy(self.critic_networks).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(float(c.initial_log_alpha)))
        self.target_entropy = (-float(np.prod(action_space.shape)) if c.target_entropy is None
                               else c.target_entropy)
        self.max_log_alpha = c.max_log_alpha
        self.use_entropy_reward = c.use_entropy_reward
        self.mini_batch_length = 2 + self.history_length
        self.target_update_tau = c.target_update_tau
        self.target_update_period = c.target_update_period
        self.initial_random_steps = c.initial_random_steps
        self.to(self.device)
        self._add_optimizer("actor", self.actor_network.parameters(), c.actor_learning_rate)
        self._add_optimizer("critic", self.critic_networks.parameters(), c.critic_learning_rate)
        self._add_optimizer("alpha", [self.log_alpha], c.alpha_learning_rate)

    # ----- training ---------------------------------------------------------------------------
    def train_step(self, experience: Experience, state=()) -> AlgStep:
        """``experience``: batch-major ``[B, T]``. Rows ``0..T-2`` are trained on (critic,
        actor, alpha); rows ``1..T-1`` give their one-step target quantiles."""
        exp = experience
        B, T = exp.step_type.shape[:2]
        obs_cur = exp.observation[:, :-1].flatten(0, 1)
        obs_next = exp.observation[:, 1:].flatten(0, 1)
        alpha = self.log_alpha.detach().exp()
        z = self.critic_networks(obs_cur, exp.action[:, :-1].flatten(0, 1))        # [BT, R, N]
        with torch.no_grad():
            z_next = self._soft_target_quantiles(obs_next, alpha).view(B, T - 1, -1)
            target = quantile_td_target(exp.reward[:, 1:], exp.discount[:, 1:], z_next,
                                        self.config.gamma)                        # [B, T-1, N]
        actor_loss, entropy = self._actor_objective(obs_cur, alpha)
        return AlgStep(info={
            "exp": exp, "quantiles": z.view(B, T - 1, *z.shape[1:]), "target": target,
            "actor_loss": actor_loss.view(B, T - 1), "entropy": entropy.view(B, T - 1)})

    def _soft_target_quantiles(self, obs_next, alpha) -> torch.Tensor:
        """``Z'(s', a') - alpha * log pi(a'|s')`` per quantile, ``[B, N]`` (call without
        gradient): the target critics' minimum over replicas (:func:`replica_minimum`)."""
        a_next, log_pi_next = _sample_and_log_prob(self.actor_network(obs_next))
        z = replica_minimum(self.target_critic_networks(obs_next, a_next),
                            self.config.min_critic_by_critic_mean)
        return z - alpha * log_pi_next.unsqueeze(-1) if self.use_entropy_reward else z

    def _actor_objective(self, obs_cur, alpha):
        """Per-sample actor loss and entropy."""
        a_pi, log_pi = _sample_and_log_prob(self.actor_network(obs_cur))
        # Critic weights are detached here so the actor loss only trains the actor.
        z_pi = replica_minimum(self.critic_networks(obs_cur, a_pi, detach_params=True),
                               self.config.min_critic_by_critic_mean)
        value = risk_value(z_pi, self.config.risk_measure, self.config.risk_level)
        return alpha * log_pi - value, -log_pi

    def calc_loss(self, info) -> LossInfo:
        exp, z, target = info["exp"], info["quantiles"], info["target"]
        c = self.config
        valid = (exp.step_type[:, :-1] != StepType.LAST).float()                  # [B, T-1]
        per_replica = quantile_huber_loss(z, target.unsqueeze(2), c.huber_kappa,
                                          c.sum_over_quantiles)                 # [B, T-1, R]
        critic_loss = (per_replica.sum(-1) * valid).mean(1)                        # [B]
        # Priorities: the TD error of the quantiles' means on the sampled row.
        td_error = (target[:, 0].mean(-1, keepdim=True) - z[:, 0].detach().mean(-1)) \
            * valid[:, :1]                                                          # [B, R]
        actor_loss = info["actor_loss"].mean(1)
        entropy = info["entropy"]
        a_loss = alpha_loss(self.log_alpha, entropy.mean(), self.target_entropy)
        return LossInfo(
            loss=critic_loss + actor_loss, scalar_loss=a_loss,
            priority=td_error.abs().mean(-1),
            extra=self._loss_metrics(critic_loss, actor_loss, a_loss, entropy, z))
