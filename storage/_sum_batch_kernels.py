"""Batch writes into a sum tree from compiled code: the replay buffer's hot path.

Split from ``_tree_kernels`` (the tree layout, single-leaf writes, searches and re-sums,
whose rules this module follows): ``set_sum_leaves`` writes a whole batch of leaves in
one compiled call, and ``set_sum_leaves_at`` does it straight from tensors' memory.
``void_pointer`` is shared with ``_sampler_kernels`` for the same reason.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from storage._tree_kernels import (
    _HEADER,
    BAD_INDEX,
    BAD_SHAPE,
    BAD_VALUE,
    CANCELLATION,
    STATE_NNZ,
    resum_path,
    scrub_after,
)


@intrinsic
def void_pointer(typingctx, address):
    """The integer ``address`` as a ``void*``, for ``numba.carray``."""
    if not isinstance(address, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(address), codegen


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _write_sums(values, layout, idx, vals, root, shift, depth, offsets):
    """``set_sum_leaves``' loop; ``depth`` (a constant at each call) 2-6 climbs through
    ``offsets``, 0 through a loop over ``layout``. Returns ``(root, nnz change)``."""
    n = idx.shape[0]
    m = vals.shape[0]
    num_levels = layout[0]
    root_slot = layout[_HEADER + num_levels]
    nnz_delta = 0
    for j in range(n):
        leaf = idx[j]
        value = np.float64(vals[j if m == n else 0])
        old = values[leaf]
        if value == old:
            continue
        values[leaf] = value
        delta = value - old
        # |delta| > CANCELLATION * ancestor, with CANCELLATION a power of two (exact).
        limit = abs(delta) / CANCELLATION
        unsettled = value == 0.0
        node = leaf
        if depth == 0:
            for k in range(1, num_levels):
                node >>= shift
                slot = layout[_HEADER + k] + node
                ancestor = values[slot] + delta
                values[slot] = ancestor
                unsettled |= limit > ancestor
        else:
            for k in range(depth - 1):
                node >>= shift
                slot = offsets[k] + node
                ancestor = values[slot] + delta
                values[slot] = ancestor
                unsettled |= limit > ancestor
        root += delta
        unsettled |= limit > root
        nnz_delta += (value != 0.0) - (old != 0.0)
        if unsettled:
            values[root_slot] = root
            resum_path(values, layout, 0, leaf)
            root = values[root_slot]
    return root, nnz_delta


@numba.njit(cache=True, nogil=True, error_model="numpy")
def set_sum_leaves(values, layout, state, idx, vals):
    """``set_leaves`` for a sum tree of power-of-two fanout: the tree's hot path.

    The same writes in the same order as ``set_leaves``, for less: the checks are one
    pass without early exits (it vectorises); the root, which every leaf changes, stays
    in a register for the whole batch instead of being loaded and stored once per leaf
    in a dependent chain; a leaf to settle is settled at once (rare: a leaf set to 0 or
    a cancelling delta), so no list of them is kept. ``vals`` holds one value per index
    or a single one for all. Returns what ``set_leaves`` returns, or ``BAD_SHAPE`` when
    ``vals`` has another length.
    """
    n = idx.shape[0]
    m = vals.shape[0]
    if m != n and m != 1:
        return BAD_SHAPE
    capacity = np.uint64(layout[3])
    bad_index = False
    bad_value = False
    for j in range(n):
        bad_index |= np.uint64(idx[j]) >= capacity  # a negative index wraps to a huge one
    for j in range(m):
        v = vals[j]
        bad_value |= not (v >= 0.0 and v < math.inf)
    if bad_index:
        return BAD_INDEX
    if bad_value:
        return BAD_VALUE
    num_levels = layout[0]
    shift = layout[2]
    root_slot = layout[_HEADER + num_levels]
    # The levels' offsets in locals, and one copy of the loop per depth (2-6 levels): read
    # from ``layout`` inside the loop they are reloaded after every store into ``values``
    # (numba cannot tell the arrays apart), and with a constant depth the climb unrolls:
    # 2^17-2^20 leaves (five levels) update 1.2-1.5x faster than through a level loop.
    o1 = layout[_HEADER + 1] if num_levels > 1 else 0
    o2 = layout[_HEADER + 2] if num_levels > 2 else 0
    o3 = layout[_HEADER + 3] if num_levels > 3 else 0
    o4 = layout[_HEADER + 4] if num_levels > 4 else 0
    o5 = layout[_HEADER + 5] if num_levels > 5 else 0
    offsets = (o1, o2, o3, o4, o5)
    root = values[root_slot]
    if num_levels == 5:
        root, nnz_delta = _write_sums(values, layout, idx, vals, root, shift, 5, offsets)
    elif num_levels == 4:
        root, nnz_delta = _write_sums(values, layout, idx, vals, root, shift, 4, offsets)
    elif num_levels == 6:
        root, nnz_delta = _write_sums(values, layout, idx, vals, root, shift, 6, offsets)
    elif num_levels == 3:
        root, nnz_delta = _write_sums(values, layout, idx, vals, root, shift, 3, offsets)
    else:
        root, nnz_delta = _write_sums(values, layout, idx, vals, root, shift, 0, offsets)
    values[root_slot] = root
    scrub_after(values, layout, state, n)
    state[STATE_NNZ] += nnz_delta
    return nnz_delta


@numba.njit(cache=True, nogil=True, error_model="numpy")
def set_sum_leaves_at(idx_address, n, vals_address, m, vals_float32, values, layout, state):
    """``set_sum_leaves`` reading contiguous CPU tensors (``n`` int64 indices, ``m``
    float32 or float64 values) at their addresses: a numpy view of a tensor costs about
    as much as the whole update."""
    idx = numba.carray(void_pointer(idx_address), n, np.int64)
    if vals_float32:
        vals32 = numba.carray(void_pointer(vals_address), m, np.float32)
        return set_sum_leaves(values, layout, state, idx, vals32)
    vals64 = numba.carray(void_pointer(vals_address), m, np.float64)
    return set_sum_leaves(values, layout, state, idx, vals64)
