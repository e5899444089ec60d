"""Conservative Q-learning (Kumar, Zhou, Tucker, Levine 2020), CQL(H) on SAC, continuous
actions.

Offline, SAC's critics are trained towards values of actions the policy proposes and the
dataset never took; their errors there are never corrected, and the policy climbs them. CQL
adds a term to each critic's loss that pushes its values down across all actions (a soft
maximum over sampled actions) and up at the dataset's action, so an action outside the data
is valued no higher than the data supports::

    L_Q_i   = SAC's TD loss of critic i
              + cql_alpha * (T * logsumexp_j((Q_i(s, a_j) - log mu(a_j)) / T) - Q_i(s, a))

with ``T`` = ``cql_temperature`` and the ``a_j`` drawn three ways, ``cql_num_actions`` each:
uniformly in the action box (``mu`` its density), from the policy at ``s`` and from the
policy at ``s'`` (``mu``: the policy's own density of each, not differentiated). Dividing by
``mu`` makes the sum an importance-sampled estimate of ``log integral exp(Q(s, a)) da`` (up to a
constant that no gradient sees). The actor and the temperature ``alpha`` train as SAC's;
``use_entropy_reward: false`` drops the entropy from the critics' target, as CQL's reference
settings do. Rows whose step is ``LAST`` take no penalty (no action is taken there).
"""

from __future__ import annotations

import math

import torch

from algorithms.config_offline import CqlConfig
from algorithms.data import AlgStep, Experience, LossInfo
from algorithms.sac import SacAlgorithm, _sample_and_log_prob
from storage.nest import StepType


def cql_penalty(*, q_data: torch.Tensor, q_sampled: torch.Tensor, log_density: torch.Tensor,
                temperature: float) -> torch.Tensor:
    """The conservative term per sample and critic ``[N, R]``.

    ``q_data``: ``[N, R]`` critics at the dataset's action; ``q_sampled``: ``[N, K, R]`` at
    ``K`` sampled actions; ``log_density``: ``[N, K]`` the log-density each sampled action was
    drawn with (no gradient)."""
    shifted = (q_sampled - log_density.detach()[..., None]) / temperature
    return temperature * torch.logsumexp(shifted, dim=1) - q_data


class CqlAlgorithm(SacAlgorithm):
    """CQL(H) on SAC; hyperparameters: see :class:`CqlConfig`."""

    def __init__(self, observation_space, action_space, config: CqlConfig, device="cpu"):
        super().__init__(observation_space, action_space, config, device)
        if self.discrete:
            raise ValueError("cql: continuous (Box) actions only; for discrete actions use bc")
        # The conservative term joins the critics' half: the two-thread update has no room
        # for it.
        self.parallel_update = False
        low = torch.as_tensor(action_space.low, dtype=torch.float32)
        high = torch.as_tensor(action_space.high, dtype=torch.float32)
        self.log_uniform_density = -float(torch.log(high - low).sum())
        if not math.isfinite(self.log_uniform_density):
            raise ValueError("cql: the action space must be bounded (uniform actions)")

    def train_step(self, experience: Experience, state=()) -> AlgStep:
        """SAC's step on ``[B, T]`` windows plus the critics at sampled actions of each
        trained row ``0..T-2`` (its successor gives the policy's actions at ``s'``)."""
        step = super().train_step(experience, state)
        exp = experience
        b, t = exp.step_type.shape[:2]
        obs = exp.observation[:, :-1].flatten(0, 1)
        next_obs = exp.observation[:, 1:].flatten(0, 1)
        n, k = obs.shape[0], self.config.cql_num_actions
        uniform = self._uniform_actions(n * k)
        with torch.no_grad():  # the policy's actions, not differentiated (the critics' term)
            a_cur, lp_cur = _sample_and_log_prob(self.actor_network(_repeat(obs, k)))
            a_next, lp_next = _sample_and_log_prob(self.actor_network(_repeat(next_obs, k)))
        actions = torch.cat([uniform.view(n, k, -1), a_cur.view(n, k, -1),
                             a_next.view(n, k, -1)], 1)                         # [N, 3K, A]
        q_sampled = self.critic_networks(_repeat(obs, 3 * k), actions.flatten(0, 1))
        log_density = torch.cat([torch.full((n, k), self.log_uniform_density,
                                            device=obs.device),
                                 lp_cur.view(n, k), lp_next.view(n, k)], 1)
        step.info["q_sampled"] = q_sampled.view(n, 3 * k, -1)
        step.info["log_density"] = log_density
        step.info["cql_valid"] = (exp.step_type[:, :-1] != StepType.LAST).float()  # [B, T-1]
        return step

    def calc_loss(self, info) -> LossInfo:
        loss = super().calc_loss(info)
        q = info["q"]                                                           # [B, T-1, R]
        penalty = cql_penalty(q_data=q.flatten(0, 1), q_sampled=info["q_sampled"],
                              log_density=info["log_density"],
                              temperature=self.config.cql_temperature)
        # Summed over the critics (as their TD losses are), averaged over the trained rows.
        penalty = (penalty.sum(-1).view(q.shape[:2]) * info["cql_valid"]).mean(1)  # [B]
        extra = dict(loss.extra)
        extra["loss/cql"] = penalty.detach()
        extra["cql/q_sampled"] = info["q_sampled"].detach()
        return loss._replace(loss=loss.loss + self.config.cql_alpha * penalty, extra=extra)


def _repeat(x: torch.Tensor, k: int) -> torch.Tensor:
    """Each row ``k`` times in a row: ``[B, ...] -> [B * k, ...]``."""
    return x.repeat_interleave(k, 0)
