"""Compiled CPU kernels for ``SlotSampler`` (numba): one call per batch of events.

A priority update touches the learned priorities, the max tree (for
``initial_priority``), the sum tree and the min tree (for importance weights). Done with
numpy and one tree call each it costs a few dozen small operations of about a
microsecond; here it is one pass over the batch.

Every CPU leaf is computed by ``leaf_weight`` (numba's ``**``, which is libm's ``pow``),
whichever event computed it, so a leaf is bit-identical however it was reached (a
rebuilt buffer samples exactly like the one it was saved from).

Every kernel takes an event batch and then the sampler's state, always in this order:
numpy views ``current_pos, current_size, evicted, priority`` of the writer's and
sampler's tensors; ``params = [max_length, batch_length, num_earliest_frames_ignored,
prioritized]``; ``per = [alpha, epsilon, configured initial priority]``; the sum tree's
``values, layout, state``; the max and min trees' values (an empty array for an absent
tree).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from storage._sum_batch_kernels import void_pointer
from storage._tree_kernels import (
    STATE_NNZ,
    find_sum_bound,
    max_write,
    min_write,
    scrub_after,
    settle,
    sum_write,
)

OK = 0
BAD_ENV = 1
NOT_WRITTEN = 2
BAD_PRIORITY = 3

_MAX_LENGTH, _BATCH_LENGTH, _IGNORED, _PRIORITIZED = 0, 1, 2, 3
_ALPHA, _EPSILON, _INITIAL = 0, 1, 2


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def leaf_weight(priority, starts, params, per):
    """The sum-tree leaf of a slot: ``(priority + epsilon) ** alpha`` if it may start a
    sequence (1 when sampling uniformly), else 0."""
    if not starts:
        return 0.0
    if not params[_PRIORITIZED]:
        return 1.0
    base = priority + per[_EPSILON]
    return base if per[_ALPHA] == 1.0 else base ** per[_ALPHA]


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _starts(env, pos, slot, current_pos, current_size, evicted, params):
    """Whether stored (env, pos) may start a sequence of ``batch_length`` steps now."""
    current = current_pos[env]
    earliest = current - current_size[env]
    return (
        pos >= earliest + params[_IGNORED]
        and pos + params[_BATCH_LENGTH] <= current
        and not evicted[slot]
    )


@numba.njit(cache=True, nogil=True, error_model="numpy")
def update_priorities(
    env_ids,
    positions,
    priorities,
    current_pos,
    current_size,
    evicted,
    priority,
    params,
    per,
    sum_values,
    layout,
    sum_state,
    max_values,
    min_values,
    live,
):
    """Set learned priorities and the leaves they decide; ``live[j]``: update j applied.

    Checks everything first; then writes in input order (for a repeated slot the last
    update wins). Positions already overwritten are skipped. A slot whose priority does
    not change keeps its leaves, which already hold that priority's weight. Returns
    ``OK``, or (nothing written) ``BAD_ENV``, ``NOT_WRITTEN`` for a position never
    written, ``BAD_PRIORITY`` for a negative or non-finite priority.
    """
    n = env_ids.shape[0]
    num_envs = current_pos.shape[0]
    for j in range(n):
        env = env_ids[j]
        if env < 0 or env >= num_envs:
            return BAD_ENV
        if positions[j] >= current_pos[env]:
            return NOT_WRITTEN
        if not (priorities[j] >= 0 and priorities[j] < math.inf):
            return BAD_PRIORITY
    max_length = params[_MAX_LENGTH]
    nnz_delta = 0
    writes = 0
    to_settle = np.empty(n, dtype=np.int64)
    count = 0
    for j in range(n):
        env = env_ids[j]
        pos = positions[j]
        if pos < current_pos[env] - current_size[env]:
            live[j] = False
            continue
        live[j] = True
        slot = env * max_length + pos % max_length
        p = float(priorities[j])
        if priority[slot] == p:
            continue
        priority[slot] = p
        if max_values.shape[0]:
            max_write(max_values, layout, slot, p)
        starts = _starts(env, pos, slot, current_pos, current_size, evicted, params)
        w = leaf_weight(p, starts, params, per)
        change, unsettled = sum_write(sum_values, layout, slot, w)
        nnz_delta += change
        writes += 1
        if unsettled:
            to_settle[count] = slot
            count += 1
        if min_values.shape[0]:
            min_write(min_values, layout, slot, w if w > 0.0 else math.inf)
    settle(sum_values, layout, to_settle, count)
    scrub_after(sum_values, layout, sum_state, writes)
    sum_state[STATE_NNZ] += nnz_delta
    return OK


@numba.njit(cache=True, nogil=True, error_model="numpy")
def update_priorities_at(
    env_ids_address,
    positions_address,
    priorities_address,
    priorities_float32,
    n,
    current_pos,
    current_size,
    evicted,
    priority,
    params,
    per,
    sum_values,
    layout,
    sum_state,
    max_values,
    min_values,
    live,
):
    """``update_priorities`` reading the ``n`` elements of contiguous CPU tensors (int64
    env ids and positions, float32 or float64 priorities) at their addresses: making a
    numpy view of a tensor costs a third of a whole update."""
    env_ids = numba.carray(void_pointer(env_ids_address), n, np.int64)
    positions = numba.carray(void_pointer(positions_address), n, np.int64)
    state = (current_pos, current_size, evicted, priority, params, per)
    trees = (sum_values, layout, sum_state, max_values, min_values)
    if priorities_float32:
        priorities32 = numba.carray(void_pointer(priorities_address), n, np.float32)
        return update_priorities(env_ids, positions, priorities32, *state, *trees, live)
    priorities64 = numba.carray(void_pointer(priorities_address), n, np.float64)
    return update_priorities(env_ids, positions, priorities64, *state, *trees, live)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def refresh(
    env_ids,
    positions,
    current_pos,
    current_size,
    evicted,
    priority,
    params,
    per,
    sum_values,
    layout,
    sum_state,
    max_values,
    min_values,
):
    """Recompute the leaves of the (env, pos) pairs that are stored now."""
    max_length = params[_MAX_LENGTH]
    n = env_ids.shape[0]
    nnz_delta = 0
    to_settle = np.empty(n, dtype=np.int64)
    count = 0
    for j in range(n):
        env = env_ids[j]
        pos = positions[j]
        current = current_pos[env]
        if pos < current - current_size[env] or pos >= current:
            continue
        slot = env * max_length + pos % max_length
        starts = _starts(env, pos, slot, current_pos, current_size, evicted, params)
        w = leaf_weight(priority[slot], starts, params, per)
        change, unsettled = sum_write(sum_values, layout, slot, w)
        nnz_delta += change
        if unsettled:
            to_settle[count] = slot
            count += 1
        if min_values.shape[0]:
            min_write(min_values, layout, slot, w if w > 0.0 else math.inf)
    settle(sum_values, layout, to_settle, count)
    scrub_after(sum_values, layout, sum_state, n)
    sum_state[STATE_NNZ] += nnz_delta


@numba.njit(cache=True, nogil=True, error_model="numpy")
def on_write(
    env_ids,
    positions,
    current_pos,
    current_size,
    evicted,
    priority,
    params,
    per,
    sum_values,
    layout,
    sum_state,
    max_values,
    min_values,
):
    """New steps at (env, pos) (distinct envs, the writer already advanced).

    Each slot gets the initial priority and loses its eviction; then the leaves of the
    starts whose validity moved are recomputed: the new step itself (valid when
    ``batch_length`` is 1), the start whose sequence it completes, and the start that
    fell out of the ignored-earliest window.
    """
    max_length = params[_MAX_LENGTH]
    n = env_ids.shape[0]
    initial = per[_INITIAL]
    if params[_PRIORITIZED]:
        initial = max(initial, max_values[max_values.shape[0] - 1])
    for j in range(n):
        slot = env_ids[j] * max_length + positions[j] % max_length
        evicted[slot] = False
        if params[_PRIORITIZED]:
            priority[slot] = initial
            max_write(max_values, layout, slot, initial)
    candidates_env = np.empty(3 * n, dtype=np.int64)
    candidates_pos = np.empty(3 * n, dtype=np.int64)
    for j in range(n):
        env = env_ids[j]
        pos = positions[j]
        earliest = current_pos[env] - current_size[env]
        candidates_env[3 * j : 3 * j + 3] = env
        candidates_pos[3 * j] = pos
        candidates_pos[3 * j + 1] = pos - params[_BATCH_LENGTH] + 1
        candidates_pos[3 * j + 2] = earliest + params[_IGNORED] - 1
    refresh(
        candidates_env,
        candidates_pos,
        current_pos,
        current_size,
        evicted,
        priority,
        params,
        per,
        sum_values,
        layout,
        sum_state,
        max_values,
        min_values,
    )


@numba.njit(cache=True, nogil=True, error_model="numpy")
def all_leaves(current_pos, current_size, evicted, priority, params, per, sums, maxes, mins):
    """Every slot's leaves from scratch: sum-tree weight, priority if stored (max tree),
    weight or inf (min tree)."""
    max_length = params[_MAX_LENGTH]
    for env in range(current_pos.shape[0]):
        current = current_pos[env]
        earliest = current - current_size[env]
        for idx in range(max_length):
            slot = env * max_length + idx
            # The newest position stored (or last stored) at this index.
            pos = ((current - idx - 1) // max_length) * max_length + idx
            stored = pos >= earliest
            starts = stored and _starts(env, pos, slot, current_pos, current_size, evicted, params)
            w = leaf_weight(priority[slot], starts, params, per)
            sums[slot] = w
            if maxes.shape[0]:
                maxes[slot] = priority[slot] if stored else 0.0
            if mins.shape[0]:
                mins[slot] = w if w > 0.0 else math.inf


# ALF's bound that keeps stratified draws strictly below 1 in float32.
ONE_MINUS = 1.0 - 2.0**-23


@numba.njit(cache=True, nogil=True, error_model="numpy")
def sample_slots(u, stratified, sum_values, layout, out):
    """Slots drawn by leaf weight from uniform numbers ``u`` in [0, 1), into ``out``.

    Stratified: draw q lands in the q-th of ``n`` equal slices of the total mass
    (sorted, spread). Returns ``find_sum_bound``'s status.
    """
    n = u.shape[0]
    total = sum_values[sum_values.shape[0] - 1]
    thresholds = np.empty(n)
    for q in range(n):
        x = u[q]
        if stratified:
            x = min((x + q) / n, ONE_MINUS)
        thresholds[q] = x * total
    return find_sum_bound(sum_values, layout, thresholds, out)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def locate(slots, current_pos, max_length, env_ids, indices, positions):
    """Environment, ring index and (newest) position of each slot."""
    for j in range(slots.shape[0]):
        env = slots[j] // max_length
        idx = slots[j] - env * max_length
        env_ids[j] = env
        indices[j] = idx
        positions[j] = ((current_pos[env] - idx - 1) // max_length) * max_length + idx


@numba.njit(cache=True, nogil=True, error_model="numpy")
def importance_weights(slots, sum_values, nnz, smallest_leaf, beta, out):
    """ALF's ``N * P(i)`` (leaf over mean non-zero leaf) of each slot into float32 ``out``;
    with ``beta`` (not NaN), PER's ``(N * P(i)) ** -beta`` over its largest value."""
    scale = nnz / sum_values[sum_values.shape[0] - 1]
    smallest = smallest_leaf * scale
    for j in range(slots.shape[0]):
        ratio = sum_values[slots[j]] * scale
        if beta == beta:
            ratio = (ratio / smallest) ** -beta
        out[j] = ratio
