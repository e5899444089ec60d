"""The algorithm protocol (ALF's ``RLAlgorithm``, simplified) and its shared plumbing.

How the pieces are driven (one process or many)::

    alg = algorithms.make(DqnConfig(), obs_space, act_space, device="cpu")
    state = alg.get_initial_state(num_envs)
    # unroller / actor
    step = alg.rollout_step(time_step, state)      # step.output: actions [B]
    exp = make_experience(time_step, step)         # stored step t, goes to replay / trajectory
    # learner
    result = alg.train_on(batch, importance_weights)   # [B, T] off-policy or [T, B] on-policy
    replay.update_priorities(indices, result.priorities)
    params = alg.policy_params()                   # to unrollers and evaluators
    # evaluator
    alg.load_policy_state_dict(params); alg.predict_step(time_step, state).output

``train_on`` is ``train_step -> calc_loss -> update_with_gradient -> after_update``; an
algorithm may override it (PPO runs several epochs of mini-batches). ``train_in_stages`` is
the same update as a generator that pauses between stages (PPO's epochs), so a learner can
publish the parameters as they are mid-batch (:func:`train_staged` drives it to the end).
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from algorithms.data import (
    AlgStep,
    Experience,
    LazyMetrics,
    LossInfo,
    TimeStep,
    TrainResult,
    mini_batch_rows,
    to_tensor,
)
from algorithms.data_transformer import SequentialDataTransformer, from_configs
from algorithms.losses import importance_weighted_mean
from algorithms.optim import Optimizers
from algorithms.policy_pack import PolicyPack
from algorithms.precision import TrainingPrecision


def train_staged(stages: Generator[None, None, TrainResult]) -> TrainResult:
    """Run :meth:`RLAlgorithm.train_in_stages` to the end; its result."""
    while True:
        try:
            next(stages)
        except StopIteration as done:
            return done.value


class RLAlgorithm(nn.Module):
    """Base of every algorithm here (the only level of inheritance).

    Subclasses set ``_policy_modules`` (attribute names of the modules that
    ``predict_step``/``rollout_step`` need) and register their optimizers with
    ``_add_optimizer``; they implement ``predict_step``, ``rollout_step``, ``train_step`` and
    ``calc_loss``. The base holds the parts every algorithm uses: its training precision
    (:class:`~algorithms.precision.TrainingPrecision`), its optimizers
    (:class:`~algorithms.optim.Optimizers`) and its policy for the wire
    (:class:`~algorithms.policy_pack.PolicyPack`).
    """

    _policy_modules: tuple[str, ...] = ()

    @property
    def on_policy(self) -> bool:
        """Trains on whole ``[T, B]`` unrolls rather than replay samples: a fact of its config
        class, which the graph wires its nodes by before any algorithm is built."""
        return self.config.on_policy

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, config,
                 device: str | torch.device = "cpu"):
        """``config``: the algorithm's config (:mod:`algorithms.configs`), kept as
        ``self.config``. Read here: ``encoder``/``image_layout``, the observation encoder of
        every network (see :mod:`algorithms.encoders`); ``data_transformers``, transformer
        configs (or their ``{name: ...}`` mappings) or built ``DataTransformer`` modules,
        applied in order; ``precision`` (see :meth:`training_precision`); and
        ``max_grad_norm``."""
        super().__init__()
        self.config = config
        image_layout, data_transformers = config.image_layout, config.data_transformers
        self.observation_space = observation_space
        self.action_space = action_space
        self.device = torch.device(device)
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self._precision = TrainingPrecision(config.precision, self.device)
        self._optimizers = Optimizers(config.max_grad_norm)
        self._policy: PolicyPack | None = None  # made on first use
        # Keyword arguments every network of the algorithm takes.
        self.net_kwargs = {"encoder": config.encoder, "image_layout": image_layout}
        self.data_transformer: SequentialDataTransformer | None = None
        # A Dict observation always gets transformers: the concatenation that makes it the
        # vector every network takes (from_configs adds it when the config has none).
        if data_transformers or isinstance(observation_space, gym.spaces.Dict):
            if any(isinstance(t, dict) for t in data_transformers):  # {name: ...} mappings
                from algorithms.configs import parse_transformers

                data_transformers = parse_transformers(list(data_transformers))
            built = [t for t in data_transformers if isinstance(t, nn.Module)]
            if built and len(built) != len(data_transformers):
                raise TypeError("data_transformers: give all configs or all modules")
            self.data_transformer = (
                SequentialDataTransformer(built) if built else
                from_configs(data_transformers, observation_space, image_layout,
                             time_major=self.on_policy))
        # What the networks see: the observation after the transformers (a frame stack is
        # wider, a normalized observation is float).
        self.input_space = (self.data_transformer.transformed_space(observation_space)
                            if self.data_transformer is not None else observation_space)
        # Rows of a replay window that only give a frame stack its history.
        self.history_length = (self.data_transformer.history_length
                               if self.data_transformer is not None else 0)
        # Counters are buffers so they travel with state_dict() / checkpoints.
        self.register_buffer("train_steps", torch.zeros((), dtype=torch.int64))
        self.register_buffer("rollout_env_steps", torch.zeros((), dtype=torch.int64))
        # Python mirrors of the two counters: schedules read them every update and every step
        # without a device-to-host copy (refreshed by load_state_dict).
        self._num_updates = 0
        self._env_steps = 0

    # ----- construction helpers -------------------------------------------------------------
    def _add_optimizer(self, name: str, params, lr: float, **kwargs) -> None:
        """Declare an Adam optimizer over ``params``; it is built on first use (see
        :attr:`optimizers`)."""
        self._optimizers.add(name, params, lr, **kwargs)

    @property
    def precision(self) -> str:
        """The config's ``precision`` (see :meth:`training_precision`)."""
        return self._precision.name

    @property
    def optimizers(self) -> dict:
        """``{name: optimizer}``, built when first needed: a process that only acts (the
        unroller, the evaluator) never allocates their state."""
        return self._optimizers.by_name

    @property
    def num_updates(self) -> int:
        """Gradient updates made (``train_steps`` as a Python int)."""
        return self._num_updates

    @property
    def env_steps(self) -> int:
        """Env steps seen by ``rollout_step`` (``rollout_env_steps`` as a Python int)."""
        return self._env_steps

    def _count_env_steps(self, n: int) -> None:
        self.rollout_env_steps += n
        self._env_steps += n

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self._num_updates = int(self.train_steps)
        self._env_steps = int(self.rollout_env_steps)
        return result

    # ----- input conversion -----------------------------------------------------------------
    def _obs(self, x) -> torch.Tensor:
        """Observations on ``self.device``; uint8 and bool images stay as they are (the
        network's encoder scales them), other dtypes become float32. A dict observation
        (``Dict`` space) becomes a dict of such tensors, which the data transformers
        concatenate (:class:`~algorithms.data_transformer.ObservationConcat`)."""
        if isinstance(x, dict):
            return {key: self._obs(value) for key, value in x.items()}
        t = to_tensor(x, self.device)
        if t.dtype in (torch.uint8, torch.bool, torch.float32):
            return t
        return t.to(torch.float32)

    def transform_timestep(self, time_step: TimeStep, state=()) -> tuple[TimeStep, Any]:
        """The policy's view of a raw time step: tensors on ``self.device`` with the data
        transformers applied (statistics are not updated here). ``state``: the transformers'
        state, or ``()`` (a frame stacker then keeps the history per ``env_id``)."""
        ts = TimeStep(*(v if (isinstance(v, tuple) and v == ()) or isinstance(v, dict)
                        else to_tensor(v, self.device) for v in time_step))
        ts = ts._replace(observation=self._obs(ts.observation))
        if self.data_transformer is None:
            return ts, state
        return self.data_transformer.transform_timestep(ts, state)

    def _policy_input(self, time_step: TimeStep) -> torch.Tensor:
        """The observation ``predict_step``/``rollout_step`` feed to the networks."""
        if self.data_transformer is None:
            return self._obs(time_step.observation)
        return self.transform_timestep(time_step, ())[0].observation

    def _action_in(self, x) -> torch.Tensor:
        return to_tensor(x, self.device, torch.int64 if self.discrete else torch.float32)

    def _experience(self, exp: Experience) -> Experience:
        """Wire arrays -> tensors on ``self.device`` with the dtypes the losses expect, then
        the data transformers."""
        return self._transformed(self._experience_tensors(exp))

    def _transformed(self, exp: Experience) -> Experience:
        """``exp`` through the data transformers, which update their statistics here
        (training data only)."""
        if self.data_transformer is not None:
            exp = self.data_transformer.transform_experience(exp)
        return exp

    def _experience_tensors(self, exp: Experience) -> Experience:
        return Experience(
            step_type=to_tensor(exp.step_type, self.device, torch.int64),
            reward=to_tensor(exp.reward, self.device, torch.float32),
            discount=to_tensor(exp.discount, self.device, torch.float32),
            observation=self._obs(exp.observation),
            prev_action=(),
            # Kept where present: an on-policy frame stacker follows each env across unrolls.
            env_id=() if _empty(exp.env_id) else to_tensor(exp.env_id, self.device),
            action=self._action_in(exp.action),
            rollout_info={k: to_tensor(v, self.device) for k, v in (exp.rollout_info or {}).items()},
        )

    def training_precision(self) -> contextlib.AbstractContextManager:
        """The context an update's forward pass and loss run in
        (:class:`~algorithms.precision.TrainingPrecision`; the bfloat16 copies' gradients
        reach the float32 parameters in :meth:`_step_optimizers`)."""
        return self._precision.context(self)

    # ----- the step interface ---------------------------------------------------------------
    def get_initial_state(self, batch_size: int) -> Any:
        """Recurrent state for ``batch_size`` environments (``()``: feed-forward)."""
        return ()

    def predict_step(self, time_step: TimeStep, state=()) -> AlgStep:
        """Greedy action for evaluation; ``time_step`` fields ``[B, ...]``."""
        raise NotImplementedError

    def rollout_step(self, time_step: TimeStep, state=()) -> AlgStep:
        """Exploration action; ``info`` is the ``rollout_info`` dict stored with the step."""
        raise NotImplementedError

    def train_step(self, experience: Experience, state=()) -> AlgStep:
        """Forward pass on a training batch; returns ``AlgStep(info=...)`` for ``calc_loss``."""
        raise NotImplementedError

    def calc_loss(self, info) -> LossInfo:
        """Per-sample losses (``[B]``) and priorities from ``train_step``'s info."""
        raise NotImplementedError

    def update_with_gradient(self, loss_info: LossInfo,
                             importance_weights: torch.Tensor | None = None) -> float:
        """One gradient step of every optimizer on the importance-weighted mean loss."""
        return float(self._apply_gradient(loss_info, importance_weights))

    def _apply_gradient(self, loss_info: LossInfo,
                        importance_weights: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`update_with_gradient` without reading the loss back to the host.

        Gradient clipping is per optimizer (each group's own norm), as with separate
        optimizers; the step is one call for all of them."""
        loss = importance_weighted_mean(loss_info.loss, importance_weights)
        if isinstance(loss_info.scalar_loss, torch.Tensor):
            loss = loss + loss_info.scalar_loss
        self._zero_gradients()
        loss.backward()
        self._step_optimizers()
        return loss.detach()

    def _zero_gradients(self) -> None:
        """Before an update's backward passes."""
        self._optimizers.zero_grad()

    def _step_optimizers(self, gradients: torch.Tensor | None = None) -> None:
        """After an update's backward passes: gradients to the float32 parameters, clipping,
        one step of every optimizer (``gradients``: see :meth:`Optimizers.step`), the update
        counters."""
        self._precision.gradients_to_masters()
        self._optimizers.step(gradients)
        self.train_steps.add_(1)  # in place: ``+=`` also goes through Module.__setattr__, 3 µs
        self._num_updates += 1

    def after_update(self, info=None) -> None:
        """Post-update bookkeeping (target networks)."""

    def train_on(self, experience: Experience,
                 importance_weights: torch.Tensor | None = None) -> TrainResult:
        """One full update on one batch (``[B, T]`` for off-policy algorithms, ``[T, B]`` for
        on-policy ones); returns scalar metrics and per-sample priorities ``[B]`` or None."""
        return self._update(self._experience(experience),
                            self._importance_weights(importance_weights))

    def train_in_stages(self, experience: Experience, importance_weights=None
                        ) -> Generator[None, None, TrainResult]:
        """:meth:`train_on` as a generator that yields between the update's stages, each time
        the network is a consistent mid-batch policy, and returns the result. One stage (no
        yield) unless the algorithm has several: PPO's epochs."""
        return self.train_on(experience, importance_weights)
        yield  # noqa: B901 - makes this a generator that yields nothing

    def train_on_mini_batches(self, experience: Experience, mini_batch_size: int,
                              importance_weights: torch.Tensor | None = None
                              ) -> Iterator[TrainResult]:
        """:meth:`train_on` of each ``mini_batch_size`` rows of ``experience`` in turn (the
        mini-batches of one sample request), each result yielded before the next update, so
        what the caller does between updates (priorities, parameters) happens as it would
        after each ``train_on``. The batch becomes tensors once; the data transformers still
        see one mini-batch at a time, as their statistics would move update by update."""
        exp = self._experience_tensors(experience)
        w = self._importance_weights(importance_weights)
        for rows in mini_batch_rows(exp, mini_batch_size):
            yield self._update(self._transformed(exp.map(lambda x, rows=rows: x[rows])),
                               None if w is None else w[rows])

    def _importance_weights(self, importance_weights) -> torch.Tensor | None:
        return None if importance_weights is None else to_tensor(
            importance_weights, self.device, torch.float32)

    def _update(self, exp: Experience, w: torch.Tensor | None) -> TrainResult:
        """:meth:`train_on` on a batch already on the device and transformed."""
        with self.training_precision():
            info = self.train_step(exp).info
            loss_info = self.calc_loss(info)
        total = self._apply_gradient(loss_info, w)
        self.after_update(info)
        return self._train_result(total, loss_info.extra, loss_info.priority)

    @staticmethod
    def _train_result(total: torch.Tensor, extra: dict, priority) -> TrainResult:
        """What ``train_on`` returns: metrics read back only when asked for (one copy for
        all), priorities on the host."""
        metrics = LazyMetrics(lambda: _scalars({"loss/total": total, **extra}))
        return TrainResult(metrics, priority.detach().cpu()
                           if isinstance(priority, torch.Tensor) else None)

    # ----- parameters and checkpoints -------------------------------------------------------
    def _policy_module_names(self) -> tuple[str, ...]:
        if self.data_transformer is None:
            return self._policy_modules
        return (*self._policy_modules, "data_transformer")

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        """Flat ``{name: CPU tensor}`` of what ``predict_step``/``rollout_step`` need: the
        policy networks and the data transformers' statistics (``data_transformer.*``), so
        both travel together at one parameter version."""
        return self._policy_pack().state_dict()

    def policy_params(self) -> dict[str, Any]:
        """What ``predict_step``/``rollout_step`` need, as a learner publishes it: the tensors
        of :meth:`policy_state_dict`, packed into one flat copy per dtype
        (:mod:`algorithms.policy_pack`; far cheaper to take, send and load)."""
        return self._policy_pack().pack()

    def load_policy_state_dict(self, d: dict[str, Any]) -> None:
        """Load what ``policy_state_dict`` or ``policy_params`` exported (tensors or numpy
        arrays)."""
        self._policy_pack().load(d)

    def _policy_pack(self) -> PolicyPack:
        if self._policy is None:
            self._policy = PolicyPack({name: getattr(self, name)
                                       for name in self._policy_module_names()})
        return self._policy

    def checkpoint_state(self) -> dict[str, Any]:
        """Full state: networks, target networks, alpha, counters and optimizers; plain nested
        containers of tensors and numbers, loadable with ``torch.load(weights_only=True)``."""
        return {
            "module": {k: v.detach().cpu().clone() for k, v in self.state_dict().items()},
            # Optimizers never built (a process that only acts) have no state to keep.
            "optimizers": {k: _to_cpu(opt.state_dict())
                           for k, opt in self._optimizers.built.items()},
        }

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        self.load_state_dict(state["module"])
        for k, opt_state in state["optimizers"].items():
            self.optimizers[k].load_state_dict(opt_state)

    @staticmethod
    @torch.no_grad()
    def _soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
        """``target <- (1 - tau) * target + tau * source`` (parameters; buffers are copied),
        one foreach call for all tensors."""
        ts, ss = list(target.parameters()), list(source.parameters())
        if len(ts) != len(ss):
            raise ValueError("target and source have different parameters")
        if ts:
            torch._foreach_lerp_(ts, ss, tau)
        tb, sb = list(target.buffers()), list(source.buffers())
        if tb:
            torch._foreach_copy_(tb, sb)


def _empty(x) -> bool:
    return x is None or (isinstance(x, tuple) and x == ())


def _to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().clone()
    if isinstance(x, dict):
        return {k: _to_cpu(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return type(x)(_to_cpu(v) for v in x)
    return x


def _scalars(extra) -> dict[str, float]:
    """Mean of each tensor metric and the numbers as floats, with one device-to-host copy for
    all the tensors (not one per metric)."""
    out: dict[str, float] = {}
    keys, means = [], []
    for k, v in (extra or {}).items():
        if isinstance(v, torch.Tensor):
            keys.append(k)
            means.append(v.detach().float().mean())
        elif isinstance(v, int | float):
            out[k] = float(v)
    if means:
        out.update(zip(keys, torch.stack(means).tolist(), strict=True))
    return out
