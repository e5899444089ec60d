"""Compiled CPU kernels for ``FusedRingWriter`` (numba): claim, then commit, one position
per environment.

Appending a step for each of 16 environments is a handful of index operations; run as
torch operations (range and distinctness checks, advancing two cursors, slot numbers)
they cost about a hundred microseconds, here two calls. Claiming and committing are
separate so the cursors move only after the slots' data is written (see
``RingWriter``).
"""

from __future__ import annotations

import numba
import numpy as np

BAD_ENV = -1
DUPLICATE_ENV = -2
FULL = -3


@numba.njit(cache=True, nogil=True, error_model="numpy")
def claim(env_ids, current_pos, current_size, max_length, blocking, positions, slots):
    """The next position of each environment into ``positions`` (and its slot
    ``env * max_length + pos % max_length`` into ``slots``). ``current_pos`` does not
    move; a full ring drops its oldest step (whose slot is claimed) from ``current_size``.

    Returns how many of the claimed slots held a step (to be overwritten), or, with
    nothing changed, ``BAD_ENV`` (an id out of range), ``DUPLICATE_ENV`` (an id twice),
    ``FULL`` (``blocking`` and a ring is full).
    """
    n = env_ids.shape[0]
    num_envs = current_pos.shape[0]
    seen = np.zeros(num_envs, dtype=np.bool_)
    overwritten = 0
    for j in range(n):
        env = env_ids[j]
        if env < 0 or env >= num_envs:
            return BAD_ENV
        if seen[env]:
            return DUPLICATE_ENV
        seen[env] = True
        if current_size[env] >= max_length:
            if blocking:
                return FULL
            overwritten += 1
        pos = current_pos[env]
        positions[j] = pos
        slots[j] = env * max_length + pos % max_length
    for j in range(n):
        env = env_ids[j]
        if current_size[env] >= max_length:
            current_size[env] -= 1
    return overwritten


@numba.njit(cache=True, nogil=True, error_model="numpy")
def commit(env_ids, current_pos, current_size, max_length):
    """Advance the cursors of ``env_ids`` (distinct, checked by ``claim``) by one step."""
    for j in range(env_ids.shape[0]):
        env = env_ids[j]
        current_pos[env] += 1
        current_size[env] += 1
