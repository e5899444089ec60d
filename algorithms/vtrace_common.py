"""What IMPALA (:mod:`algorithms.impala`) and APPO (:mod:`algorithms.appo`) share: the current
network's outputs over whole unroll columns, V-trace on them, its metrics, and the optimizer
choice. Both algorithms are :class:`~algorithms.ppo.PPOAlgorithm`'s networks (its encoders,
shared encoder, orthogonal init and GRU cores), so these helpers take that algorithm.

Why whole columns: V-trace is a backward recursion over time, so it needs every row of an
environment's unroll together, and a recurrent core must re-run from the state the unroll
started from (``rollout_info["state"][0]``), as recurrent PPO trains.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from algorithms.data import Experience, StepType
from algorithms.optim import Optimizers
from algorithms.value_ops import VTraceReturns, valid_mask, vtrace


class UnrollOutputs(NamedTuple):
    """The current network on env columns of an unroll, every row ``0..T-1``: ``[T, n]``."""

    log_prob: torch.Tensor  # log pi(a_t | x_t) of the action taken
    entropy: torch.Tensor
    value: torch.Tensor  # V(x_t); row T-1 bootstraps


def unroll_outputs(alg, exp: Experience, cols: torch.Tensor | None = None) -> UnrollOutputs:
    """``alg``'s (a PPOAlgorithm's) policy and value on columns ``cols`` (all: None) of the
    time-major unroll ``exp`` ``[T, B]``; carries gradients unless called under no_grad."""
    take = (lambda x: x) if cols is None else (lambda x: x[:, cols])
    obs, action = take(exp.observation), take(exp.action)
    T, n = obs.shape[:2]
    features = alg.encoding_network(obs.flatten(0, 1))
    if alg.rnn is not None:
        features = features.view(T, n, -1)
        first = take(exp.step_type) == StepType.FIRST
        h = take(exp.rollout_info["state"])[0]
        outputs = []
        for t in range(T):
            h = alg.rnn(features[t], torch.where(first[t][:, None], torch.zeros_like(h), h))
            outputs.append(h)
        features = torch.stack(outputs).flatten(0, 1)
    dist = alg.actor_network(alg._actor_in(features))
    value = alg.value_network(alg._value_in(features))
    return UnrollOutputs(dist.log_prob(action.flatten(0, 1)).view(T, n),
                         dist.entropy().view(T, n), value.view(T, n))


def vtrace_of(config, exp: Experience, out: UnrollOutputs,
              cols: torch.Tensor | None = None) -> VTraceReturns:
    """V-trace (:func:`~algorithms.value_ops.vtrace`) of columns ``cols`` of ``exp`` with the
    current network's ``out`` as the target policy and values, the rollout's ``log_prob``
    as the behaviour policy (the parameters that acted, however old)."""
    take = (lambda x: x) if cols is None else (lambda x: x[:, cols])
    c = config
    return vtrace(out.log_prob.detach(), take(exp.rollout_info["log_prob"]), take(exp.reward),
                  out.value.detach(), take(exp.step_type), take(exp.discount), c.gamma,
                  c.clip_rho_threshold, c.clip_c_threshold, c.clip_pg_rho_threshold,
                  c.td_lambda)


@torch.no_grad()
def vtrace_metrics(returns: VTraceReturns, step_type: torch.Tensor, clip_rho: float) -> dict:
    """How far the batch is off-policy: the mean importance ratio before and after the
    truncation, the fraction truncated and the mean |log pi/mu| (valid rows only). A ratio
    counts as truncated when it exceeds the threshold by more than float32 noise (the same
    network batched differently differs by ~1e-7)."""
    mask = valid_mask(step_type)
    n = mask.sum().clamp(min=1)
    ratio = returns.log_rhos.exp()
    mean = lambda x: (x * mask).sum() / n  # noqa: E731
    return {"vtrace/ratio": mean(ratio.clamp(max=1e6)), "vtrace/rho": mean(returns.rhos),
            "vtrace/rho_clipped_fraction": mean((ratio > clip_rho * (1 + 1e-5)).float()),
            "vtrace/abs_log_ratio": mean(returns.log_rhos.abs())}


class RmsPropOptimizers(Optimizers):
    """:class:`~algorithms.optim.Optimizers` built as ``torch.optim.RMSprop`` (decay 0.99, no
    momentum, as the IMPALA paper) instead of Adam; clipping and stepping are the base's."""

    def __init__(self, max_grad_norm: float | None, epsilon: float):
        super().__init__(max_grad_norm)
        self.epsilon = epsilon

    @property
    def by_name(self) -> dict:
        if self._built is None:
            self._built = {name: torch.optim.RMSprop(params, lr=lr, alpha=0.99, momentum=0.0,
                                                     eps=self.epsilon)
                           for name, (params, lr, _) in self._specs.items()}
            self._fused = None
        return self._built


def use_configured_optimizer(alg) -> None:
    """Swap ``alg``'s Adam for RMSProp when its config says ``optimizer: rmsprop`` (before any
    update: the optimizers are built at the first one)."""
    c = alg.config
    if c.optimizer == "rmsprop":
        opts = RmsPropOptimizers(c.max_grad_norm, c.rmsprop_epsilon)
        opts.add("ac", alg.parameters(), c.learning_rate)
        alg._optimizers = opts
