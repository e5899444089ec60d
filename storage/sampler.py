"""Sampler: which slots may start a sampled sequence, and how likely each is.

The sampler keeps two things apart that ALF mixes in one tree:

* the *learned priority* of every slot (``priority``), set by ``update_priority`` and
  kept across changes of ``batch_length``, checkpoints and evictions;
* the *sampling mask*: a slot may start a sequence of ``batch_length`` steps only if all
  those steps are stored, it is past the ``num_earliest_frames_ignored`` first stored
  steps, and no control evicted it.

The sum tree's leaf for a slot is ``mask * (priority + epsilon) ** alpha`` (just
``mask`` for uniform sampling), so uniform and prioritized sampling, eviction, windows
(recent data, ``sample_range``, ERE) and environments holding fewer than
``batch_length`` steps all go through one exact mechanism.

On a CPU (numba trees, the default) each event (a priority update, a write, a draw,
the weights of a draw) is one compiled kernel from ``_sampler_kernels`` over numpy views
of the same tensors; the array code below is the path for CUDA and for torch trees. The
model tests run both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from storage.allocator import MemoryAllocator
from storage.ring import host_array
from storage.segment_tree import MaxSegmentTree, MinSegmentTree, SumSegmentTree

try:  # numba is a dependency; without it (a broken install) the numpy path runs.
    from storage import _sampler_kernels
except ImportError:  # pragma: no cover - exercised where numba is absent
    _sampler_kernels = None

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
    x = host_array(x)
    if not isinstance(x, np.ndarray):
        x = np.asarray(x)
    if x.ndim != 1:
        x = x.reshape(-1)
    if x.dtype not in dtypes:
        x = x.astype(dtypes[0])
    return x


# ALF's bound that keeps stratified draws strictly below 1 in float32.
ONE_MINUS = 1.0 - torch.finfo(torch.float32).eps


@dataclass(frozen=True)
class PER:
    """Proportional prioritization (Schaul et al.; pytorchrl's PERBuffer).

    A slot's sampling weight is ``(priority + epsilon) ** alpha``. With ``beta`` set,
    ``BatchInfo.importance_weights`` become ``(N * P(i)) ** -beta`` divided by their
    largest possible value; with ``beta=None`` they keep ALF's meaning (``N * P(i)``,
    i.e. weight over the mean non-zero weight) and the learner applies ``-beta`` itself.
    """

    alpha: float = 1.0
    beta: float | None = None
    epsilon: float = 0.0


class SlotSampler:
    """Sampling over the slots of a ``RingWriter``'s rings (see module docstring)."""

    def __init__(
        self,
        writer,
        prioritized: bool = False,
        per: PER | None = None,
        initial_priority: float = 1.0,
        num_earliest_frames_ignored: int = 0,
        allocator=None,
        device="cpu",
        tree_backend: str | None = None,
    ):
        allocator = allocator or MemoryAllocator(device)
        self.writer = writer
        self.prioritized = prioritized
        self.per = per or PER()
        self.device = torch.device(device)
        self._initial_priority = float(initial_priority)
        self.num_earliest_frames_ignored = int(num_earliest_frames_ignored)
        self.num_envs = writer.num_envs
        self.max_length = writer.max_length
        num_slots = self.num_envs * self.max_length
        self.num_slots = num_slots
        self.priority = allocator.tensor("sampler.priority", (num_slots,), torch.float64)
        self.evicted = allocator.tensor("sampler.evicted", (num_slots,), torch.bool, False)
        self._batch_length = allocator.tensor("sampler.batch_length", (1,), torch.int64, 1)
        self.sum_tree = SumSegmentTree(num_slots, device=self.device, backend=tree_backend)
        self.max_tree = (
            MaxSegmentTree(num_slots, device=self.device, backend=tree_backend)
            if prioritized
            else None
        )
        self.min_tree = (
            MinSegmentTree(num_slots, device=self.device, backend=tree_backend)
            if prioritized and self.per.beta is not None
            else None
        )
        self._bind_arrays()
        self.rebuild()

    # ----------------------------------------------------------------- arrays
    # The bookkeeping below is a few dozen element-wise operations on small index
    # batches. On a CPU they run on numpy views of the same tensors (about a
    # microsecond per operation instead of several for torch); elsewhere on torch.
    # Both libraries share the operator syntax used here, and ``xp`` names the other.
    def _bind_arrays(self) -> None:
        on_cpu = self.device.type == "cpu"
        self.xp = np if on_cpu else torch
        view = (lambda t: t.numpy()) if on_cpu else (lambda t: t)
        self._cur = view(self.writer.current_pos)
        self._size = view(self.writer.current_size)
        self._evicted = view(self.evicted)
        self._priority = view(self.priority)
        self._device_kw = {} if on_cpu else {"device": self.device}
        # The fused kernels need every tree on the numba backend (the default on a CPU).
        trees = [t for t in (self.sum_tree, self.max_tree, self.min_tree) if t is not None]
        self._fused = _sampler_kernels is not None and all(
            t.backend == "numba" and t.fanout & (t.fanout - 1) == 0 for t in trees
        )
        if self._fused:
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
            self._sync_params()

    @property
    def fused(self) -> bool:
        """Whether batches of events run as single numba kernels (CPU, numba trees)."""
        return self._fused

    def _sync_params(self) -> None:
        if self._fused:
            self._params[:] = (
                self.max_length,
                self.batch_length,
                self.num_earliest_frames_ignored,
                self.prioritized,
            )

    def _arr(self, t):
        """A caller's tensor as this sampler's array type (zero-copy on CPU)."""
        if self.xp is np:
            return t.numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
        return torch.as_tensor(t, device=self.device)

    def _tensor(self, a):
        return torch.from_numpy(np.ascontiguousarray(a)) if self.xp is np else a

    # ----------------------------------------------------------------- weights
    @property
    def batch_length(self) -> int:
        return int(self._batch_length[0])

    @property
    def initial_priority(self) -> float:
        """Priority for new data: the larger of the configured one and the current max."""
        if self.max_tree is None:
            return self._initial_priority
        return max(self._initial_priority, self.max_tree.total())

    def _start_valid(self, env_ids, pos):
        """Whether (env, pos) may start a sequence of ``batch_length`` steps now."""
        current = self._cur[env_ids]
        earliest = current - self._size[env_ids]
        slots = env_ids * self.max_length + pos % self.max_length
        valid = (pos >= earliest + self.num_earliest_frames_ignored) & (
            pos + self.batch_length <= current
        )
        return valid & ~self._evicted[slots], slots

    def _weights(self, valid, slots):
        xp = self.xp
        if not self.prioritized:
            return valid * 1.0
        base = self._priority[slots] + self.per.epsilon
        if self.per.alpha != 1.0:
            base = base**self.per.alpha
        return xp.where(valid, base, 0.0 * base)

    def _set_leaves(self, slots, weights):
        self.sum_tree[slots] = weights
        if self.min_tree is not None:
            self.min_tree[slots] = self.xp.where(weights > 0, weights, weights * 0 + float("inf"))

    def _refresh(self, env_ids, pos) -> None:
        current = self._cur[env_ids]
        stored = (pos >= current - self._size[env_ids]) & (pos < current)
        env_ids, pos = env_ids[stored], pos[stored]
        valid, slots = self._start_valid(env_ids, pos)
        self._set_leaves(slots, self._weights(valid, slots))

    def refresh(self, env_ids, pos) -> None:
        """Recompute the leaves of (env, pos) pairs that are stored now."""
        if self._fused:
            _sampler_kernels.refresh(
                _host_vector(env_ids, _INDEX_DTYPES),
                _host_vector(pos, _INDEX_DTYPES),
                *self._kernel_state,
            )
            return
        self._refresh(self._arr(env_ids), self._arr(pos))

    def rebuild(self) -> None:
        """Recompute every leaf from the writer, priorities and evictions (O(slots))."""
        if self._fused:
            sums = np.empty(self.num_slots)
            maxes = np.empty(self.num_slots if self.max_tree else 0)
            mins = np.empty(self.num_slots if self.min_tree else 0)
            _sampler_kernels.all_leaves(*self._kernel_state[:6], sums, maxes, mins)
            self.sum_tree.fill(torch.from_numpy(sums))
            if self.max_tree is not None:
                self.max_tree.fill(torch.from_numpy(maxes))
            if self.min_tree is not None:
                self.min_tree.fill(torch.from_numpy(mins))
            return
        env_ids = torch.arange(self.num_envs, device=self.device).repeat_interleave(self.max_length)
        idx = torch.arange(self.max_length, device=self.device).repeat(self.num_envs)
        pos = self.writer.position_of_slot(env_ids, idx)
        current = self.writer.current_pos[env_ids]
        stored = pos >= current - self.writer.current_size[env_ids]
        valid, slots = self._start_valid(self._arr(env_ids), self._arr(pos))
        weights = self._tensor(self._weights(valid & self._arr(stored), slots))
        self.sum_tree.fill(weights)
        if self.max_tree is not None:
            self.max_tree.fill(torch.where(stored, self.priority, torch.zeros_like(self.priority)))
        if self.min_tree is not None:
            self.min_tree.fill(
                torch.where(weights > 0, weights, torch.full_like(weights, float("inf")))
            )

    def set_batch_length(self, batch_length: int) -> None:
        if batch_length < 1:
            raise ValueError(f"batch_length must be positive, got {batch_length}")
        if batch_length != self.batch_length:
            self._batch_length[0] = batch_length
            self._sync_params()
            self.rebuild()

    # ----------------------------------------------------------------- events
    def on_write(self, env_ids, pos) -> None:
        """New steps at (env, pos): fresh priority, and the starts whose validity moved."""
        if self._fused:
            _sampler_kernels.on_write(
                _host_vector(env_ids, _INDEX_DTYPES),
                _host_vector(pos, _INDEX_DTYPES),
                *self._kernel_state,
            )
            return
        xp = self.xp
        env_ids, pos = self._arr(env_ids), self._arr(pos)
        slots = env_ids * self.max_length + pos % self.max_length
        self._evicted[slots] = False
        if self.prioritized:
            priority = self.initial_priority
            self._priority[slots] = priority
            self.max_tree[slots] = priority
        length = self.batch_length
        earliest = self._cur[env_ids] - self._size[env_ids]
        # The new step itself (valid when batch_length is 1), the start whose sequence
        # it completes, and the start that fell out of the ignored-earliest window.
        cat = np.concatenate if xp is np else torch.cat
        cand_env = cat([env_ids, env_ids, env_ids])
        cand_pos = cat([pos, pos - length + 1, earliest + self.num_earliest_frames_ignored - 1])
        self._refresh(cand_env, cand_pos)

    def update_priority(self, env_ids, positions, priorities) -> torch.Tensor:
        """Set learned priorities; returns the mask of updates applied.

        Positions already overwritten are ignored (the learner answered late); positions
        never written are an error.
        """
        if self._fused:
            return self._update_priority_fused(env_ids, positions, priorities)
        env_ids, positions = self._arr(env_ids), self._arr(positions)
        priorities = self._arr(priorities)
        current = self._cur[env_ids]
        if bool((positions >= current).any()):
            raise ValueError("update_priority for positions that were never written")
        if not (bool((priorities >= 0).all()) and bool((priorities < float("inf")).all())):
            raise ValueError("priorities must be finite and >= 0")
        live = positions >= current - self._size[env_ids]
        env_ids, positions = env_ids[live], positions[live]
        slots = env_ids * self.max_length + positions % self.max_length
        values = priorities[live] * 1.0
        self._priority[slots] = values
        if self.max_tree is not None:
            self.max_tree[slots] = values
        self._refresh(env_ids, positions)
        return self._tensor(live)

    def _update_priority_fused(self, env_ids, positions, priorities) -> torch.Tensor:
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

    def evict(self, slots) -> None:
        """Stop ``slots`` from being sampled until they are written again."""
        slots = self._arr(slots)
        if slots.shape[0] == 0:
            return
        self._evicted[slots] = True
        self._set_leaves(slots, slots * 0.0)

    def clear(self, env_ids) -> None:
        """Forget priorities and evictions of ``env_ids`` (the writer was cleared too)."""
        slots = (
            env_ids[:, None] * self.max_length + torch.arange(self.max_length, device=self.device)
        ).reshape(-1)
        self.priority[slots] = 0.0
        self.evicted[slots] = False
        self._set_leaves(self._arr(slots), self._arr(slots) * 0.0)
        if self.max_tree is not None:
            self.max_tree[slots] = 0.0

    # ----------------------------------------------------------------- sampling
    def num_valid(self) -> int:
        return self.sum_tree.nnz

    def sample(self, n: int, generator, with_replacement: bool):
        """``n`` slots drawn by leaf weight; stratified (sorted, spread) without replacement."""
        total = self.sum_tree.total()
        if n == 0:
            return torch.zeros(0, dtype=torch.int64, device=self.device)
        if not total > 0:
            raise ValueError(
                "nothing to sample: no environment holds a full sequence of "
                f"batch_length={self.batch_length} steps"
            )
        u = self._arr(torch.rand(n, generator=generator, dtype=torch.float64, device=self.device))
        if self._fused:
            out = np.empty(n, dtype=np.int64)
            args = (u, not with_replacement, self._sum_values, self._layout, out)
            if _sampler_kernels.sample_slots(*args) != 0:
                self.sum_tree.resum()  # see SumSegmentTree.find_host
                if _sampler_kernels.sample_slots(*args) != 0:
                    raise RuntimeError("inconsistent sum tree after an exact re-sum")
            return torch.from_numpy(out)
        if not with_replacement:
            arange = np.arange if self.xp is np else torch.arange
            u = (u + arange(n, dtype=u.dtype, **self._device_kw)) / n
            u = self.xp.minimum(u, u * 0 + ONE_MINUS)
        return self.sum_tree.find_sum_bound(self._tensor(u * total))

    def sample_in_windows(self, n: int, generator, lo, hi):
        """``n`` slots by leaf weight among starts ``lo[e] <= pos < hi[e]`` of each env.

        Windows are cut into at most two runs of consecutive slots per environment (the
        ring may wrap); a run is chosen by its mass, then a leaf inside it by weight.
        """
        envs = torch.arange(self.num_envs, device=self.device)
        lo = torch.maximum(lo, self.writer.earliest(envs))
        hi = torch.minimum(hi, self.writer.current_pos)
        hi = torch.maximum(hi, lo)
        length = self.max_length
        start_idx = lo % length
        count = hi - lo
        first_len = torch.minimum(count, length - start_idx)
        seg_start = torch.cat([envs * length + start_idx, envs * length])
        seg_len = torch.cat([first_len, count - first_len])
        before = self.sum_tree.prefix_sum(seg_start)
        mass = (self.sum_tree.prefix_sum(seg_start + seg_len) - before).clamp(min=0.0)
        mass = torch.where(seg_len > 0, mass, torch.zeros_like(mass))
        cumulative = torch.cumsum(mass, 0)
        window_total = float(cumulative[-1])
        if not window_total > 0:
            raise ValueError("nothing to sample in the requested window")
        out = torch.empty(n, dtype=torch.int64, device=self.device)
        todo = torch.arange(n, device=self.device)
        for _ in range(8):
            u = torch.rand(
                todo.numel(), generator=generator, dtype=torch.float64, device=self.device
            )
            u = u * window_total
            seg = torch.searchsorted(cumulative, u, right=True).clamp(max=mass.numel() - 1)
            inside = u - (cumulative[seg] - mass[seg])
            t = (before[seg] + inside).clamp(max=self.sum_tree.total())
            found = self.sum_tree.find_sum_bound(t)
            ok = (found >= seg_start[seg]) & (found < seg_start[seg] + seg_len[seg])
            out[todo[ok]] = found[ok]
            todo = todo[~ok]
            if todo.numel() == 0:
                return out
        raise RuntimeError("window sampling kept landing outside its window")

    def locate(self, slots):
        """``(env_ids, ring indices, positions)`` of slots (numpy on CPU, else tensors)."""
        if self._fused:
            n = slots.shape[0]
            env_ids, idx, positions = (np.empty(n, dtype=np.int64) for _ in range(3))
            _sampler_kernels.locate(slots, self._cur, self.max_length, env_ids, idx, positions)
            return env_ids, idx, positions
        length = self.max_length
        env_ids, idx = slots // length, slots % length
        current = self._cur[env_ids]
        return env_ids, idx, ((current - idx - 1) // length) * length + idx

    def importance_weights(self, slots) -> torch.Tensor:
        """ALF's ``N * P(i)`` (leaf over mean non-zero leaf), or PER's with ``beta``."""
        if not self.prioritized:
            return torch.ones(slots.shape, dtype=torch.float32, device=self.device)
        if self._fused:
            out = np.empty(slots.shape[0], dtype=np.float32)
            beta = self.per.beta
            _sampler_kernels.importance_weights(
                _host_vector(slots, _INDEX_DTYPES),
                self._sum_values,
                self.sum_tree.nnz,
                self.min_tree.total() if beta is not None else 1.0,
                beta if beta is not None else math.nan,
                out,
            )
            return torch.from_numpy(out)
        total = self.sum_tree.total()
        nnz = self.sum_tree.nnz
        leaf = self.sum_tree.leaves()[slots]  # slots came from this tree: no range check
        ratio = leaf * (nnz / total)
        if self.per.beta is None:
            return ratio.to(torch.float32)
        smallest = self.min_tree.total() * (nnz / total)
        return ((ratio / smallest) ** (-self.per.beta)).to(torch.float32)

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict:
        # The trees are rebuilt from these on load; re-summing ours now makes both hold
        # the same nodes, so the restored buffer samples exactly like this one from here.
        self.sum_tree.resum()
        return {
            "priority": self.priority.clone(),
            "evicted": self.evicted.clone(),
            "batch_length": self.batch_length,
        }

    def load_state_dict(self, state: dict) -> None:
        self.priority.copy_(state["priority"])
        self.evicted.copy_(state["evicted"])
        self._batch_length[0] = int(state["batch_length"])
        self._sync_params()
        self.rebuild()
