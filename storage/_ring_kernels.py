"""Compiled CPU kernel for ``RingWriter`` (numba): claim one position per environment.

Appending a step for each of 16 environments is a handful of index operations; run as
torch operations (range and distinctness checks, advancing two cursors, slot numbers)
they cost about a hundred microseconds, here one call.
"""

from __future__ import annotations

import numba
import numpy as np

BAD_ENV = -1
DUPLICATE_ENV = -2
FULL = -3


@numba.njit(cache=True, nogil=True, error_model="numpy")
def advance(env_ids, current_pos, current_size, max_length, blocking, positions, slots):
    """Claim the next position of each environment into ``positions`` (and its slot
    ``env * max_length + pos % max_length`` into ``slots``).

    Returns how many of the claimed slots held a step (now overwritten), or, with nothing
    changed, ``BAD_ENV`` (an id out of range), ``DUPLICATE_ENV`` (an id twice), ``FULL``
    (``blocking`` and a ring is full).
    """
    n = env_ids.shape[0]
    num_envs = current_pos.shape[0]
    seen = np.zeros(num_envs, dtype=np.bool_)
    for j in range(n):
        env = env_ids[j]
        if env < 0 or env >= num_envs:
            return BAD_ENV
        if seen[env]:
            return DUPLICATE_ENV
        seen[env] = True
        if blocking and current_size[env] >= max_length:
            return FULL
    overwritten = 0
    for j in range(n):
        env = env_ids[j]
        pos = current_pos[env]
        positions[j] = pos
        slots[j] = env * max_length + pos % max_length
        current_pos[env] = pos + 1
        if current_size[env] >= max_length:
            overwritten += 1
        else:
            current_size[env] += 1
    return overwritten
