"""Segment trees with ALF's interface on a wide, float64 layout.

ALF keeps a binary tree and walks it level by level from Python: twenty small torch ops
per update at 2^20 leaves, about 2 ms per call on a CPU. We keep ALF's interface
(``tree[indices] = values``, ``tree[indices]``, ``summary()``, ``find_sum_bound``,
``nnz``) on a ``fanout``-ary tree (32 by default, picked by measurement, see
``bench/replay.py``): 2^20 leaves need four levels, and each level costs one gather of
``[batch, fanout]`` rows and one row operation, whatever the size of the tree.

Layout: level 0 holds the leaves, level k+1 holds one node per row of ``fanout`` nodes of
level k; the top level is a single row of at most ``fanout`` nodes and the root is its
reduction. Leaves are padded (with the neutral element of the op) to a multiple of
``fanout ** (levels - 1)`` so every level divides into whole rows; that wastes less than
the capacity itself.

The sum tree also stores, for every row of every level, the inclusive prefix sums of the
row. A search then reads one row per level and compares, instead of accumulating; an
update pays one row ``cumsum`` per level instead of a plain sum. Both prefix rows and
parent values are recomputed from the children (never adjusted by deltas), so sums carry
at most one rounding per level however many updates came before, and a node's value is
bit-identical to the last prefix entry of its row of children. Because the prefix is a
sequential float64 running sum, a zero leaf adds exactly nothing, so a search can never
stop on a zero leaf.

On CPU the kernels run on numpy views of the tensors (numpy costs about a microsecond per
call, torch several) with ``torch.cumsum`` for the row prefix (numpy's row ``cumsum`` is
not vectorized across rows); on other devices everything is torch. Both kernels implement
the same algorithm, and the tests run both on CPU.
"""

from __future__ import annotations

import math

import numpy as np
import torch

try:  # Optional compiled CPU kernels; numpy kernels are used without numba.
    from storage import _tree_kernels
except ImportError:  # pragma: no cover - exercised where numba is absent
    _tree_kernels = None

DEFAULT_FANOUT = 32
_OP_CODES = {"sum": 0, "min": 1, "max": 2}

_NEUTRAL = {"sum": 0.0, "min": math.inf, "max": -math.inf}
_OP_NAMES = {torch.add: "sum", torch.min: "min", torch.max: "max"}
_NUMPY_REDUCE = {"sum": np.add.reduce, "min": np.minimum.reduce, "max": np.maximum.reduce}


