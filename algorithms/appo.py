"""Asynchronous PPO (APPO) as Sample Factory runs it (Petrenko et al. 2020, ``with_vtrace``):
PPO's clipped surrogate on unrolls that older parameters may have collected, its advantages
and value targets from V-trace (Espeholt et al. 2018).

Once per batch, before the epochs, the current network re-evaluates the whole unroll (no
gradient): its log-probs against the rollout's (the behaviour policy, however many versions
old) give the truncated importance weights, its values the baseline, and V-trace
(:func:`algorithms.value_ops.vtrace`) gives ``v_s`` (the value targets, PPO's ``returns``) and
``rho_t (r + gamma v_s[t+1] - V(x_t))`` (the advantages). The epochs of mini-batches are then
PPO's (:class:`~algorithms.ppo.PPOAlgorithm`: the ratio is against the behaviour policy, as in
Sample Factory); only the targets differ. With ``vtrace`` false the targets are PPO's GAE from
the rollout values: the uncorrected baseline of the side-by-side measurement. With
``proximal_policy: learner`` the ratio is against the network as the batch found it instead
(decoupled PPO, Hilton et al. 2021): each batch gets the whole clip range however old it is,
and its distance from the behaviour policy is V-trace's truncated weights in the advantages.

Recurrent policies (``rnn_size``) re-run the GRU over each env column from the state its
unroll started from, for V-trace as for PPO's mini-batches of whole columns. Either way the
metrics ``vtrace/*`` say how far each batch was off-policy (:func:`vtrace_metrics`).
"""

from __future__ import annotations

import torch

from algorithms.base import _scalars
from algorithms.config_async import AppoConfig
from algorithms.data import Experience
from algorithms.ppo import PPOAlgorithm
from algorithms.vtrace_common import (
    unroll_outputs,
    use_configured_optimizer,
    vtrace_metrics,
    vtrace_of,
)


class AppoAlgorithm(PPOAlgorithm):
    """APPO for discrete or continuous actions; hyperparameters: see :class:`AppoConfig`."""

    def __init__(self, observation_space, action_space, config: AppoConfig, device="cpu"):
        super().__init__(observation_space, action_space, config, device)
        use_configured_optimizer(self)
        self._lag_metrics: dict = {}

    def _mini_batches(self, exp: Experience, keep: torch.Tensor, targets: dict):
        """PPO's mini-batches, on V-trace targets (see the module doc)."""
        with torch.no_grad():
            current = unroll_outputs(self, exp)
            returns = vtrace_of(self.config, exp, current)
        self._lag_metrics = vtrace_metrics(returns, exp.step_type,
                                           self.config.clip_rho_threshold)
        if self.config.vtrace:
            targets = {**targets, "advantages": returns.pg_advantages, "returns": returns.vs}
        if self.config.proximal_policy == "learner":
            # Decoupled PPO: the ratio is against the network as the batch found it, whose
            # distance from the behaviour policy V-trace's weights (in the advantages) carry.
            targets = {**targets, "log_prob": current.log_prob[:-1]}
        return super()._mini_batches(exp, keep, targets)

    def train_in_stages(self, experience: Experience, importance_weights=None):
        result = yield from super().train_in_stages(experience, importance_weights)
        result.metrics.update(_scalars(self._lag_metrics))
        return result
