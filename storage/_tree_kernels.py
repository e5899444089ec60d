"""Compiled CPU kernels for the wide segment trees (numba).

A C++ tree (cpprb, TorchRL) updates 256 leaves in a few microseconds because each step
is a few machine instructions; numpy or torch pay about a microsecond per call, so even a
four-level tree driven from Python costs tens of microseconds. These kernels do a whole
batch in one compiled call.

Layout (shared with the torch kernel in ``segment_tree.py``): ``values`` holds level
after level, leaves first, and the root in its last slot. Level k starts at
``offsets[k]``; below the top level it is cut into rows of ``fanout`` nodes, and node r of
level k+1 reduces row r of level k; the top level is one row, reduced into the root.
Every layout fact a kernel needs sits in one int64 array (fewer arguments to pass):

    layout = [num_levels, fanout, shift (log2 fanout, or -1), capacity, offsets...]

with ``num_levels + 1`` offsets, the last one being the root's slot.

Sum trees are updated by deltas: a leaf change ``new - old`` is added to each ancestor,
one addition per level, instead of re-adding ``fanout`` children per level (several
times fewer operations at 2^20 leaves, and no dependent chain of additions). Deltas
round, and a sum that loses most of its value by subtraction keeps the rounding of the
large value it had; three rules keep the sums exact enough to sample without bias:

* the ancestors of a leaf set to 0, or of a leaf whose delta left some ancestor with
  less than ``1 / CANCELLATION`` of the delta, are re-summed from their children along
  the leaf's path (``settle``). An empty subtree is thus exactly 0, so a search (which
  never enters a child of value <= 0) cannot reach a zero leaf, and no node keeps
  rounding from values much larger than its own;
* every update also re-sums as many leaves as it wrote, continuing a post-order sweep of
  the tree (``scrub``), so no node carries rounding from more than the last
  ``capacity`` leaf writes however long the buffer runs;
* ``resum`` rebuilds every node exactly (fill, load, checkpoint).

Min and max trees need no deltas: a changed leaf walks up only while it changes its
ancestors, and a row is re-reduced only when the old extreme leaves it.
"""

from __future__ import annotations

import math

import numba
import numpy as np

OP_SUM, OP_MIN, OP_MAX = 0, 1, 2

BAD_INDEX = -(2**62)
BAD_VALUE = -(2**62) + 1
BAD_SHAPE = -(2**62) + 2
INCONSISTENT = -1

_HEADER = 4  # layout slots before the offsets

# Slots of a sum tree's int64 ``state`` array.
STATE_CURSOR, STATE_NNZ = 0, 1

# A delta larger than this many times the ancestor's new value calls for a re-sum.
CANCELLATION = 1024.0


def make_layout(num_levels: int, fanout: int, capacity: int, offsets) -> np.ndarray:
    shift = fanout.bit_length() - 1 if fanout & (fanout - 1) == 0 else -1
    return np.asarray([num_levels, fanout, shift, capacity, *offsets], dtype=np.int64)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _width(layout, k):
    """Row width of level k."""
    num_levels = layout[0]
    if k == num_levels - 1:
        return layout[_HEADER + num_levels] - layout[_HEADER + k]
    return layout[1]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _row(layout, k, node):
    """Row of level k holding ``node`` (= its parent's index at level k + 1)."""
    if k == layout[0] - 1:
        return 0
    if layout[2] >= 0:
        return node >> layout[2]
    return node // layout[1]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _reduce(values, start, width, op):
    """``op`` over ``values[start:start + width]``.

    Sums of a width divisible by 4 keep four running sums (children c, c + 4, ...) added
    pairwise at the end: four independent chains of additions instead of one dependent
    chain, 2x faster for a row of 16 (the sweep of every update re-sums rows). Every
    re-sum goes through here, so equal leaves still give bit-identical nodes.
    """
    acc = values[start]
    if op == OP_SUM:
        if width % 4 == 0:
            acc1 = values[start + 1]
            acc2 = values[start + 2]
            acc3 = values[start + 3]
            for c in range(4, width, 4):
                acc += values[start + c]
                acc1 += values[start + c + 1]
                acc2 += values[start + c + 2]
                acc3 += values[start + c + 3]
            return (acc + acc1) + (acc2 + acc3)
        for c in range(1, width):
            acc += values[start + c]
    elif op == OP_MIN:
        for c in range(1, width):
            acc = min(acc, values[start + c])
    else:
        for c in range(1, width):
            acc = max(acc, values[start + c])
    return acc


