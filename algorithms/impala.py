"""IMPALA's learner (Espeholt et al. 2018): actor-critic on unrolls that older parameters may
have collected, corrected by V-trace.

For each mini-batch of whole env columns ``[T, n]`` of an unroll, the current network gives
``log pi(a_t|x_t)``, ``V(x_t)`` and the entropy; V-trace (:func:`algorithms.value_ops.vtrace`)
of its log-probs against the rollout's (the behaviour policy ``mu``) and of its values (no
gradient through either) gives ``v_s`` and the advantages, and the loss on every row with a
transition is the paper's::

    rho_t   = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t))          (clip_pg_rho_threshold)
    L_pg    = -rho_t (r[t+1] + gamma d[t+1] v_s[t+1] - V(x_t)) log pi(a_t|x_t)
    L_value = td_loss_weight (v_s[t] - V(x_t))^2
    loss    = L_pg + L_value - entropy_regularization H(pi(.|x_t))

The paper makes one update per batch (``num_epochs`` 1, ``mini_batch_size`` at least the
unroll's ``T * B``). More epochs or mini-batches keep the targets right (V-trace is recomputed
with the network of each update), but nothing bounds how far the updates move the policy from
the one that acted, as PPO's clip does: on MinAtar Breakout 16-32 updates per unroll, or
advantages normalized per mini-batch, collapsed the policy to a deterministic one within 100k
env steps; a few updates per unroll at a modest learning rate did not. The paper's optimizer
is RMSProp (``optimizer: rmsprop``);
Adam is the default, as for PPO. The networks, their options (encoders, shared encoder,
orthogonal init, the GRU of ``rnn_size``) and ``rollout_step`` are
:class:`~algorithms.ppo.PPOAlgorithm`'s; the mini-batches are whole columns as recurrent PPO's.
"""

from __future__ import annotations

import torch

from algorithms.config_async import ImpalaConfig
from algorithms.data import AlgStep, Experience, LossInfo
from algorithms.ppo import PPOAlgorithm
from algorithms.value_ops import normalize_advantages, valid_mask
from algorithms.vtrace_common import (
    unroll_outputs,
    use_configured_optimizer,
    vtrace_metrics,
    vtrace_of,
)


class ImpalaAlgorithm(PPOAlgorithm):
    """IMPALA for discrete or continuous actions; hyperparameters: see :class:`ImpalaConfig`."""

    def __init__(self, observation_space, action_space, config: ImpalaConfig, device="cpu"):
        super().__init__(observation_space, action_space, config, device)
        use_configured_optimizer(self)

    def _mini_batches(self, exp: Experience, keep: torch.Tensor, targets: dict):
        """Shuffled mini-batches of ``mini_batch_size // (T - 1)`` whole env columns (at least
        one); their ``train_step`` info. The GAE ``targets`` PPO passes are not used."""
        B = exp.step_type.shape[1]
        per_batch = max(1, self.mini_batch_size // keep.shape[0])

        def columns():
            perm = torch.randperm(B, device=self.device)
            yield from (perm[i:i + per_batch] for i in range(0, B, per_batch))

        return columns, lambda cols: self.train_step(exp.map(lambda x: x[:, cols])).info

    def train_step(self, experience: Experience, state=()) -> AlgStep:
        """Env columns ``[T, n]`` of an unroll: the current network on every row and V-trace."""
        out = unroll_outputs(self, experience)
        return AlgStep(info={"exp": experience, "out": out,
                             "vtrace": vtrace_of(self.config, experience, out)})

    def calc_loss(self, info) -> LossInfo:
        exp, out, vt = info["exp"], info["out"], info["vtrace"]
        keep = valid_mask(exp.step_type).bool()
        adv = vt.pg_advantages[keep]
        if self.config.normalize_advantages:
            adv = normalize_advantages(adv)
        if self.config.advantage_clip:
            adv = adv.clamp(-self.config.advantage_clip, self.config.advantage_clip)
        pg_loss = -adv * out.log_prob[:-1][keep]
        td_loss = (vt.vs[keep] - out.value[:-1][keep]) ** 2
        entropy = out.entropy[:-1][keep]
        c = self.config
        loss = pg_loss + c.td_loss_weight * td_loss - c.entropy_regularization * entropy
        return LossInfo(loss=loss, extra={
            "pg_loss": pg_loss, "td_loss": td_loss, "entropy": entropy,
            **vtrace_metrics(vt, exp.step_type, c.clip_rho_threshold)})
