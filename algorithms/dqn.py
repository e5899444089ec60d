"""DQN / Double DQN with n-step targets (Mnih et al. 2013; van Hasselt et al. 2015).

Training batches are batch-major ``[B, T]`` windows with ``T = mini_batch_length = n_step + 1``.
Every transition in the window is trained on; the target of row ``t`` is the bootstrapped
return up to the window end (``n_step > 1``) or the one-step target (``n_step = 1``)::

    a*       = argmax_a Q(s', a)            (double_q; else argmax of Q_target)
    td_target = r + gamma * d * Q_target(s', a*)        (chained n times, stopped at LAST)
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from algorithms.base import RLAlgorithm, _scalars
from algorithms.config_core import DqnConfig
from algorithms.data import (
    AlgStep,
    Experience,
    LazyMetrics,
    LossInfo,
    StepType,
    TimeStep,
    TrainResult,
)
from algorithms.losses import (
    TDLoss,
    get_td_error_loss_fn,
    importance_weighted_mean,
    one_step_window,
)
from algorithms.mlp_backprop import ReluMlp
from algorithms.networks import QNetwork


class DqnAlgorithm(RLAlgorithm):
    """DQN for a ``Discrete`` action space; hyperparameters: see :class:`DqnConfig`.

    Three update paths, each kept for a measured reason: the general window path (any
    ``n_step``, through :class:`TDLoss`); the one-step path (``T = 2``, the same values and
    gradients in ~25 fewer tensor operations); and, for ReLU MLPs, the one-step update without
    autograd (:mod:`algorithms.mlp_backprop`): 0.879 ms against 1.024 ms through autograd per
    CartPole update (``bench/updates.py --threads 1``, 2026-11-27, 7bc68b3, 2-core CPU), on
    CUDA 1.735 against 2.658 ms (H100). Tests hold all three to the same numbers."""

    _policy_modules = ("q_network",)

    def __init__(self, observation_space, action_space, config: DqnConfig, device="cpu"):
        super().__init__(observation_space, action_space, config, device)
        assert self.discrete, "DqnAlgorithm needs a Discrete action space"
        self.q_network = QNetwork(self.input_space, action_space, config.fc_layer_params,
                                  **self.net_kwargs)
        self.target_q_network = copy.deepcopy(self.q_network).requires_grad_(False)
        self.num_actions = int(action_space.n)
        self.mini_batch_length = config.n_step + 1 + self.history_length
        self.td_loss = TDLoss(gamma=config.gamma, td_error_loss_fn=config.td_error_loss_fn,
                              td_lambda=config.td_lambda if config.n_step > 1 else 0.0)
        self.to(self.device)
        self._add_optimizer("q", self.q_network.parameters(), config.learning_rate)
        self._by_hand = self._by_hand_networks()

    def epsilon(self) -> float:
        """The exploration epsilon after ``env_steps``: linear from ``epsilon_greedy_start``
        to ``rollout_epsilon_greedy`` over ``epsilon_decay_steps``."""
        c = self.config
        frac = min(1.0, self.env_steps / max(1, c.epsilon_decay_steps))
        return c.epsilon_greedy_start + frac * (c.rollout_epsilon_greedy - c.epsilon_greedy_start)

    @torch.no_grad()
    def predict_step(self, time_step: TimeStep, state=()) -> AlgStep:
        q = self.q_network(self._policy_input(time_step))
        return AlgStep(output=q.argmax(-1), state=state, info={})

    @torch.no_grad()
    def rollout_step(self, time_step: TimeStep, state=()) -> AlgStep:
        greedy = self.predict_step(time_step, state).output
        b = greedy.shape[0]
        eps = 1.0 if self.env_steps < self.config.initial_random_steps else self.epsilon()
        random_a = torch.randint(0, self.num_actions, (b,), device=self.device)
        explore = torch.rand(b, device=self.device) < eps
        self._count_env_steps(b)
        return AlgStep(output=torch.where(explore, random_a, greedy), state=state, info={})

    def train_step(self, experience: Experience, state=()) -> AlgStep:
        """``experience``: batch-major ``[B, T]``.

        Gradients flow only through rows ``0..T-2`` (the TD loss never reads the value of the
        last row), and the online network's action choice for double Q runs without autograd:
        for one-step targets that halves the backward pass."""
        if one_step_window(self.td_loss, experience):
            return self._one_step_train_step(experience)
        return self._window_train_step(experience)

    def _window_train_step(self, exp: Experience) -> AlgStep:
        """Any window length, through :class:`TDLoss`."""
        B, T = exp.step_type.shape[:2]
        q_rows = self.q_network(exp.observation[:, :-1].flatten(0, 1)).view(B, T - 1, -1)
        q_rows = q_rows.gather(-1, exp.action[:, :-1].unsqueeze(-1)).squeeze(-1)
        q = torch.cat([q_rows, torch.zeros_like(q_rows[:, :1])], 1)  # row T-1: never read
        with torch.no_grad():
            # Row 0's target value is only read on masked (LAST) rows, so the target network
            # runs on rows 1..T-1 only.
            next_obs = exp.observation[:, 1:].flatten(0, 1)
            q_target_next = self.target_q_network(next_obs).view(B, T - 1, -1)
            chooser = self.q_network(next_obs).view(B, T - 1, -1) if self.config.double_q \
                else q_target_next
            a_star = chooser.argmax(-1, keepdim=True)
            target_next = q_target_next.gather(-1, a_star).squeeze(-1)
            target_value = torch.cat([torch.zeros_like(target_next[:, :1]), target_next], 1)
        return AlgStep(info={"exp": exp, "q": q, "q_rows": q_rows, "target_value": target_value})

    def _one_step_train_step(self, exp: Experience) -> AlgStep:
        """``T = 2`` (one-step targets): what the general path computes, written for one row.

        The same values and gradients as :class:`TDLoss` on the padded ``[B, 2]`` window
        (the same operations in the same order on the rows that count; a LAST row is masked
        there and here), in about 25 tensor operations fewer: a DQN update on CartPole's small
        network is mostly Python dispatch, not arithmetic."""
        q_rows = self.q_network(exp.observation[:, 0])
        q = q_rows.gather(-1, exp.action[:, :1]).squeeze(-1)                           # [B]
        with torch.no_grad():
            next_obs = exp.observation[:, 1]
            q_target_next = self.target_q_network(next_obs)
            chooser = self.q_network(next_obs) if self.config.double_q else q_target_next
            target, valid = self._one_step_target(exp, q_target_next, chooser)
        return AlgStep(info={"exp": exp, "q_rows": q[:, None], "one_step": (q, target, valid)})

    def _one_step_target(self, exp: Experience, q_target_next: torch.Tensor,
                         chooser: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(td_target, valid)`` of row 0: the target network's value of the action the
        ``chooser``'s values pick, and 0 where row 0 is LAST (nothing to learn across)."""
        target_next = q_target_next.gather(-1, chooser.argmax(-1, keepdim=True)).squeeze(-1)
        target = exp.reward[:, 1] + (exp.discount[:, 1] * self.td_loss.gamma) * target_next
        return target, (exp.step_type[:, 0] != StepType.LAST).float()

    def _by_hand_networks(self) -> tuple[ReluMlp, ReluMlp] | None:
        """The online and target networks as :class:`ReluMlp` where the one-step update can
        run without autograd: ReLU MLPs whose layers are all the Q network's parameters,
        float32 updates, a loss whose slope is written out below. None otherwise."""
        if self.precision != "float32" or self.td_loss.td_error_loss_fn not in _LOSS_SLOPES:
            return None
        online, target = ReluMlp.of(self.q_network), ReluMlp.of(self.target_q_network)
        if online is None or target is None or \
                {id(p) for p in online.parameters()} != {id(p) for p in self.q_network.parameters()}:
            return None
        return online, target

    def _update(self, exp: Experience, w: torch.Tensor | None) -> TrainResult:
        if self._by_hand is not None and one_step_window(self.td_loss, exp):
            return self._one_step_update_by_hand(exp, w)
        return super()._update(exp, w)

    @torch.no_grad()
    def _one_step_update_by_hand(self, exp: Experience, w: torch.Tensor | None) -> TrainResult:
        """:meth:`_one_step_train_step`, :meth:`calc_loss` and the gradient step in one, with
        the gradient written out (:mod:`algorithms.mlp_backprop`): the same update up to
        float rounding, in fewer and cheaper operations. The online network runs once on
        ``s`` and ``s'`` together; the gradient flows through the rows of ``s`` only. The
        gradients land in one flat tensor, so clipping is one norm and one rescaling; the
        loss is computed only when the metrics are read."""
        online, target_net = self._by_hand
        B = exp.step_type.shape[0]
        action = exp.action[:, :1]
        obs, next_obs = exp.observation[:, 0], exp.observation[:, 1]
        q_both, inputs = online.forward(torch.cat([obs, next_obs]) if self.config.double_q else obs)
        q = q_both[:B].gather(-1, action).squeeze(-1)                                   # [B]
        q_target_next = target_net.forward(next_obs)[0]
        target, valid = self._one_step_target(
            exp, q_target_next, q_both[B:] if self.config.double_q else q_target_next)
        error = (q - target).mul_(valid)  # 0 where row 0 is LAST
        # d(mean of w * loss)/dq, per sample, placed at the action taken.
        slope = _LOSS_SLOPES[self.td_loss.td_error_loss_fn](error)
        slope = slope.mul_(1.0 / B) if w is None else slope.mul_(w / B)
        grad_q = torch.zeros_like(q_both[:B]).scatter_(-1, action, slope.unsqueeze(-1))
        online.backward(inputs, grad_q)
        self._step_optimizers(gradients=online.gradients())
        self.after_update()
        return TrainResult(LazyMetrics(self._by_hand_metrics(q, target, valid, w)),
                           error.abs().cpu())

    def _by_hand_metrics(self, q, target, valid, w) -> Callable[[], dict[str, float]]:
        """The metrics of :meth:`_loss_info` for a by-hand update, computed when read."""
        epsilon = self.epsilon() if self.env_steps else None

        def compute() -> dict[str, float]:
            loss = get_td_error_loss_fn(self.td_loss.td_error_loss_fn)(target, q) * valid
            extra = {"loss/total": importance_weighted_mean(loss, w), "loss/td": loss,
                     "q/mean": q}
            if epsilon is not None:
                extra["epsilon"] = epsilon
            return _scalars(extra)

        return compute

    def calc_loss(self, info) -> LossInfo:
        exp = info["exp"]
        if "one_step" in info:
            q, target, valid = info["one_step"]
            loss = get_td_error_loss_fn(self.td_loss.td_error_loss_fn)(target, q) * valid
            td_error = (target - q) * valid
            return self._loss_info(loss, td_error, info["q_rows"])
        tm = lambda x: x.transpose(0, 1)  # noqa: E731  [B, T] -> [T, B]
        li = self.td_loss(tm(exp.step_type), tm(exp.reward), tm(exp.discount), tm(info["q"]),
                          tm(info["target_value"]))
        T = exp.step_type.shape[1]
        per_sample = li.loss.sum(0) / (T - 1)
        return self._loss_info(per_sample, li.extra["td_error"][0], info["q_rows"])

    def _loss_info(self, per_sample, td_error, q_rows) -> LossInfo:
        extra = {"loss/td": per_sample.detach(), "q/mean": q_rows.detach()}
        if self.env_steps:  # a graph's learner never acts: its epsilon would read 1.0
            extra["epsilon"] = self.epsilon()
        return LossInfo(loss=per_sample, priority=td_error.abs().detach(), extra=extra)

    def after_update(self, info=None) -> None:
        if self.num_updates % self.config.target_update_period == 0:
            self._soft_update(self.target_q_network, self.q_network,
                              self.config.target_update_tau)


# d loss(target, q) / dq of each named TD loss, as a function of ``q - target``
# (algorithms.losses: Huber with delta 1, and the squared error).
_LOSS_SLOPES = {"huber": lambda e: e.clamp(-1.0, 1.0), "squared": lambda e: 2.0 * e}
