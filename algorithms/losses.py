"""Loss functions (pure, stateless) with ALF's names.

Sequence inputs are time-major ``[T, B]``; returned per-step losses are ``[T, B]`` with the
last row (bootstrap only) and every row whose step is ``LAST`` set to zero, as ALF does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from algorithms import value_ops
from algorithms.data import LossInfo, StepType


def element_wise_squared_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``(x - y) ** 2`` element-wise."""
    return F.mse_loss(x, y, reduction="none")


def element_wise_huber_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Huber loss with delta 1: ``0.5 e^2`` if ``|e| <= 1`` else ``|e| - 0.5``."""
    return F.smooth_l1_loss(x, y, reduction="none", beta=1.0)


_LOSS_FNS = {"squared": element_wise_squared_loss, "huber": element_wise_huber_loss}


def get_td_error_loss_fn(name_or_fn: str | Callable) -> Callable:
    """``"squared"``/``"huber"`` or a callable ``(target, value) -> loss``."""
    return _LOSS_FNS[name_or_fn] if isinstance(name_or_fn, str) else name_or_fn


def _pad_last(x: torch.Tensor) -> torch.Tensor:
    """Append a zero row so a ``[T-1, ...]`` tensor becomes ``[T, ...]``."""
    return torch.cat([x, torch.zeros_like(x[:1])], 0)


@dataclass
class TDLoss:
    """Temporal-difference loss against the λ-return of ``target_value`` (ALF's ``TDLoss``).

    gamma: discount factor.
    td_error_loss_fn: ``(target, value) -> element-wise loss`` or ``"squared"``/``"huber"``.
    td_lambda: 0 = one-step target, 1 = n-step target bootstrapped at the window end.
    normalize_target: divide the target and value by the target's batch std (changes the loss
        scale only).
    """

    gamma: float = 0.99
    td_error_loss_fn: Callable | str = element_wise_squared_loss
    td_lambda: float = 0.95
    normalize_target: bool = False

    def compute_td_target(self, step_type, reward, discount, target_value):
        """``[T-1, B, ...]`` λ-return targets (detached)."""
        with torch.no_grad():
            if self.td_lambda == 0:
                return value_ops.one_step_discounted_return(
                    reward, target_value, step_type, discount, self.gamma)
            return value_ops.td_lambda_return(
                reward, target_value, step_type, discount, self.gamma, self.td_lambda)

    def __call__(self, step_type, reward, discount, value, target_value) -> LossInfo:
        """All inputs time-major ``[T, B]`` (``value``/``target_value`` may have trailing dims,
        e.g. critic replicas ``[T, B, R]``). Returns ``LossInfo(loss=[T, B(, R)], extra={"td_error":
        [T-1, B(, R)], "target": ...})``."""
        target = self.compute_td_target(step_type, reward, discount, target_value)
        v = value[:-1]
        if self.normalize_target:
            scale = target.std().clamp(min=1e-6)
            target, v = target / scale, v / scale
        loss = get_td_error_loss_fn(self.td_error_loss_fn)(target, v)
        mask = value_ops._expand(value_ops.valid_mask(step_type), loss)
        td_error = (target - v) * mask
        return LossInfo(loss=_pad_last(loss * mask), extra={"td_error": td_error,
                                                             "target": target})


def one_step_window(td_loss: TDLoss, exp) -> bool:
    """Whether a batch-major ``[B, T]`` batch can take the short one-step path of DQN and
    :func:`critic_td_loss`: windows of two steps, and a target that is not normalized."""
    return exp.step_type.shape[1] == 2 and not td_loss.normalize_target


def critic_td_loss(td_loss: TDLoss, exp, q: torch.Tensor, next_value: torch.Tensor,
                   one_step: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The TD loss of critic replicas on batch-major ``[B, T]`` windows (SAC, DDPG, TD3).

    ``q``: ``[B, T-1, R]`` values of the trained rows; ``next_value``: ``[B, T-1]`` target
    values of rows ``1..T-1`` (no gradient). Returns the per-sample loss summed over replicas
    (``[B]``) and the TD errors of row 0 (``[B, R]``, for priorities).

    ``one_step`` (``T = 2``, ``td_loss`` not normalizing): what ``td_loss`` computes on the
    padded window for its one trained row (a LAST row masked there and here), in about 25
    tensor operations fewer: an update of small networks is mostly Python dispatch."""
    if one_step:
        q, next_value = q[:, 0], next_value[:, 0]
        with torch.no_grad():
            target = exp.reward[:, 1] + (exp.discount[:, 1] * td_loss.gamma) * next_value
            valid = (exp.step_type[:, 0] != StepType.LAST).float().unsqueeze(-1)
        target = target.unsqueeze(-1).expand_as(q)
        loss = get_td_error_loss_fn(td_loss.td_error_loss_fn)(target, q) * valid
        return loss.sum(-1), (target - q) * valid
    # Pad to [B, T] so TDLoss sees the whole window: row T-1 of q is never trained and row 0
    # of the target value is never used.
    q = torch.cat([q, torch.zeros_like(q[:, :1])], 1)
    next_value = torch.cat([torch.zeros_like(next_value[:, :1]), next_value], 1)
    tm = lambda x: x.transpose(0, 1)  # noqa: E731  [B, T, ...] -> [T, B, ...]
    li = td_loss(tm(exp.step_type), tm(exp.reward), tm(exp.discount), tm(q),
                 tm(next_value.unsqueeze(-1).expand_as(q)))
    return li.loss.sum(0).sum(-1) / (q.shape[1] - 1), li.extra["td_error"][0]


