"""Segment trees with ALF's interface on a wide, float64 layout.

ALF keeps a binary tree and walks it level by level from Python: twenty small torch ops
per update at 2^20 leaves, about 2 ms per call on a CPU. We keep ALF's interface
(``tree[indices] = values``, ``tree[indices]``, ``summary()``, ``find_sum_bound``,
``nnz``) on a ``fanout``-ary tree (16 by default, picked by measurement, see
``docs/benchmarks.md``): 2^20 leaves need five levels.

Layout: level 0 holds the leaves, level k+1 holds one node per row of ``fanout`` nodes of
level k; the top level is a single row of at most ``fanout`` nodes and the root is its
reduction. Leaves are padded (with the neutral element of the op) to a multiple of
``fanout ** (levels - 1)`` so every level divides into whole rows; that wastes less than
the capacity itself. A search scans the chosen node's children left to right, keeping a
running sum; a child without mass never makes that sum exceed the threshold, so a search
never stops on a zero leaf.

Two kernels drive the same layout:

* ``numba`` (CPU default): one compiled call per batch; sum trees are updated by deltas
  with exact re-sums that bound the rounding (see ``_tree_kernels``);
* ``torch`` (any device, CUDA's kernel; tested on CPU too): level by level, each parent
  recomputed from its children.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from storage import arrays

try:  # numba is a dependency; without it (a broken install) trees fall back to torch.
    from storage import _sum_batch_kernels, _tree_kernels
except ImportError:  # pragma: no cover - exercised where numba is absent
    _tree_kernels = _sum_batch_kernels = None

# Error codes below every real result (kernel results are changes in the non-zero count).
_BAD_SHAPE = -(2**62) + 2
_INT64 = np.dtype(np.int64)
_FLOAT64 = np.dtype(np.float64)

DEFAULT_FANOUT = 16
_OP_CODES = {"sum": 0, "min": 1, "max": 2}

_NEUTRAL = {"sum": 0.0, "min": math.inf, "max": -math.inf}
_OP_NAMES = {torch.add: "sum", torch.min: "min", torch.max: "max"}

BACKENDS = ("numba", "torch")


class SegmentTree:
    """A tree over ``capacity`` leaves (all zero at first) that keeps ``op`` of them.

    Args:
        capacity: number of leaves.
        op: ``"sum"``, ``"min"`` or ``"max"`` (ALF's ``torch.add``/``torch.min``/
            ``torch.max`` are accepted too).
        dtype: dtype of the values handed back by ``__getitem__`` and ``summary()``;
            nodes are float64 inside whatever this is.
        device: where the tree lives; CPU trees use the numba kernel.
        fanout: children per node.
        backend: ``"numba"`` or ``"torch"``; defaults by device (tests force ``"torch"``
            on CPU to exercise the CUDA code path).
    """

    def __init__(
        self,
        capacity: int,
        op="sum",
        dtype: torch.dtype = torch.float32,
        device="cpu",
        name: str = "SegmentTree",
        fanout: int = DEFAULT_FANOUT,
        backend: str | None = None,
    ):
        if capacity < 1:
            raise ValueError(f"capacity must be positive, got {capacity}")
        if fanout < 2:
            raise ValueError(f"fanout must be at least 2, got {fanout}")
        op = _OP_NAMES.get(op, op)
        if op not in _NEUTRAL:
            raise ValueError(f"unsupported op {op!r}")
        self._op = op
        self._op_code = _OP_CODES[op]
        self._name = name
        self._capacity = int(capacity)
        self._fanout = int(fanout)
        self._dtype = dtype

        num_levels = 1
        while fanout**num_levels < self._capacity:
            num_levels += 1
        padded = _round_up(self._capacity, fanout ** (num_levels - 1))
        self._level_sizes = [padded // fanout**k for k in range(num_levels)]
        # Row width per level: fanout, except the top level, which is one row.
        self._widths = [fanout] * (num_levels - 1) + [self._level_sizes[-1]]
        # The last offset is the root's slot.
        self._offsets = np.concatenate([[0], np.cumsum(self._level_sizes)]).tolist()
        self._layout = (
            _tree_kernels.make_layout(num_levels, fanout, self._capacity, self._offsets)
            if _tree_kernels is not None
            else None
        )
        # [scrub cursor, number of non-zero leaves] (see _tree_kernels.STATE_*).
        self._state = np.zeros(2, dtype=np.int64)
        self._place(torch.device(device), backend)
        self.clear()

    # ----------------------------------------------------------------- structure
    def _place(self, device: torch.device, backend: str | None, values=None):
        if backend is None:
            backend = default_backend(device)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if backend == "numba" and _tree_kernels is None:
            raise ValueError("the numba backend needs numba installed")
        if backend != "torch" and device.type != "cpu":
            raise ValueError(f"the {backend} backend needs a CPU tree")
        self._device = device
        self._backend = backend
        size = self._offsets[-1]
        # _values: every level's node values, then the root in the last slot.
        self._values = (
            values.to(device)
            if values is not None
            else torch.zeros(size + 1, dtype=torch.float64, device=device)
        )
        self._levels = [
            self._values[self._offsets[k] : self._offsets[k + 1]].reshape(-1, self._widths[k])
            for k in range(len(self._level_sizes))
        ]
        self._root = self._values[-1:]
        self._host = self._values.numpy() if backend == "numba" else None
        # Sum trees with a power-of-two fanout take the numba hot path (set_sum_leaves).
        self._sum_kernel = backend == "numba" and self._op == "sum" and self._layout[2] >= 0

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def fanout(self) -> int:
        return self._fanout

    @property
    def num_levels(self) -> int:
        return len(self._level_sizes)

    @property
    def backend(self) -> str:
        return self._backend

    def kernel_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(values, layout, state)`` for a fused numba kernel (numba backend only).

        A caller that writes leaves through ``_tree_kernels.sum_write`` /
        ``extreme_write`` must add the non-zero count change to ``state[STATE_NNZ]``.
        """
        if self._backend != "numba":
            raise ValueError("kernel_arrays needs the numba backend")
        return self._host, self._layout, self._state

    def clear(self) -> None:
        """Set every leaf to zero."""
        self._values.fill_(_NEUTRAL[self._op])
        self._values[: self._capacity] = 0.0
        self.resum()

    def resum(self) -> None:
        """Recompute every internal node from the leaves (O(capacity)).

        The numba kernel's sums then carry no rounding from earlier deltas: two trees with
        the same leaves hold bit-identical nodes after ``resum`` and stay so under the
        same updates (``state_dict`` relies on it).
        """
        if self._backend == "numba":
            _tree_kernels.resum(self._host, self._layout, self._op_code)
        else:
            self._rebuild_torch()
        self._state[0] = 0
        self._state[1] = int(torch.count_nonzero(self._values[: self._capacity]))

    def _rebuild_torch(self) -> None:
        top = len(self._levels) - 1
        for k, level in enumerate(self._levels):
            if self._op == "sum":
                reduced = level.sum(dim=1)
            elif self._op == "min":
                reduced = level.amin(dim=1)
            else:
                reduced = level.amax(dim=1)
            target = self._root if k == top else self._levels[k + 1].reshape(-1)
            target.copy_(reduced)

    # ------------------------------------------------------------------- updates
    def __setitem__(self, indices, values):
        """Set leaves and update their ancestors.

        ``values`` may be a scalar. Duplicate indices in one call: the value given last
        wins, and the leaf counts once (in ``nnz`` as everywhere else).
        """
        if self._sum_kernel:
            # The hot path of a numba sum tree: 1-D int64 / float64 numpy arrays, or
            # contiguous CPU tensors read by address, go straight to the kernel.
            if type(indices) is np.ndarray and type(values) is np.ndarray:
                if (
                    indices.dtype is _INT64
                    and values.dtype is _FLOAT64
                    and indices.ndim == 1
                    and values.ndim == 1
                ):
                    result = _sum_batch_kernels.set_sum_leaves(
                        self._host, self._layout, self._state, indices, values
                    )
                    if result <= _BAD_SHAPE:
                        self._check_result(result, indices.shape, values.shape)
                    return
            elif (
                type(indices) is torch.Tensor
                and type(values) is torch.Tensor
                and indices.dtype is torch.int64
                and ((dtype := values.dtype) is torch.float32 or dtype is torch.float64)
                and indices.is_cpu
                and values.is_cpu
                and indices.is_contiguous()
                and values.is_contiguous()
            ):
                n, m = indices.numel(), values.numel()
                result = _sum_batch_kernels.set_sum_leaves_at(
                    indices.data_ptr(), n, values.data_ptr(), m, dtype is torch.float32,
                    self._host, self._layout, self._state,
                )
                if result <= _BAD_SHAPE:
                    self._check_result(result, (n,), (m,))
                return
        if self._backend == "numba":
            idx = _numpy_of(indices, np.int64)
            vals = _numpy_of(values, np.float64)
            if self._sum_kernel:
                result = _sum_batch_kernels.set_sum_leaves(
                    self._host, self._layout, self._state, idx, vals
                )
                self._check_result(result, idx.shape, vals.shape)
                return
            if vals.size == 1 and idx.size != 1:
                vals = np.full(idx.shape, vals[0])
        else:
            idx = torch.as_tensor(indices, dtype=torch.int64, device=self._device).reshape(-1)
            vals = torch.as_tensor(values, dtype=torch.float64, device=self._device).reshape(-1)
            if vals.shape[0] == 1 and idx.shape[0] != 1:
                vals = vals.expand(idx.shape[0])
        if idx.shape != vals.shape:
            self._check_result(_BAD_SHAPE, idx.shape, vals.shape)
        if idx.shape[0] == 0:
            return
        if self._backend == "numba":
            self._check_result(
                _tree_kernels.set_leaves(
                    self._host, self._layout, self._state, self._op_code, idx, vals
                ),
                idx.shape,
                vals.shape,
            )
        else:
            self._set_torch(idx, vals)

    def _check_result(self, result: int, idx_shape, vals_shape) -> None:
        """Raise for a kernel's error code (nothing was written then)."""
        if result > _BAD_SHAPE:
            return
        if result == _BAD_SHAPE:
            raise ValueError(
                f"indices and values must have the same length, got {tuple(idx_shape)} "
                f"and {tuple(vals_shape)}"
            )
        if result == _tree_kernels.BAD_INDEX:
            raise IndexError(f"{self._name}: indices must lie in [0, {self._capacity})")
        raise ValueError(f"{self._name}: sum-tree leaves must be finite and >= 0")

    def _set_torch(self, idx, vals):
        if bool((idx.min() < 0) | (idx.max() >= self._capacity)):
            raise IndexError(f"{self._name}: indices must lie in [0, {self._capacity})")
        if idx.shape[0] > 1:
            idx, order = torch.sort(idx, stable=True)
            vals = vals[order]
            last_of_run = torch.ones_like(idx, dtype=torch.bool)
            last_of_run[:-1] = idx[1:] != idx[:-1]
            idx = idx[last_of_run]
            vals = vals[last_of_run]
        self._check_values(vals)
        leaves = self._levels[0].reshape(-1)
        if self._op == "sum":
            self._state[1] += int((vals != 0).sum() - (leaves[idx] != 0).sum())
        leaves[idx] = vals
        top = len(self._levels) - 1
        for k in range(top + 1):
            # Repeated rows recompute identical values, so they need no deduplication.
            rows = idx // self._widths[k] if k < top else idx[:1] * 0
            children = self._levels[k][rows]
            if self._op == "sum":
                reduced = children.sum(dim=1)
            elif self._op == "min":
                reduced = children.amin(dim=1)
            else:
                reduced = children.amax(dim=1)
            if k < top:
                self._levels[k + 1].reshape(-1)[rows] = reduced
            else:
                self._root.copy_(reduced)
            idx = rows

    def _check_values(self, vals) -> None:
        """Hook: the sum tree rejects negative or non-finite leaves."""

    # --------------------------------------------------------------------- reads
    def __getitem__(self, indices) -> torch.Tensor:
        """Leaf values at ``indices`` (any shape), in the tree's ``dtype``."""
        return self.get_float64(indices).to(self._dtype)

    def get_float64(self, indices) -> torch.Tensor:
        """Leaf values at ``indices`` at the internal precision (float64)."""
        idx = torch.as_tensor(indices, dtype=torch.int64, device=self._device)
        if idx.numel() and bool((idx.min() < 0) | (idx.max() >= self._capacity)):
            raise IndexError(f"{self._name}: indices must lie in [0, {self._capacity})")
        return self._values[idx]

    def summary(self) -> torch.Tensor:
        """``op`` over every leaf, as a 0-d tensor in the tree's ``dtype``."""
        return self._values[-1].to(self._dtype)

    def total(self) -> float:
        """``op`` over every leaf at float64 precision, as a Python float."""
        if self._host is not None:
            return float(self._host[-1])
        return float(self._values[-1])

    def leaves(self) -> torch.Tensor:
        """A float64 view of the leaves; read it, do not write into it."""
        return self._values[: self._capacity]

    def fill(self, values) -> None:
        """Replace every leaf at once and rebuild the tree in one O(capacity) pass."""
        vals = torch.as_tensor(values, dtype=torch.float64, device=self._device).reshape(-1)
        if vals.shape[0] != self._capacity:
            raise ValueError(f"expected {self._capacity} values, got {vals.shape[0]}")
        self._check_values(vals)
        self._values[: self._capacity] = vals
        self.resum()

    # --------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """A copy of the leaves; internal nodes are rebuilt on load.

        Re-sums this tree first, so that it and a tree loaded from the state hold the
        same nodes and answer every later query alike (see ``resum``).
        """
        self.resum()
        return {"op": self._op, "capacity": self._capacity, "leaves": self.leaves().clone()}

    def load_state_dict(self, state: dict) -> None:
        if int(state["capacity"]) != self._capacity or state["op"] != self._op:
            raise ValueError(
                f"state holds a {state['op']} tree of {state['capacity']} leaves, "
                f"this is a {self._op} tree of {self._capacity}"
            )
        self.fill(state["leaves"])

    def to(self, device, backend: str | None = None) -> SegmentTree:
        """Move the tree to ``device``; the kernel follows the device unless given."""
        self._place(torch.device(device), backend, self._values)
        self.resum()
        return self

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(capacity={self._capacity}, fanout={self._fanout}, "
            f"levels={self.num_levels}, device={self._device}, backend={self._backend})"
        )


class SumSegmentTree(SegmentTree):
    """Sum tree: ``summary()`` is the total; ``find_sum_bound`` inverts prefix sums."""

    def __init__(self, capacity, dtype=torch.float32, device="cpu", name="SumSegmentTree", **kw):
        super().__init__(capacity, "sum", dtype=dtype, device=device, name=name, **kw)

    @property
    def nnz(self) -> int:
        """Number of non-zero leaves."""
        return int(self._state[1])

    def _check_values(self, vals) -> None:
        if not bool((torch.isfinite(vals) & (vals >= 0)).all()):
            raise ValueError(f"{self._name}: sum-tree leaves must be finite and >= 0")

    def find_sum_bound(self, thresholds) -> torch.Tensor:
        """For each threshold, the smallest index whose inclusive prefix sum exceeds it.

        The leaf found is never zero. A threshold equal to the total returns the last
        non-zero leaf. Negative thresholds count as zero.

        Raises:
            ValueError: if a threshold is above ``summary()``, or every leaf is zero.
        """
        total = self.total()
        if not total > 0:
            raise ValueError(f"{self._name}: find_sum_bound on a tree whose leaves are all 0")
        if self._backend == "numba":
            given = (
                thresholds.detach().numpy()
                if isinstance(thresholds, torch.Tensor)
                else np.asarray(thresholds, dtype=np.float64)
            )
            if given.dtype.kind != "f":
                given = given.astype(np.float64)
            # Compare at the caller's precision: u * summary() computed in float32 may
            # round a hair above the float64 total and is still a legal threshold.
            too_large = given.size and given.max() > given.dtype.type(total)
        else:
            given = torch.as_tensor(thresholds, device=self._device)
            if not given.is_floating_point():
                given = given.to(torch.float64)
            limit = torch.tensor(total, dtype=torch.float64).to(given.dtype)
            too_large = given.numel() and bool(given.max().cpu() > limit)
        if too_large:
            raise ValueError(
                f"{self._name}: thresholds cannot be greater than summary(): got "
                f"{float(given.max())} vs. {total}"
            )
        shape = tuple(given.shape)
        if self._backend == "numba":
            found = self.find_host(given.reshape(-1).astype(np.float64, copy=False))
            return torch.from_numpy(found.reshape(shape))
        found = self._find_torch(given.reshape(-1).to(torch.float64), total)
        return found.reshape(shape)

    def find_host(self, thresholds: np.ndarray) -> np.ndarray:
        """``find_sum_bound`` for checked numpy thresholds (numba backend), as numpy."""
        out = np.empty(thresholds.shape[0], dtype=np.int64)
        if _tree_kernels.find_sum_bound(self._host, self._layout, thresholds, out) != 0:
            # Rounding left by deltas made a node's mass disagree with its children's;
            # exact sums cannot, so search those.
            self.resum()
            if _tree_kernels.find_sum_bound(self._host, self._layout, thresholds, out) != 0:
                raise RuntimeError(f"{self._name}: inconsistent tree after an exact re-sum")
        return out

    def _find_torch(self, t, total):
        t = t.clamp(0.0, total)
        n = t.shape[0]
        node = torch.zeros(n, dtype=torch.int64, device=self._device)
        for k in range(len(self._levels) - 1, -1, -1):
            width = self._widths[k]
            cum = torch.cumsum(self._levels[k][node], dim=1)
            # A threshold at (or, after rounding, past) the row's sum would find no child;
            # capping it just below that sum picks the last child holding mass instead.
            t = torch.minimum(t, torch.nextafter(cum[:, -1], torch.zeros_like(t)))
            # A zero child repeats its left neighbour's running sum, so it is never the
            # first running sum above t.
            child = (cum <= t[:, None]).sum(dim=1)
            before = cum.gather(1, (child - 1).clamp(min=0)[:, None]).squeeze(1)
            t = t - torch.where(child > 0, before, torch.zeros_like(before))
            node = node * width + child
        return node

    def prefix_sum(self, indices) -> torch.Tensor:
        """Sum of the leaves strictly before each index (float64); indices in [0, capacity]."""
        idx = torch.as_tensor(indices, dtype=torch.int64, device=self._device).reshape(-1)
        if idx.numel() and bool((idx.min() < 0) | (idx.max() > self._capacity)):
            raise IndexError(f"{self._name}: prefix indices must lie in [0, {self._capacity}]")
        if self._backend == "numba":
            out = np.empty(idx.shape[0], dtype=np.float64)
            _tree_kernels.prefix_sum(self._host, self._layout, idx.numpy(), out)
            return torch.from_numpy(out)
        whole = idx == self._capacity
        node = torch.where(whole, torch.zeros_like(idx), idx)
        total = torch.zeros(idx.shape, dtype=torch.float64, device=self._device)
        for k, level in enumerate(self._levels):
            width = self._widths[k]
            row, col = node // width, node % width
            cum = torch.cumsum(level[row], dim=1)
            before = cum.gather(1, (col - 1).clamp(min=0)[:, None]).squeeze(1)
            total += torch.where(col > 0, before, torch.zeros_like(before))
            node = row
        return torch.where(whole, self._values[-1].expand_as(total), total)


class MinSegmentTree(SegmentTree):
    """Min tree (as in ALF, leaves start at 0 and count in the minimum)."""

    def __init__(self, capacity, dtype=torch.float32, device="cpu", name="MinSegmentTree", **kw):
        super().__init__(capacity, "min", dtype=dtype, device=device, name=name, **kw)


class MaxSegmentTree(SegmentTree):
    """Max tree (as in ALF, leaves start at 0)."""

    def __init__(self, capacity, dtype=torch.float32, device="cpu", name="MaxSegmentTree", **kw):
        super().__init__(capacity, "max", dtype=dtype, device=device, name=name, **kw)


def default_backend(device) -> str:
    """numba on CPU (torch if numba failed to import); torch on any other device, and on a
    CPU while :data:`storage.arrays.TORCH_ON_CPU` is set."""
    if not arrays.numpy_views(device):
        return "torch"
    return "numba" if _tree_kernels is not None else "torch"


def available_backends(device="cpu") -> list[str]:
    """Kernels that can drive a tree on ``device`` here (tests run them all)."""
    if torch.device(device).type != "cpu":
        return ["torch"]
    return [b for b in BACKENDS if b != "numba" or _tree_kernels is not None]


def _numpy_of(x, dtype) -> np.ndarray:
    """A 1-D numpy array of ``x`` (sharing memory with a CPU tensor when it can)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().numpy()
    return np.asarray(x, dtype=dtype).reshape(-1)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
