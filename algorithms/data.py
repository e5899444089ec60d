"""ALF data conventions: step types, time steps, algorithm steps, losses, experience.

Shapes
------
* one step of a batch of environments: ``[B, ...]``
* an on-policy unroll (what ``unroll`` produces): time-major ``[T, B, ...]``
* an off-policy training batch (what a replay buffer's ``get_batch`` returns): batch-major
  ``[B, T, ...]``

Every method that takes a sequence says which of the two it expects.

Episode boundaries (Gymnasium 1.x vector envs with ``AutoresetMode.NEXT_STEP``)
------------------------------------------------------------------------------
The ``reward`` and ``discount`` of time step ``t`` belong to the transition that *arrived* at
``t``. The step on which an environment reports terminated/truncated is ``LAST`` and carries the
final observation; the next step is ``FIRST`` (reset observation, reward 0) and the action given
on the ``LAST`` step is ignored by the environment. Termination is ``LAST`` with discount 0;
truncation (time limit) is ``LAST`` with discount 1, so targets bootstrap from the final
observation. No multi-step target crosses ``LAST -> FIRST``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import torch

# Re-exported: the data conventions of the package are read from this module.
from algorithms.steps import StepType, TimeStep, flat_fields, nested_fields  # noqa: F401


class AlgStep(NamedTuple):
    """Output of ``predict_step``/``rollout_step``/``train_step``.

    output: the action (``[B, ...]``) for predict/rollout steps.
    state: recurrent state (``()`` for the feed-forward algorithms here).
    info: for ``rollout_step``, the ``rollout_info`` dict of tensors stored with the experience;
        for ``train_step``, whatever ``calc_loss`` needs.
    """

    output: Any = ()
    state: Any = ()
    info: Any = ()


class LossInfo(NamedTuple):
    """Result of ``calc_loss``.

    loss: per-sample loss, shape ``[B]`` (off-policy) or ``[T, B]`` (on-policy), not yet weighted.
    scalar_loss: an extra scalar loss added once (e.g. alpha loss); ``()`` if none.
    extra: dict of named per-sample or scalar terms for metrics.
    priority: per-sample priority ``[B]`` for prioritized replay, or ``()``.
    """

    loss: Any = ()
    scalar_loss: Any = ()
    extra: Any = ()
    priority: Any = ()


class Experience(NamedTuple):
    """One stored step: the time step at ``t``, the ``action`` taken at ``t`` and the
    ``rollout_info`` dict that ``rollout_step`` produced at ``t``.

    Fields are tensors (or numpy arrays on the wire) with a ``[B]`` step prefix, ``[T, B]`` for
    on-policy unrolls, or ``[B, T]`` for replay batches. ``to_dict``/``from_dict`` convert to a
    flat ``{name: array}`` mapping (``rollout_info.<key>`` for the info dict, and
    ``observation.<key>`` for a dict observation: :func:`algorithms.steps.flat_fields`).
    """

    step_type: Any = ()
    reward: Any = ()
    discount: Any = ()
    observation: Any = ()
    prev_action: Any = ()
    env_id: Any = ()
    action: Any = ()
    rollout_info: Any = ()

    @property
    def time_step(self) -> TimeStep:
        return TimeStep(self.step_type, self.reward, self.discount, self.observation,
                        self.prev_action, self.env_id)

    def to_dict(self) -> dict[str, Any]:
        """Flat mapping ``name -> tensor/array`` suitable for a wire message."""
        out = {f: getattr(self, f) for f in self._fields if f != "rollout_info"}
        for k, v in (self.rollout_info or {}).items():
            out[f"rollout_info.{k}"] = v
        return flat_fields(out)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Experience:
        """The inverse of :meth:`to_dict`. A key that is neither a field nor
        ``rollout_info.<key>`` is an error, never dropped unsaid (the learner sets the replay
        store's ``nstep.*``/``episode.*`` extras apart before, and says so)."""
        d = nested_fields(d)
        info = {k[len("rollout_info."):]: v for k, v in d.items() if k.startswith("rollout_info.")}
        fields = {f: d[f] for f in cls._fields if f in d and f != "rollout_info"}
        unknown = sorted(set(d) - set(fields) - {f"rollout_info.{k}" for k in info})
        if unknown:
            raise KeyError(f"Experience has no field {', '.join(map(repr, unknown))} (fields: "
                           f"{', '.join(cls._fields)}, rollout_info.<key>)")
        return cls(**fields, rollout_info=info)

    def map(self, fn) -> Experience:
        """Apply ``fn`` to every tensor (including those in ``rollout_info``); empty fields
        (``()``) stay empty."""
        return Experience.from_dict({k: v if isinstance(v, tuple) and v == () else fn(v)
                                     for k, v in self.to_dict().items()})


def mini_batch_rows(exp: Experience, size: int) -> list[slice]:
    """The rows of each consecutive ``size``-row mini-batch of a batch-major ``exp``."""
    rows = exp.step_type.shape[0]
    return [slice(first, min(first + size, rows)) for first in range(0, rows, size)]


def make_experience(time_step: TimeStep, alg_step: AlgStep) -> Experience:
    """Build the stored step ``t`` from the time step ``t`` and ``rollout_step``'s output."""
    return Experience(*time_step, action=alg_step.output, rollout_info=dict(alg_step.info or {}))


class LazyMetrics(Mapping):
    """Scalar metrics computed from an update's tensors when first read.

    Why: a learner reads them every few seconds and updates hundreds of times a second; reading
    them back (means, a stack, a host copy) on every update was ~5% of a small DQN update."""

    def __init__(self, compute: Callable[[], dict[str, float]]):
        self._compute: Callable[[], dict[str, float]] | None = compute
        self._values: dict[str, float] = {}

    def _get(self) -> dict[str, float]:
        if self._compute is not None:
            self._values, self._compute = self._compute(), None
        return self._values

    def __getitem__(self, key: str) -> float:
        return self._get()[key]

    def __iter__(self):
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __repr__(self) -> str:
        return repr(self._get())


class TrainResult(NamedTuple):
    """What ``train_on`` returns to the learner.

    metrics: scalar metrics, names namespaced (``loss/td``, ``alpha``, ...); a mapping that
        may compute them when first read (:class:`LazyMetrics`).
    priorities: per-sample priorities ``[B]`` (CPU tensor) for the replay buffer, or None.
    """

    metrics: Mapping[str, float]
    priorities: torch.Tensor | None = None


def to_tensor(x: Any, device: torch.device | str = "cpu", dtype: torch.dtype | None = None):
    """numpy array / scalar / tensor -> tensor on ``device`` (no copy when already there)."""
    if isinstance(x, torch.Tensor):
        return x.to(device=device, dtype=dtype or x.dtype)
    arr = np.asarray(x)
    if not arr.flags.writeable:  # a view of a received message: torch must not alias it
        arr = arr.copy()
    t = torch.from_numpy(arr) if arr.dtype != object else torch.as_tensor(arr)
    return t.to(device=device, dtype=dtype or t.dtype)