def advantages_and_returns(step_type, reward, discount, value, gamma: float, td_lambda: float,
                           use_gae: bool = True, use_td_lambda_return: bool = True):
    """``(advantages, returns)`` of shape ``[T-1, B]`` from time-major rollout values.

    With ``use_gae``: GAE advantages; returns are ``advantages + value`` if
    ``use_td_lambda_return`` else the bootstrapped discounted return. Without GAE: returns are
    the discounted return and advantages ``returns - value``.
    """
    with torch.no_grad():
        if use_gae:
            adv = value_ops.generalized_advantage_estimation(
                reward, value, step_type, discount, gamma, td_lambda)
            if use_td_lambda_return:
                ret = adv + value[:-1]
            else:
                ret = value_ops.discounted_return(reward, value, step_type, discount, gamma)
        else:
            ret = value_ops.discounted_return(reward, value, step_type, discount, gamma)
            adv = ret - value[:-1]
    return adv, ret


@dataclass
class ActorCriticLoss:
    """``policy_gradient_loss + td_loss_weight * td_loss - entropy_regularization * entropy``.

    gamma: discount factor.
    td_error_loss_fn: loss between return and value.
    use_gae: GAE advantages; otherwise ``discounted_return - value``.
    td_lambda: λ of GAE.
    use_td_lambda_return: with GAE, train the value on ``gae + value``.
    normalize_advantages: normalize advantages over the batch.
    advantage_clip: clip advantages to ``[-x, x]`` if set.
    entropy_regularization: entropy coefficient (None = 0).
    td_loss_weight: weight of the value loss.
    """

    gamma: float = 0.99
    td_error_loss_fn: Callable | str = element_wise_squared_loss
    use_gae: bool = False
    td_lambda: float = 0.95
    use_td_lambda_return: bool = True
    normalize_advantages: bool = False
    advantage_clip: float | None = None
    entropy_regularization: float | None = None
    td_loss_weight: float = 1.0

    def __call__(self, step_type, reward, discount, value, log_prob, entropy) -> LossInfo:
        """Time-major ``[T, B]`` inputs; ``value``, ``log_prob`` and ``entropy`` carry gradients.
        Returns ``loss`` ``[T, B]`` (zero on the last row and on LAST rows)."""
        adv, ret = advantages_and_returns(step_type, reward, discount, value.detach(), self.gamma,
                                          self.td_lambda, self.use_gae, self.use_td_lambda_return)
        mask = value_ops.valid_mask(step_type)
        if self.normalize_advantages:
            adv = value_ops.normalize_advantages(adv, mask=mask)
        if self.advantage_clip:
            adv = adv.clamp(-self.advantage_clip, self.advantage_clip)
        pg_loss = -adv * log_prob[:-1]
        td_loss = get_td_error_loss_fn(self.td_error_loss_fn)(ret, value[:-1])
        loss = pg_loss + self.td_loss_weight * td_loss
        if self.entropy_regularization:
            loss = loss - self.entropy_regularization * entropy[:-1]
        return LossInfo(loss=_pad_last(loss * mask), extra={
            "pg_loss": pg_loss * mask, "td_loss": td_loss * mask,
            "entropy": entropy[:-1] * mask, "advantages": adv * mask})