@numba.njit(cache=True, nogil=True, error_model="numpy")
def resum(values, layout, op):
    """Recompute every internal node from its children, bottom up: O(capacity)."""
    num_levels = layout[0]
    for k in range(num_levels):
        width = _width(layout, k)
        start = layout[_HEADER + k]
        rows = (layout[_HEADER + k + 1] - start) // width
        parents = layout[_HEADER + k + 1]
        for r in range(rows):
            values[parents + r] = _reduce(values, start + r * width, width, op)


# The per-leaf functions below run 256 times per call. They are inlined and contain no
# calls and no integer division: either made the loop two to three times slower. They
# need a power-of-two fanout (layout[2] >= 0); kernels send other fanouts (tests) to the
# generic versions once, before their loop.


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _add_up(values, layout, level, node, delta):
    """Add ``delta`` to every ancestor of ``node`` (a node of ``level``); returns whether
    an ancestor was left with less than ``1 / CANCELLATION`` of the delta."""
    num_levels = layout[0]
    shift = layout[2]
    cancelled = False
    for k in range(level, num_levels - 1):
        node >>= shift
        slot = layout[_HEADER + k + 1] + node
        value = values[slot] + delta
        values[slot] = value
        cancelled |= abs(delta) > CANCELLATION * value
    root = layout[_HEADER + num_levels]
    value = values[root] + delta
    values[root] = value
    return cancelled or abs(delta) > CANCELLATION * value


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def sum_write(values, layout, leaf, value):
    """Set one leaf of a sum tree.

    Returns ``(change in the number of non-zero leaves, settle)``; when ``settle`` is
    true the caller passes the leaf to ``settle`` once the batch is written (kept out of
    this loop, which a call would slow down by half).
    """
    old = values[leaf]
    if value == old:
        return 0, False
    values[leaf] = value
    cancelled = _add_up(values, layout, 0, leaf, value - old)
    change = (1 if value != 0.0 else 0) - (1 if old != 0.0 else 0)
    return change, cancelled or value == 0.0


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _add_up_generic(values, layout, level, node, delta):
    """``_add_up`` for any fanout (one division per level)."""
    cancelled = False
    for k in range(level, layout[0]):
        node = _row(layout, k, node)
        slot = layout[_HEADER + k + 1] + node
        values[slot] += delta
        cancelled |= abs(delta) > CANCELLATION * values[slot]
    return cancelled


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _sum_write_generic(values, layout, leaf, value):
    """``sum_write`` for any fanout."""
    old = values[leaf]
    if value == old:
        return 0, False
    values[leaf] = value
    cancelled = _add_up_generic(values, layout, 0, leaf, value - old)
    change = (1 if value != 0.0 else 0) - (1 if old != 0.0 else 0)
    return change, cancelled or value == 0.0


@numba.njit(cache=True, nogil=True, error_model="numpy")
def resum_path(values, layout, level, node):
    """Re-sum every ancestor of ``node`` (of ``level``) from its children, bottom up."""
    for k in range(level, layout[0]):
        row = _row(layout, k, node)
        width = _width(layout, k)
        total = _reduce(values, layout[_HEADER + k] + row * width, width, OP_SUM)
        values[layout[_HEADER + k + 1] + row] = total
        node = row


