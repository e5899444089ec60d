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

``SlotSampler`` here is the reference path (numpy views on a CPU, torch elsewhere;
CUDA and torch trees use it). ``FusedSlotSampler`` (``fused_sampler.py``) runs each
event (a priority update, a write, a draw, the weights of a draw) as one compiled numba
kernel over the same arrays. ``storage.backend`` picks one at construction; the model
tests run both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from storage import arrays
from storage.allocator import MemoryAllocator
from storage.segment_tree import MaxSegmentTree, MinSegmentTree, SumSegmentTree

# ALF's bound that keeps stratified draws strictly below 1 in float32.
ONE_MINUS = 1.0 - torch.finfo(torch.float32).eps


class NothingToSample(ValueError):
    """No slot may start a sequence now (too little data, or all of it evicted): a
    caller that can wait for more data should."""


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
        self.beta = self.per.beta  # the current IS exponent (a BetaSchedule moves it)
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
    # numpy views on a CPU, the tensors elsewhere (storage.arrays); ``xp`` names the library.
    def _bind_arrays(self) -> None:
        on_cpu = arrays.numpy_views(self.device)
        self.xp = np if on_cpu else torch
        view = (lambda t: t.numpy()) if on_cpu else (lambda t: t)
        self._cur = view(self.writer.current_pos)
        self._size = view(self.writer.current_size)
        self._evicted = view(self.evicted)
        self._priority = view(self.priority)
        self._device_kw = {} if on_cpu else {"device": self.device}

    def _params_changed(self) -> None:
        """Hook: ``batch_length`` changed (the fused sampler mirrors it for its kernels)."""

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
        self._refresh(self._arr(env_ids), self._arr(pos))

    def rebuild(self) -> None:
        """Recompute every leaf from the writer, priorities and evictions (O(slots))."""
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
            self._params_changed()
            self.rebuild()

    def set_beta(self, beta: float) -> None:
        """Change the IS exponent (needs a ``PER`` built with a ``beta``: the min tree)."""
        if self.min_tree is None:
            raise ValueError("set_beta needs prioritized sampling with PER(beta=...)")
        self.beta = float(beta)

    # ----------------------------------------------------------------- events
    def prepare(self, slots) -> None:
        """Slots about to be committed: no eviction, the initial priority. Done before the
        writer commits, so a buffer re-attached after a kill between the two (its trees
        rebuilt from these arrays) never inherits the overwritten step's eviction or
        priority; ``on_write`` sets both again with the trees."""
        slots = self._arr(slots)
        self._evicted[slots] = False
        if self.prioritized:
            self._priority[slots] = self.initial_priority

    def on_write(self, env_ids, pos) -> None:
        """New steps at (env, pos): fresh priority, and the starts whose validity moved."""
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
        env_ids = torch.as_tensor(env_ids, dtype=torch.int64, device=self.device).reshape(-1)
        positions = torch.as_tensor(positions, dtype=torch.int64, device=self.device).reshape(-1)
        # The priority array's float64: numpy casts on assignment, torch's index_put does not.
        priorities = torch.as_tensor(priorities, dtype=self.priority.dtype,
                                     device=self.device).reshape(-1)
        if not env_ids.shape == positions.shape == priorities.shape:
            raise ValueError("env_ids, positions and priorities must have one shape")
        if env_ids.numel() and bool((env_ids.min() < 0) | (env_ids.max() >= self.num_envs)):
            raise IndexError(f"env_ids must lie in [0, {self.num_envs})")
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
            raise NothingToSample(
                "nothing to sample: no environment holds a full sequence of "
                f"batch_length={self.batch_length} steps"
            )
        u = self._arr(torch.rand(n, generator=generator, dtype=torch.float64, device=self.device))
        return self._draw(u, total, with_replacement)

    def _draw(self, u, total: float, with_replacement: bool):
        """Slots for uniform numbers ``u`` in [0, 1) (stratified without replacement)."""
        if not with_replacement:
            n = u.shape[0]
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
            raise NothingToSample("nothing to sample in the requested window")
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
        length = self.max_length
        env_ids, idx = slots // length, slots % length
        current = self._cur[env_ids]
        return env_ids, idx, ((current - idx - 1) // length) * length + idx

    def importance_weights(self, slots) -> torch.Tensor:
        """ALF's ``N * P(i)`` (leaf over mean non-zero leaf), or PER's with ``beta``."""
        if not self.prioritized:
            return torch.ones(slots.shape, dtype=torch.float32, device=self.device)
        total = self.sum_tree.total()
        nnz = self.sum_tree.nnz
        leaf = self.sum_tree.leaves()[slots]  # slots came from this tree: no range check
        ratio = leaf * (nnz / total)
        if self.beta is None:
            return ratio.to(torch.float32)
        smallest = self.min_tree.total() * (nnz / total)
        return ((ratio / smallest) ** (-self.beta)).to(torch.float32)

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
        self._params_changed()
        self.rebuild()
