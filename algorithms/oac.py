"""Optimistic Actor-Critic (Ciosek et al. 2019, "Better Exploration with Optimistic
Actor-Critic"; ALF's ``OacAlgorithm``): SAC whose exploration is optimistic.

SAC explores by sampling its own policy, and the policy is trained against the minimum of the
critics, a lower bound of Q: it is pessimistic, so it under-explores where the critics
disagree. OAC keeps SAC's training (critics, actor, temperature: :mod:`algorithms.sac`, one
step windows or longer) and its greedy evaluation, and changes only how the rollout samples.
With ``mu_T`` and ``Sigma = diag(sigma^2)`` the pre-tanh mean and variance of the policy at
``s``::

    Q_UB(s, a) = mean_r Q_r(s, a) + beta_ub * std_r Q_r(s, a)     (std over the replicas;
                                                    |Q_1 - Q_2| / 2 for twin critics)
    g          = d Q_UB(s, tanh(u)) / du  at  u = mu_T           (the action at the mean)
    mu_E       = mu_T + explore_delta * Sigma g / sqrt(g^T Sigma g)
    a          = tanh(u) (scaled into the bounds),   u ~ N(mu_E, Sigma)

``mu_E`` maximizes the linearized upper bound among the Gaussians ``N(mu, Sigma)`` within
``KL = explore_delta^2 / 2`` of the policy's. The norm is per state, as in the paper (ALF's
sums it over the rollout batch, which is the same with its one environment). Acting needs the
critics, so they travel with the policy parameters to the unroller. The first
``initial_random_steps`` act uniformly, as SAC's.
"""

from __future__ import annotations

import torch

from algorithms.config_alf import OacConfig
from algorithms.data import AlgStep, TimeStep
from algorithms.sac import SacAlgorithm


def optimistic_shift(mean: torch.Tensor, var: torch.Tensor, grad: torch.Tensor,
                     delta: float) -> torch.Tensor:
    """``mean + delta * var * grad / sqrt(sum(grad^2 * var))`` per row (``[B, A]`` each):
    the mean of the Gaussian with covariance ``diag(var)`` that maximizes ``grad . mu`` within
    ``KL = delta^2 / 2`` of ``N(mean, diag(var))``. A zero gradient leaves the mean."""
    norm = (grad.square() * var).sum(-1, keepdim=True).sqrt() + 1e-6
    return mean + delta * var * grad / norm


def upper_bound(q: torch.Tensor, beta_ub: float) -> torch.Tensor:
    """``Q_UB = mean + beta_ub * std`` over the replicas of ``q [B, R]`` (the population std:
    ``|Q_1 - Q_2| / 2`` for two)."""
    return q.mean(-1) + beta_ub * q.std(-1, correction=0)


class OacAlgorithm(SacAlgorithm):
    """OAC for a bounded ``Box`` action space; hyperparameters: see :class:`OacConfig`."""

    # The optimistic rollout differentiates the critics' upper bound.
    _policy_modules = ("actor_network", "critic_networks")

    def __init__(self, observation_space, action_space, config: OacConfig, device="cpu"):
        super().__init__(observation_space, action_space, config, device)
        if self.discrete:
            raise ValueError(f"oac takes a Box action space, as ALF's OacAlgorithm, got "
                             f"{action_space}; sac takes discrete actions")

    @torch.no_grad()
    def rollout_step(self, time_step: TimeStep, state=()) -> AlgStep:
        obs = self._policy_input(time_step)
        b = obs.shape[0]
        if self.env_steps < self.initial_random_steps:
            action = self._uniform_actions(b)
        else:
            mean, std = self.exploration_gaussian(obs)
            u = mean + std * torch.randn_like(mean)
            scaler = self.actor_network.scaler
            action = torch.tanh(u) * scaler.scale + scaler.bias
        self._count_env_steps(b)
        return AlgStep(output=action, state=state, info={})

    def exploration_gaussian(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mu_E, sigma)``: the pre-tanh mean and std OAC samples from at ``obs``."""
        normal = self.actor_network(obs).base_dist.base_dist
        c = self.config
        with torch.enable_grad():
            mu = normal.loc.detach().requires_grad_()
            scaler = self.actor_network.scaler
            q = self.critic_networks(obs, torch.tanh(mu) * scaler.scale + scaler.bias,
                                     detach_params=True)
            (grad,) = torch.autograd.grad(upper_bound(q, c.beta_ub).sum(), mu)
        std = normal.scale
        return optimistic_shift(normal.loc, std.square(), grad, c.explore_delta), std