@numba.njit(cache=True, nogil=True, error_model="numpy")
def settle(values, layout, leaves, count):
    """``resum_path`` from each of the first ``count`` ``leaves`` (see ``sum_write``)."""
    for j in range(count):
        resum_path(values, layout, 0, leaves[j])


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def max_write(values, layout, leaf, value):
    """Set one leaf of a max tree, walking up only while ancestors change."""
    old = values[leaf]
    if value == old:
        return
    values[leaf] = value
    num_levels = layout[0]
    shift = layout[2]
    node = leaf
    for k in range(num_levels):
        if k < num_levels - 1:
            row = node >> shift
            width = layout[1]
        else:
            row = 0
            width = layout[_HEADER + num_levels] - layout[_HEADER + k]
        parent = layout[_HEADER + k + 1] + row
        current = values[parent]
        if value > current:
            new = value
        elif old == current:
            # The old maximum left the row: take the row's maximum again.
            start = layout[_HEADER + k] + row * width
            new = values[start]
            for c in range(1, width):
                new = max(new, values[start + c])
            if new == current:
                return
        else:
            return
        values[parent] = new
        old = current
        value = new
        node = row


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def min_write(values, layout, leaf, value):
    """Set one leaf of a min tree (``max_write`` mirrored)."""
    old = values[leaf]
    if value == old:
        return
    values[leaf] = value
    num_levels = layout[0]
    shift = layout[2]
    node = leaf
    for k in range(num_levels):
        if k < num_levels - 1:
            row = node >> shift
            width = layout[1]
        else:
            row = 0
            width = layout[_HEADER + num_levels] - layout[_HEADER + k]
        parent = layout[_HEADER + k + 1] + row
        current = values[parent]
        if value < current:
            new = value
        elif old == current:
            start = layout[_HEADER + k] + row * width
            new = values[start]
            for c in range(1, width):
                new = min(new, values[start + c])
            if new == current:
                return
        else:
            return
        values[parent] = new
        old = current
        value = new
        node = row


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _extreme_write_generic(values, layout, op, leaf, value):
    """``max_write`` / ``min_write`` for any fanout."""
    old = values[leaf]
    if value == old:
        return
    values[leaf] = value
    node = leaf
    for k in range(layout[0]):
        row = _row(layout, k, node)
        parent = layout[_HEADER + k + 1] + row
        current = values[parent]
        if (value > current) if op == OP_MAX else (value < current):
            new = value
        elif old == current:
            width = _width(layout, k)
            new = _reduce(values, layout[_HEADER + k] + row * width, width, op)
            if new == current:
                return
        else:
            return
        values[parent] = new
        old = current
        value = new
        node = row


@numba.njit(cache=True, nogil=True, error_model="numpy")
def scrub(values, layout, state, rows):
    """Re-sum ``rows`` nodes of level 1 from their children, continuing a post-order sweep.

    The sweep's cursor (``state[STATE_CURSOR]``) walks level 1; after the last child of a
    node, that node is re-summed too, and so on up to the root, so each node is re-summed
    after its children. A re-summed node that is not a last child passes its correction
    to its ancestors as a delta.
    """
    num_levels = layout[0]
    if num_levels == 1:
        values[layout[_HEADER + 1]] = _reduce(values, 0, _width(layout, 0), OP_SUM)
        return
    level1 = layout[_HEADER + 2] - layout[_HEADER + 1]
    cursor = state[STATE_CURSOR]
    for _ in range(rows):
        node = cursor
        k = 0  # re-sum `node` of level k + 1 from its row at level k
        while True:
            width = _width(layout, k)
            slot = layout[_HEADER + k + 1] + node
            total = _reduce(values, layout[_HEADER + k] + node * width, width, OP_SUM)
            delta = total - values[slot]
            values[slot] = total
            if k + 1 == num_levels:
                break  # the root
            parent = _row(layout, k + 1, node)
            if node != (parent + 1) * _width(layout, k + 1) - 1:
                # Not its parent's last child: the parent is not re-summed next.
                if delta != 0.0:
                    if layout[2] >= 0:
                        cancelled = _add_up(values, layout, k + 1, node, delta)
                    else:
                        cancelled = _add_up_generic(values, layout, k + 1, node, delta)
                    if cancelled or total == 0.0:
                        resum_path(values, layout, k + 1, node)
                break
            node = parent
            k += 1
        cursor = cursor + 1 if cursor + 1 < level1 else 0
    state[STATE_CURSOR] = cursor


