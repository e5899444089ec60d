"""Multi-step value targets on time-major sequences ``[T, B, ...]``.

All functions take the ALF layout: ``rewards[t]`` and ``discounts[t]`` belong to the transition
that arrived at step ``t``, so the target for step ``t`` uses ``rewards[t + 1]``,
``discounts[t + 1]`` and ``values[t + 1]``. They return ``T - 1`` rows (the last step only serves
as the bootstrap). ``discounts`` is the environment discount (0 on termination, 1 otherwise);
``gamma`` is applied here.

Episode boundaries: a target never crosses ``LAST -> FIRST``. A row ``t`` whose step is ``LAST``
has no valid transition and gets ``values[t]`` as its return (and advantage 0); use
:func:`valid_mask` to drop those rows from a loss. When ``t + 1`` is ``LAST`` the recursion stops
there and bootstraps with ``discounts[t + 1] * values[t + 1]``: zero after termination, the value
of the final observation after truncation.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from algorithms.data import StepType


def _expand(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    while x.dim() < like.dim():
        x = x.unsqueeze(-1)
    return x


def valid_mask(step_types: torch.Tensor) -> torch.Tensor:
    """``[T - 1, B]`` float mask: 1 where step ``t`` has a transition to ``t + 1``."""
    return (step_types[:-1] != StepType.LAST).float()


def one_step_discounted_return(rewards, values, step_types, discounts, gamma: float):
    """``r[t+1] + gamma * d[t+1] * V[t+1]``; ``V[t]`` on rows where step ``t`` is LAST."""
    is_last = _expand((step_types[:-1] == StepType.LAST).float(), values)
    d = _expand(discounts[1:], values) * gamma
    ret = _expand(rewards[1:], values) + d * values[1:]
    return is_last * values[:-1] + (1 - is_last) * ret


def td_lambda_return(rewards, values, step_types, discounts, gamma: float, td_lambda: float):
    """λ-return ``G[t] = r[t+1] + gamma d[t+1] ((1-λ) V[t+1] + λ G[t+1])``, ``G[T-1] = V[T-1]``.

    ``td_lambda=1`` is the n-step (Monte-Carlo within the window) return bootstrapped at the
    window end or at the episode end; ``td_lambda=0`` is the one-step return.
    """
    T = values.shape[0]
    is_last = _expand((step_types == StepType.LAST).float(), values)
    r = _expand(rewards, values)
    d = _expand(discounts, values) * gamma
    rets = [None] * (T - 1)
    g = values[T - 1]
    for t in reversed(range(T - 1)):
        # G[t+1] is V[t+1] when t+1 is LAST (its own row holds V) or t+1 is the window end.
        nxt = (1 - td_lambda) * values[t + 1] + td_lambda * g
        g = is_last[t] * values[t] + (1 - is_last[t]) * (r[t + 1] + d[t + 1] * nxt)
        rets[t] = g
    return torch.stack(rets, 0)


def discounted_return(rewards, values, step_types, discounts, gamma: float):
    """Bootstrapped multi-step return ``G_{t:T}`` (``td_lambda_return`` with λ = 1)."""
    return td_lambda_return(rewards, values, step_types, discounts, gamma, 1.0)


def generalized_advantage_estimation(rewards, values, step_types, discounts, gamma: float,
                                     td_lambda: float):
    """GAE: ``A[t] = δ[t] + gamma λ d[t+1] A[t+1]`` with
    ``δ[t] = r[t+1] + gamma d[t+1] V[t+1] - V[t]``; ``A = 0`` on LAST rows and the recursion
    restarts at every LAST. ``A + V[:-1]`` equals :func:`td_lambda_return`.
    """
    T = values.shape[0]
    is_last = _expand((step_types == StepType.LAST).float(), values)
    r = _expand(rewards, values)
    d = _expand(discounts, values) * gamma
    delta = r[1:] + d[1:] * values[1:] - values[:-1]
    advs = [None] * (T - 1)
    acc = torch.zeros_like(values[0])
    for t in reversed(range(T - 1)):
        # A[t+1] contributes nothing when t+1 is LAST: its row has advantage 0.
        acc = (1 - is_last[t]) * (delta[t] + td_lambda * d[t + 1] * acc)
        advs[t] = acc
    return torch.stack(advs, 0)


class VTraceReturns(NamedTuple):
    """What :func:`vtrace` returns, all ``[T - 1, B]`` and without gradient.

    vs: the value targets ``v_s`` of rows ``0..T-2`` (``values[t]`` on LAST rows).
    pg_advantages: ``rho_pg[t] (r[t+1] + gamma d[t+1] v_s[t+1] - V[t])`` (0 on LAST rows).
    rhos: the clipped importance weights ``min(rho_bar, pi/mu)`` (1 on LAST rows).
    log_rhos: the unclipped ``log pi - log mu`` (0 on LAST rows), for metrics.
    """

    vs: torch.Tensor
    pg_advantages: torch.Tensor
    rhos: torch.Tensor
    log_rhos: torch.Tensor


@torch.no_grad()
def vtrace(target_log_probs, behaviour_log_probs, rewards, values, step_types, discounts,
           gamma: float, clip_rho_threshold: float = 1.0, clip_c_threshold: float = 1.0,
           clip_pg_rho_threshold: float | None = None, td_lambda: float = 1.0) -> VTraceReturns:
    """V-trace (Espeholt et al. 2018, eq. 1 and section 4.2) in this module's layout.

    ``target_log_probs``/``behaviour_log_probs``: ``log pi(a_t|x_t)`` of the policy being
    trained and of the one that acted, ``[T, B]`` or ``[T - 1, B]`` (the last row, whose
    action no transition of the window follows, is not used). ``values``: ``V(x_t)`` of the
    trained network, ``[T, B]``, the last row the bootstrap. With
    ``rho_t = min(rho_bar, pi/mu)``, ``c_t = td_lambda * min(c_bar, pi/mu)`` and
    ``delta_t = rho_t (r[t+1] + gamma d[t+1] V[t+1] - V[t])``::

        v_s[t] - V[t] = delta_t + gamma d[t+1] c_t (v_s[t+1] - V[t+1])

    with ``v_s[T-1] = V[T-1]`` at the window end; the recursion stops at every LAST step (its
    row keeps ``v_s = V``), so a target ends with ``d[t+1] V[t+1]`` after termination or
    truncation, as the other targets here. With ``pi = mu``, ``rho_bar, c_bar >= 1`` and
    ``td_lambda = 1`` it is :func:`discounted_return`. ``clip_pg_rho_threshold`` (``None``:
    ``clip_rho_threshold``) clips the weight of the policy-gradient advantage.
    """
    T = values.shape[0]
    log_rhos = (target_log_probs[:T - 1] - behaviour_log_probs[:T - 1]).float()
    is_last = step_types[:-1] == StepType.LAST
    # A LAST row's action was never applied: its ratio is meaningless, set it to 1.
    log_rhos = torch.where(is_last, torch.zeros_like(log_rhos), log_rhos)
    ratios = log_rhos.exp()  # inf past exp's range: clamped below, never multiplied by 0
    rhos = ratios.clamp(max=clip_rho_threshold)
    cs = td_lambda * ratios.clamp(max=clip_c_threshold)
    pg_threshold = clip_rho_threshold if clip_pg_rho_threshold is None else clip_pg_rho_threshold
    pg_rhos = ratios.clamp(max=pg_threshold)
    d = discounts[1:] * gamma
    r = rewards[1:]
    delta = rhos * (r + d * values[1:] - values[:-1])
    zero = torch.zeros_like(values[0])
    corrections = [None] * (T - 1)
    acc = zero  # v_s[t+1] - V[t+1]: 0 at the window end and on LAST rows
    for t in reversed(range(T - 1)):
        acc = torch.where(is_last[t], zero, delta[t] + d[t] * cs[t] * acc)
        corrections[t] = acc
    vs = values[:-1] + torch.stack(corrections, 0)
    vs_next = torch.cat([vs[1:], values[-1:]], 0)  # v_s[t+1]; V on LAST rows already
    pg_adv = torch.where(is_last, torch.zeros_like(vs),
                         pg_rhos * (r + d * vs_next - values[:-1]))
    return VTraceReturns(vs, pg_adv, torch.where(is_last, torch.ones_like(rhos), rhos),
                         log_rhos)


def normalize_advantages(advantages: torch.Tensor, eps: float = 1e-8,
                         mask: torch.Tensor | None = None) -> torch.Tensor:
    """Zero mean, unit variance over the whole batch (over ``mask == 1`` entries if given)."""
    if mask is None:
        return (advantages - advantages.mean()) / (advantages.std(unbiased=False) + eps)
    n = mask.sum().clamp(min=1)
    mean = (advantages * mask).sum() / n
    var = (((advantages - mean) * mask) ** 2).sum() / n
    return (advantages - mean) / (var.sqrt() + eps)
