"""Compiled CPU kernels for the wide segment trees (optional: needs numba).

A C++ tree (cpprb, TorchRL) updates 256 leaves in about 10 µs because each step is a few
machine instructions; numpy pays about a microsecond per call, so even a four-level wide
tree costs tens of microseconds. These kernels walk the same layout as the numpy and
torch kernels in ``segment_tree.py`` (same node values, same prefix rows), compiled once
per machine (numba's on-disk cache). ``segment_tree`` falls back to numpy when numba is
not installed.

Layout reminders: ``values`` holds level after level and the root in its last slot;
level k starts at ``offsets[k]`` and is split into rows of ``widths[k]`` nodes. For sum
trees, ``prefix`` holds for every row a leading 0 then the running sums of the row; the
row of level k starting node ``r * widths[k]`` begins at ``prefix_offsets[k] +
r * (widths[k] + 1)``.
"""

from __future__ import annotations

import math

import numba
import numpy as np

OP_SUM, OP_MIN, OP_MAX = 0, 1, 2


BAD_INDEX = -(2**62)
BAD_VALUE = -(2**62) + 1


@numba.njit(cache=True, nogil=True)
def set_leaves(
    values,
    prefix,
    offsets,
    prefix_offsets,
    widths,
    row_offsets,
    stamps,
    stamp,
    op,
    capacity,
    idx,
    vals,
):
    """Write ``vals`` at ``idx`` and refresh every ancestor once.

    Writes happen in input order, so for a duplicated index the last value wins and the
    non-zero count moves once per real change. Rows to refresh are deduplicated with
    ``stamps`` (one slot per row of every level, ``row_offsets[k]`` for level k): a row
    whose slot already holds this call's ``stamp`` is skipped, which avoids a sort.

    Returns the change in the number of non-zero leaves, or ``BAD_INDEX`` /
    ``BAD_VALUE`` (nothing written) when an index is out of range or a sum-tree value
    is negative or not finite.
    """
    n = idx.shape[0]
    for j in range(n):
        if idx[j] < 0 or idx[j] >= capacity:
            return BAD_INDEX
        if op == OP_SUM and not (vals[j] >= 0.0 and vals[j] < math.inf):
            return BAD_VALUE
    touched = np.empty(n, dtype=np.int64)
    nnz_delta = 0
    for j in range(n):
        i = idx[j]
        v = vals[j]
        nnz_delta += (1 if v != 0.0 else 0) - (1 if values[i] != 0.0 else 0)
        values[i] = v
        touched[j] = i
    m = n
    num_levels = widths.shape[0]
    root = values.shape[0] - 1
    for k in range(num_levels):
        w = widths[k]
        m_next = 0
        for j in range(m):
            r = touched[j] // w
            slot = row_offsets[k] + r
            if stamps[slot] == stamp:
                continue
            stamps[slot] = stamp
            base = offsets[k] + r * w
            if op == OP_SUM:
                pbase = prefix_offsets[k] + r * (w + 1)
                acc = 0.0
                prefix[pbase] = 0.0
                for c in range(w):
                    acc += values[base + c]
                    prefix[pbase + 1 + c] = acc
            elif op == OP_MIN:
                acc = values[base]
                for c in range(1, w):
                    acc = min(acc, values[base + c])
            else:
                acc = values[base]
                for c in range(1, w):
                    acc = max(acc, values[base + c])
            if k + 1 < num_levels:
                values[offsets[k + 1] + r] = acc
            else:
                values[root] = acc
            touched[m_next] = r
            m_next += 1
        m = m_next
    return nnz_delta


@numba.njit(cache=True, nogil=True)
def find_sum_bound(values, prefix, prefix_offsets, widths, thresholds):
    """Smallest leaf index whose inclusive prefix sum exceeds each threshold."""
    n = thresholds.shape[0]
    out = np.empty(n, dtype=np.int64)
    total = values[values.shape[0] - 1]
    num_levels = widths.shape[0]
    for q in range(n):
        t = min(max(thresholds[q], 0.0), total)
        node = 0
        for k in range(num_levels - 1, -1, -1):
            w = widths[k]
            pbase = prefix_offsets[k] + node * (w + 1)
            last = prefix[pbase + w]
            if t >= last:
                # Reached (or rounded past) the row's total: stop at the last child
                # that holds mass, never on a zero leaf.
                t = np.nextafter(last, -math.inf)
            # Smallest c with prefix[pbase + 1 + c] > t; it exists since t < last.
            lo = 0
            hi = w - 1
            while lo < hi:
                mid = (lo + hi) // 2
                if prefix[pbase + 1 + mid] > t:
                    hi = mid
                else:
                    lo = mid + 1
            t -= prefix[pbase + lo]
            node = node * w + lo
        out[q] = node
    return out