@numba.njit(cache=True, nogil=True, error_model="numpy")
def scrub_after(values, layout, state, writes):
    """The sweep's share after ``writes`` leaf writes: one leaf re-summed per leaf written,
    so every node is re-summed at least once per ``capacity`` leaf writes."""
    if writes > 0:
        scrub(values, layout, state, (writes + layout[1] - 1) // layout[1])


@numba.njit(cache=True, nogil=True, error_model="numpy")
def set_leaves(values, layout, state, op, idx, vals):
    """Write ``vals`` at ``idx`` in order (for a repeated index the last value wins).

    Returns the change in the number of non-zero leaves (sum trees), or ``BAD_INDEX`` /
    ``BAD_VALUE`` (nothing written) when an index is out of range or a sum-tree value is
    negative or not finite.
    """
    n = idx.shape[0]
    capacity = layout[3]
    for j in range(n):
        if idx[j] < 0 or idx[j] >= capacity:
            return BAD_INDEX
        if op == OP_SUM and not (vals[j] >= 0.0 and vals[j] < math.inf):
            return BAD_VALUE
    generic = layout[2] < 0
    # One loop per case, so that no loop holds a call (see the note above _add_up).
    if op != OP_SUM:
        if generic:
            for j in range(n):
                _extreme_write_generic(values, layout, op, idx[j], vals[j])
        elif op == OP_MAX:
            for j in range(n):
                max_write(values, layout, idx[j], vals[j])
        else:
            for j in range(n):
                min_write(values, layout, idx[j], vals[j])
        return 0
    nnz_delta = 0
    to_settle = np.empty(n, dtype=np.int64)
    count = 0
    if generic:
        for j in range(n):
            change, unsettled = _sum_write_generic(values, layout, idx[j], vals[j])
            nnz_delta += change
            to_settle[count] = idx[j]
            count += unsettled
    else:
        for j in range(n):
            change, unsettled = sum_write(values, layout, idx[j], vals[j])
            nnz_delta += change
            to_settle[count] = idx[j]
            count += unsettled
    settle(values, layout, to_settle, count)
    scrub_after(values, layout, state, n)
    state[STATE_NNZ] += nnz_delta
    return nnz_delta


@numba.njit(cache=True, nogil=True, error_model="numpy")
def find_sum_bound(values, layout, thresholds, out):
    """Smallest leaf whose inclusive prefix sum exceeds each threshold, into ``out``.

    All thresholds descend together, one level at a time. At each level a first pass
    loads every query's row without using the values, so the cache misses of all rows
    overlap (a 2^20-leaf tree does not fit in L2; descending one query at a time waits
    for each miss in turn, 2-3x slower with fresh thresholds). The second pass counts,
    without branches, the children whose running sum stays <= the threshold: that count
    is the child to enter, and a zero child (whose running sum repeats its left
    neighbour's) is never it. A threshold at or past a row's sum (rounding) takes the last
    child holding mass. Returns 0, or ``INCONSISTENT`` when a node holds mass but none of
    its children does (rounding left over by deltas; the caller re-sums the tree and
    searches again).
    """
    num_levels = layout[0]
    fanout = layout[1]
    n = thresholds.shape[0]
    total = values[values.shape[0] - 1]
    remaining = np.empty(n)
    for q in range(n):
        remaining[q] = min(max(thresholds[q], 0.0), total)
        out[q] = 0
    touched = 0.0
    for k in range(num_levels - 1, -1, -1):
        if k == num_levels - 1:
            width = layout[_HEADER + num_levels] - layout[_HEADER + k]
        else:
            width = fanout
        base = layout[_HEADER + k]
        for q in range(n):
            start = base + out[q] * width
            touched += values[start] + values[start + width - 1]
        for q in range(n):
            start = base + out[q] * width
            t = remaining[q]
            running = 0.0
            below = 0.0  # running sum before the chosen child
            count = 0
            for c in range(width):
                running += values[start + c]
                stays = running <= t
                count += stays
                below = running if stays else below
            if count < width and values[start + count] > 0.0:
                remaining[q] = t - below
                out[q] = out[q] * width + count
                continue
            chosen = width - 1
            while chosen >= 0 and not values[start + chosen] > 0.0:
                chosen -= 1
            if chosen < 0:
                return INCONSISTENT
            # Stay at the top end of the last child that holds mass.
            remaining[q] = np.nextafter(values[start + chosen], -math.inf)
            out[q] = out[q] * width + chosen
    if touched != touched:  # never true; keeps the first passes' loads from being dropped
        return INCONSISTENT
    return 0


@numba.njit(cache=True, nogil=True, error_model="numpy")
def prefix_sum(values, layout, indices, out):
    """Sum of the leaves strictly before each index (an index of ``capacity``: the total)."""
    num_levels = layout[0]
    capacity = layout[3]
    for q in range(indices.shape[0]):
        node = indices[q]
        if node == capacity:
            out[q] = values[values.shape[0] - 1]
            continue
        acc = 0.0
        for k in range(num_levels):
            width = _width(layout, k)
            row = _row(layout, k, node)
            start = layout[_HEADER + k] + row * width
            for c in range(node - row * width):
                acc += values[start + c]
            node = row
        out[q] = acc