class SegmentTree:
    """A tree over ``capacity`` leaves (all zero at first) that keeps ``op`` of them.

    Args:
        capacity: number of leaves.
        op: ``"sum"``, ``"min"`` or ``"max"`` (ALF's ``torch.add``/``torch.min``/
            ``torch.max`` are accepted too).
        dtype: dtype of the values handed back by ``__getitem__`` and ``summary()``;
            nodes are float64 inside whatever this is.
        device: where the tree lives; CPU trees use the numpy kernel.
        fanout: children per node.
        backend: ``"numpy"`` or ``"torch"``; defaults by device (tests force ``"torch"``
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
        self._name = name
        self._capacity = int(capacity)
        self._fanout = int(fanout)
        self._dtype = dtype
        self._keeps_prefix = op == "sum"

        num_levels = 1
        while fanout**num_levels < self._capacity:
            num_levels += 1
        padded = _round_up(self._capacity, fanout ** (num_levels - 1))
        self._level_sizes = [padded // fanout**k for k in range(num_levels)]
        # Row width per level: fanout, except the top level, which is one row.
        self._widths = [fanout] * (num_levels - 1) + [self._level_sizes[-1]]
        self._offsets = np.concatenate([[0], np.cumsum(self._level_sizes)]).tolist()
        # Prefix rows carry a leading 0 column, so "sum before child j" is column j.
        prefix_sizes = [
            n // w * (w + 1) for n, w in zip(self._level_sizes, self._widths, strict=True)
        ]
        self._prefix_offsets = np.concatenate([[0], np.cumsum(prefix_sizes)]).tolist()
        self._nnz = 0
        self._place(torch.device(device), backend)
        self.clear()

    # ----------------------------------------------------------------- structure
    def _place(self, device: torch.device, backend: str | None, values=None, prefix=None):
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
        if self._keeps_prefix:
            self._prefix = (
                prefix.to(device)
                if prefix is not None
                else torch.zeros(self._prefix_offsets[-1], dtype=torch.float64, device=device)
            )
        on_host = backend != "torch"
        flat = self._values.numpy() if on_host else self._values
        self._levels = [
            flat[self._offsets[k] : self._offsets[k + 1]].reshape(-1, self._widths[k])
            for k in range(len(self._level_sizes))
        ]
        self._root = flat[-1:]
        if self._keeps_prefix:
            pflat = self._prefix.numpy() if on_host else self._prefix
            self._prefix_levels = [
                pflat[self._prefix_offsets[k] : self._prefix_offsets[k + 1]].reshape(
                    -1, self._widths[k] + 1
                )
                for k in range(len(self._level_sizes))
            ]
        self._flat_values = flat
        self._flat_prefix = pflat if self._keeps_prefix else np.zeros(1)
        self._np_offsets = np.asarray(self._offsets, dtype=np.int64)
        self._np_prefix_offsets = np.asarray(self._prefix_offsets, dtype=np.int64)
        self._np_widths = np.asarray(self._widths, dtype=np.int64)
        rows_per_level = [n // w for n, w in zip(self._level_sizes, self._widths, strict=True)]
        self._np_row_offsets = np.concatenate([[0], np.cumsum(rows_per_level)]).astype(np.int64)
        # Scratch for the numba kernel's row deduplication (see _tree_kernels.set_leaves).
        self._stamps = np.full(int(self._np_row_offsets[-1]), -1, dtype=np.int64)
        self._stamp = 0

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

    def clear(self) -> None:
        """Set every leaf to zero."""
        self._values.fill_(_NEUTRAL[self._op])
        self._values[: self._capacity] = 0.0
        self._rebuild()

    def _rebuild(self) -> None:
        """Recompute every internal node (and prefix row) from the leaves: O(capacity)."""
        values = self._values
        for k, size in enumerate(self._level_sizes):
            rows = values[self._offsets[k] : self._offsets[k] + size].reshape(-1, self._widths[k])
            if self._keeps_prefix:
                prefix = torch.cumsum(rows, dim=1)
                padded = torch.nn.functional.pad(prefix, (1, 0))
                start = self._prefix_offsets[k]
                self._prefix[start : self._prefix_offsets[k + 1]] = padded.reshape(-1)
                reduced = prefix[:, -1]
            elif self._op == "min":
                reduced = rows.amin(dim=1)
            else:
                reduced = rows.amax(dim=1)
            start = self._offsets[k + 1] if k + 1 < len(self._level_sizes) else self._offsets[-1]
            values[start : start + reduced.shape[0]] = reduced
        self._nnz = int(torch.count_nonzero(values[: self._capacity]))

    # ------------------------------------------------------------------- updates
    def __setitem__(self, indices, values):
        """Set leaves and recompute their ancestors.

        ``values`` may be a scalar. Duplicate indices in one call: the value given last
        wins, and the leaf counts once (in ``nnz`` as everywhere else).
        """
        if self._backend != "torch":
            idx = _numpy_of(indices, np.int64)
            vals = _numpy_of(values, np.float64)
            if vals.size == 1 and idx.size != 1:
                vals = np.broadcast_to(vals.reshape(()), idx.shape)
        else:
            idx = torch.as_tensor(indices, dtype=torch.int64, device=self._device).reshape(-1)
            vals = torch.as_tensor(values, dtype=torch.float64, device=self._device).reshape(-1)
            if vals.shape[0] == 1 and idx.shape[0] != 1:
                vals = vals.expand(idx.shape[0])
        if idx.shape != vals.shape:
            raise ValueError(
                f"indices and values must have the same length, got {tuple(idx.shape)} "
                f"and {tuple(vals.shape)}"
            )
        if idx.shape[0] == 0:
            return
        if self._backend == "numba":
            self._stamp += 1
            result = _tree_kernels.set_leaves(
                self._flat_values,
                self._flat_prefix,
                self._np_offsets,
                self._np_prefix_offsets,
                self._np_widths,
                self._np_row_offsets,
                self._stamps,
                self._stamp,
                _OP_CODES[self._op],
                self._capacity,
                idx,
                np.ascontiguousarray(vals),
            )
            if result == _tree_kernels.BAD_INDEX:
                raise IndexError(f"{self._name}: indices must lie in [0, {self._capacity})")
            if result == _tree_kernels.BAD_VALUE:
                raise ValueError(f"{self._name}: sum-tree leaves must be finite and >= 0")
            self._nnz += result
        elif self._backend == "numpy":
            self._set_numpy(idx, vals)
        else:
            self._set_torch(idx, vals)

    def _set_numpy(self, idx, vals):
        if idx.min() < 0 or idx.max() >= self._capacity:
            raise IndexError(f"{self._name}: indices must lie in [0, {self._capacity})")
        if idx.shape[0] > 1:
            order = idx.argsort(kind="stable")
            idx = idx.take(order)
            last_of_run = np.empty(idx.shape[0], dtype=bool)
            np.not_equal(idx[1:], idx[:-1], out=last_of_run[:-1])
            last_of_run[-1] = True
            idx = idx[last_of_run]
            vals = vals.take(order)[last_of_run]
        self._check_values(vals)
        leaves = self._levels[0].reshape(-1)
        if self._keeps_prefix:
            self._nnz += int(np.count_nonzero(vals)) - int(np.count_nonzero(leaves.take(idx)))
        leaves[idx] = vals
        top = len(self._levels) - 1
        for k in range(top + 1):
            width = self._widths[k]
            level = self._levels[k]
            if k == top:
                children = level
            else:
                rows = idx // width
                if level.shape[0] < 4 * rows.shape[0]:
                    # idx is sorted, so repeated rows are adjacent: near the top of the
                    # tree most rows repeat, and dropping them beats recomputing them.
                    keep = np.empty(rows.shape[0], dtype=bool)
                    keep[0] = True
                    np.not_equal(rows[1:], rows[:-1], out=keep[1:])
                    rows = rows[keep]
                children = level.take(rows, axis=0)
            if self._keeps_prefix:
                prefix = torch.cumsum(torch.from_numpy(children), dim=1).numpy()
                if k == top:
                    self._prefix_levels[k][0, 1:] = prefix[0]
                else:
                    self._prefix_levels[k][rows, 1:] = prefix
                reduced = prefix[:, -1]
            else:
                reduced = _NUMPY_REDUCE[self._op](children, axis=1)
            if k == top:
                self._root[0] = reduced[0]
            else:
                self._levels[k + 1].reshape(-1)[rows] = reduced
                idx = rows

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
        if self._keeps_prefix:
            self._nnz += int((vals != 0).sum() - (leaves[idx] != 0).sum())
        leaves[idx] = vals
        top = len(self._levels) - 1
        for k in range(top + 1):
            # Repeated rows recompute identical values, so they need no deduplication.
            rows = idx // self._widths[k]
            children = self._levels[k][rows]
            if self._keeps_prefix:
                prefix = torch.cumsum(children, dim=1)
                self._prefix_levels[k][rows, 1:] = prefix
                reduced = prefix[:, -1]
            elif self._op == "min":
                reduced = children.amin(dim=1)
            else:
                reduced = children.amax(dim=1)
            if k < top:
                self._levels[k + 1].reshape(-1)[rows] = reduced
            else:
                self._root[0] = reduced[0]
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
        return float(self._values[-1])

    def leaves(self) -> torch.Tensor:
        """A float64 view of the leaves; read it, do not write into it."""
        return self._values[: self._capacity]

    def fill(self, values) -> None:
        """Replace every leaf at once and rebuild the tree in one O(capacity) pass."""
        vals = torch.as_tensor(values, dtype=torch.float64, device=self._device).reshape(-1)
        if vals.shape[0] != self._capacity:
            raise ValueError(f"expected {self._capacity} values, got {vals.shape[0]}")
        self._check_values(vals.numpy() if self._backend != "torch" else vals)
        self._values[: self._capacity] = vals
        self._rebuild()

    # --------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """A copy of the leaves; internal nodes are rebuilt on load."""
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
        self._place(
            torch.device(device),
            backend,
            self._values,
            self._prefix if self._keeps_prefix else None,
        )
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
        return self._nnz

    def _check_values(self, vals) -> None:
        if isinstance(vals, np.ndarray):
            ok = bool(vals.min() >= 0 and vals.max() < np.inf)
        else:
            ok = bool((torch.isfinite(vals) & (vals >= 0)).all())
        if not ok:
            raise ValueError(f"{self._name}: sum-tree leaves must be finite and >= 0")

    def find_sum_bound(self, thresholds) -> torch.Tensor:
        """For each threshold, the smallest index whose inclusive prefix sum exceeds it.

        The leaf found is never zero. A threshold equal to the total returns the last
        non-zero leaf. Negative thresholds count as zero.

        Raises:
            ValueError: if a threshold is above ``summary()``, or every leaf is zero.
        """
        total = self._values[-1].item()
        if not total > 0:
            raise ValueError(f"{self._name}: find_sum_bound on a tree whose leaves are all 0")
        if self._backend != "torch":
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
            t = given.astype(np.float64).reshape(-1)
            found = _tree_kernels.find_sum_bound(
                self._flat_values, self._flat_prefix, self._np_prefix_offsets, self._np_widths, t
            )
            return torch.from_numpy(found.reshape(shape))
        if self._backend == "numpy":
            t = given.astype(np.float64).reshape(-1)
            return torch.from_numpy(self._find_numpy(t, total).reshape(shape))
        found = self._find_torch(given.reshape(-1).to(torch.float64), total)
        return found.reshape(shape)

    def _find_numpy(self, t, total):
        """Descend one row per level; ``t`` becomes the remainder inside each node."""
        np.clip(t, 0.0, total, out=t)
        n = t.shape[0]
        top = len(self._levels) - 1
        row_base = np.arange(n, dtype=np.int64)
        t_col = torch.from_numpy(t).unsqueeze(1)
        top_row = self._prefix_levels[top][0]
        # A threshold at (or, after rounding, past) its row's total would find no child;
        # capping it just below that total picks the last child holding mass instead.
        np.minimum(t, np.nextafter(top_row[-1], -np.inf), out=t)
        # Padded rows start with 0, so "entries <= t" counts one more than the child.
        node = np.searchsorted(top_row, t, side="right") - 1
        t -= top_row.take(node)
        for k in range(top - 1, -1, -1):
            width = self._widths[k]
            padded = width + 1
            rows = self._prefix_levels[k].take(node, axis=0)
            np.minimum(t, np.nextafter(rows[:, -1], -np.inf), out=t)
            child = torch.searchsorted(torch.from_numpy(rows), t_col, right=True).numpy()
            child = child.reshape(-1) - 1
            t -= rows.reshape(-1).take(row_base * padded + child)
            node *= width
            node += child
        return node

    def _find_torch(self, t, total):
        t = t.clamp(0.0, total)
        n = t.shape[0]
        node = torch.zeros(n, dtype=torch.int64, device=self._device)
        rows_arange = torch.arange(n, device=self._device)
        for k in range(len(self._levels) - 1, -1, -1):
            width = self._widths[k]
            rows = self._prefix_levels[k][node]
            t = torch.minimum(t, torch.nextafter(rows[:, -1], torch.zeros_like(t)))
            child = torch.argmax((rows[:, 1:] > t[:, None]).to(torch.uint8), dim=1)
            t = t - rows[rows_arange, child]
            node = node * width + child
        return node

    def prefix_sum(self, indices) -> torch.Tensor:
        """Sum of the leaves strictly before each index (float64); indices in [0, capacity]."""
        idx = torch.as_tensor(indices, dtype=torch.int64, device=self._device).reshape(-1)
        if idx.numel() and bool((idx.min() < 0) | (idx.max() > self._capacity)):
            raise IndexError(f"{self._name}: prefix indices must lie in [0, {self._capacity}]")
        whole = idx == self._capacity
        node = torch.where(whole, torch.zeros_like(idx), idx)
        total = torch.zeros(idx.shape, dtype=torch.float64, device=self._device)
        for k in range(len(self._levels)):
            width = self._widths[k]
            start, end = self._prefix_offsets[k], self._prefix_offsets[k + 1]
            level = self._prefix[start:end].reshape(-1, width + 1)
            total += level[node // width, node % width]
            node = node // width
        return torch.where(whole, self._values[-1].expand_as(total), total)


class MinSegmentTree(SegmentTree):
    """Min tree (as in ALF, leaves start at 0 and count in the minimum)."""

    def __init__(self, capacity, dtype=torch.float32, device="cpu", name="MinSegmentTree", **kw):
        super().__init__(capacity, "min", dtype=dtype, device=device, name=name, **kw)


class MaxSegmentTree(SegmentTree):
    """Max tree (as in ALF, leaves start at 0)."""

    def __init__(self, capacity, dtype=torch.float32, device="cpu", name="MaxSegmentTree", **kw):
        super().__init__(capacity, "max", dtype=dtype, device=device, name=name, **kw)


BACKENDS = ("numba", "numpy", "torch")


def default_backend(device) -> str:
    """numba on CPU when installed, else numpy on CPU; torch on any other device."""
    if torch.device(device).type != "cpu":
        return "torch"
    return "numba" if _tree_kernels is not None else "numpy"


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