@dataclass
class PPOLoss:
    """Clipped surrogate (PPO paper eq. 9) + value loss - entropy bonus, per sample.

    The advantages and returns are computed beforehand from the rollout values (ALF's
    ``PPOAlgorithm.preprocess``) with :func:`advantages_and_returns`.

    importance_ratio_clipping: epsilon of the clipped objective.
    log_prob_clipping: if > 0, clip log-probs to ``(-c, c)`` before forming the ratio.
    normalize_advantages: normalize advantages over the (mini)batch.
    advantage_clip: clip advantages to ``[-x, x]`` if set.
    entropy_regularization: entropy coefficient (None = 0).
    td_loss_weight: weight of the value loss.
    td_error_loss_fn: loss between return and value.
    """

    importance_ratio_clipping: float = 0.2
    log_prob_clipping: float = 0.0
    normalize_advantages: bool = True
    advantage_clip: float | None = None
    entropy_regularization: float | None = None
    td_loss_weight: float = 1.0
    td_error_loss_fn: Callable | str = element_wise_squared_loss

    def __call__(self, log_prob, rollout_log_prob, advantages, returns, value, entropy) -> LossInfo:
        """Flat ``[N]`` samples (any equal shapes). ``log_prob``, ``value``, ``entropy`` carry
        gradients; ``rollout_log_prob``, ``advantages``, ``returns`` are constants."""
        adv = advantages
        if self.normalize_advantages:
            adv = value_ops.normalize_advantages(adv)
        if self.advantage_clip:
            adv = adv.clamp(-self.advantage_clip, self.advantage_clip)
        lp, old_lp = log_prob, rollout_log_prob
        if self.log_prob_clipping > 0:
            c = self.log_prob_clipping
            lp, old_lp = lp.clamp(-c, c), old_lp.clamp(-c, c)
        ratio = torch.exp(lp - old_lp)
        eps = self.importance_ratio_clipping
        pg_loss = -torch.min(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)
        td_loss = get_td_error_loss_fn(self.td_error_loss_fn)(returns, value)
        loss = pg_loss + self.td_loss_weight * td_loss
        if self.entropy_regularization:
            loss = loss - self.entropy_regularization * entropy
        with torch.no_grad():
            clip_frac = ((ratio - 1).abs() > eps).float().mean()
            approx_kl = ((ratio - 1) - (lp - old_lp)).mean()
        return LossInfo(loss=loss, extra={"pg_loss": pg_loss, "td_loss": td_loss,
                                          "entropy": entropy, "clip_fraction": clip_frac,
                                          "approx_kl": approx_kl})


def alpha_loss(log_alpha: torch.Tensor, entropy: torch.Tensor, target_entropy: float):
    """SAC temperature loss ``log_alpha * (H(pi) - target_entropy)`` (entropy detached):
    alpha grows when the policy's entropy is below the target."""
    return log_alpha * (entropy.detach() - target_entropy)


def importance_weighted_mean(loss: torch.Tensor, importance_weights: torch.Tensor | None):
    """Mean of per-sample ``loss [B]`` weighted by prioritized-replay importance weights."""
    if importance_weights is None:
        return loss.mean()
    return (loss * importance_weights.to(loss)).mean()
