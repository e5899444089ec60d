"""``FusedSlotSampler``: the ``SlotSampler`` whose events are single numba kernels (CPU).

Same semantics as the reference ``SlotSampler`` (the model tests compare them), on the
same arrays: each event (a write, a priority update, a draw, the weights of a draw) is
one call into ``_sampler_kernels`` over numpy views of the writer's and sampler's
tensors and the trees' arrays, instead of a few dozen numpy operations of about a
microsecond each. ``storage.backend`` chooses it once, when every tree runs on numba.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from storage import _sampler_kernels
from storage.ring import host_array
from storage.sampler import SlotSampler

# Element types the kernels take as they are (anything else is converted first).
_INDEX_DTYPES = (np.dtype(np.int64),)
_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_INDEX_TYPES = (torch.int64,)
_FLOAT_TYPES = (torch.float32, torch.float64)


def _flat_cpu(x, dtypes) -> bool:
    """Whether ``x`` is a contiguous CPU tensor of one of ``dtypes`` (a kernel can read
    its memory by address)."""
    return type(x) is torch.Tensor and x.dtype in dtypes and x.is_cpu and x.is_contiguous()


def _host_vector(x, dtypes) -> np.ndarray:
    """A 1-D numpy array of ``x`` in one of ``dtypes`` (zero-copy for a CPU tensor)."""
    if type(x) is np.ndarray and x.ndim == 1 and x.dtype is dtypes[0]:
        return x  # the common case (the writer's own arrays), checked cheaply
    x = host_array(x)
    if not isinstance(x, np.ndarray):
        x = np.asarray(x)
    if x.ndim != 1:
        x = x.reshape(-1)
    if x.dtype not in dtypes:
        x = x.astype(dtypes[0])
    return x


class FusedSlotSampler(SlotSampler):
    """``SlotSampler`` on numba kernels; needs a CPU and numba trees of power-of-2 fanout."""

    def _bind_arrays(self) -> None:
        super()._bind_arrays()
        trees = [t for t in (self.sum_tree, self.max_tree, self.min_tree) if t is not None]
        if self.device.type != "cpu" or not all(
            t.backend == "numba" and t.fanout & (t.fanout - 1) == 0 for t in trees
        ):
            raise ValueError("the fused sampler needs a CPU and numba trees")
        none = np.zeros(0)
        self._params = np.zeros(4, dtype=np.int64)
        self._per = np.array([self.per.alpha, self.per.epsilon, self._initial_priority])
        self._sum_values, self._layout, sum_state = self.sum_tree.kernel_arrays()
        # Every kernel's arguments after its event batch (see _sampler_kernels).
        self._kernel_state = (
            self._cur,
            self._size,
            self._evicted,
            self._priority,
            self._params,
            self._per,
            self._sum_values,
            self._layout,
            sum_state,
            self.max_tree.kernel_arrays()[0] if self.max_tree else none,
            self.min_tree.kernel_arrays()[0] if self.min_tree else none,
        )
        self._params_changed()

    def _params_changed(self) -> None:
        self._params[:] = (
            self.max_length,
            self.batch_length,
            self.num_earliest_frames_ignored,
            self.prioritized,
        )

    def refresh(self, env_ids, pos) -> None:
        _sampler_kernels.refresh(
            _host_vector(env_ids, _INDEX_DTYPES),
            _host_vector(pos, _INDEX_DTYPES),
            *self._kernel_state,
        )

    def rebuild(self) -> None:
        sums = np.empty(self.num_slots)
        maxes = np.empty(self.num_slots if self.max_tree else 0)
        mins = np.empty(self.num_slots if self.min_tree else 0)
        _sampler_kernels.all_leaves(*self._kernel_state[:6], sums, maxes, mins)
        self.sum_tree.fill(torch.from_numpy(sums))
        if self.max_tree is not None:
            self.max_tree.fill(torch.from_numpy(maxes))
        if self.min_tree is not None:
            self.min_tree.fill(torch.from_numpy(mins))

    def on_write(self, env_ids, pos) -> None:
        _sampler_kernels.on_write(
            _host_vector(env_ids, _INDEX_DTYPES),
            _host_vector(pos, _INDEX_DTYPES),
            *self._kernel_state,
        )

    def update_priority(self, env_ids, positions, priorities) -> torch.Tensor:
        # Contiguous CPU tensors are read in place by address; anything else is converted.
        if (
            _flat_cpu(env_ids, _INDEX_TYPES)
            and _flat_cpu(positions, _INDEX_TYPES)
            and _flat_cpu(priorities, _FLOAT_TYPES)
        ):
            n = env_ids.numel()
            if not positions.numel() == priorities.numel() == n:
                raise ValueError("env_ids, positions and priorities must have one shape")
            live = np.empty(n, dtype=np.bool_)
            code = _sampler_kernels.update_priorities_at(
                env_ids.data_ptr(),
                positions.data_ptr(),
                priorities.data_ptr(),
                priorities.dtype is torch.float32,
                n,
                *self._kernel_state,
                live,
            )
        else:
            env_ids = _host_vector(env_ids, _INDEX_DTYPES)
            positions = _host_vector(positions, _INDEX_DTYPES)
            priorities = _host_vector(priorities, _FLOAT_DTYPES)
            if not env_ids.shape == positions.shape == priorities.shape:
                raise ValueError("env_ids, positions and priorities must have one shape")
            live = np.empty(env_ids.shape[0], dtype=np.bool_)
            code = _sampler_kernels.update_priorities(
                env_ids, positions, priorities, *self._kernel_state, live
            )
        if code == _sampler_kernels.BAD_ENV:
            raise IndexError(f"env_ids must lie in [0, {self.num_envs})")
        if code == _sampler_kernels.NOT_WRITTEN:
            raise ValueError("update_priority for positions that were never written")
        if code == _sampler_kernels.BAD_PRIORITY:
            raise ValueError("priorities must be finite and >= 0")
        return torch.from_numpy(live)

    def _draw(self, u, total: float, with_replacement: bool):
        out = np.empty(u.shape[0], dtype=np.int64)
        args = (u, not with_replacement, self._sum_values, self._layout, out)
        if _sampler_kernels.sample_slots(*args) != 0:
            self.sum_tree.resum()  # see SumSegmentTree.find_host
            if _sampler_kernels.sample_slots(*args) != 0:
                raise RuntimeError("inconsistent sum tree after an exact re-sum")
        return torch.from_numpy(out)

    def locate(self, slots):
        n = slots.shape[0]
        env_ids, idx, positions = (np.empty(n, dtype=np.int64) for _ in range(3))
        _sampler_kernels.locate(slots, self._cur, self.max_length, env_ids, idx, positions)
        return env_ids, idx, positions

    def importance_weights(self, slots) -> torch.Tensor:
        if not self.prioritized:
            return torch.ones(slots.shape, dtype=torch.float32)
        out = np.empty(slots.shape[0], dtype=np.float32)
        beta = self.beta
        _sampler_kernels.importance_weights(
            _host_vector(slots, _INDEX_DTYPES),
            self._sum_values,
            self.sum_tree.nnz,
            self.min_tree.total() if beta is not None else 1.0,
            beta if beta is not None else math.nan,
            out,
        )
        return torch.from_numpy(out)
