"""Emphasizing Recent Experience (Wang & Ross 2019; pytorchrl's EREBuffer).

Within a round of K updates, update k samples only from the most recent
``c_k = max(N * eta ** (k * 1000 / K), cmin)`` steps of an N-step buffer: early updates
see (almost) everything, late ones mostly fresh data. ERE is a window, so it is a
``sample_range`` for ``ReplayBuffer.get_batch`` and combines with PER and n-step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ERE:
    eta: float = 0.996
    cmin: int = 5000

    def recent_count(self, buffer_size: int, update_index: int, num_updates: int) -> int:
        """c_k: how many of the newest steps update ``update_index`` of ``num_updates`` uses."""
        if num_updates < 1 or not 0 <= update_index < num_updates:
            raise ValueError("need 0 <= update_index < num_updates")
        c = int(buffer_size * self.eta ** (update_index * 1000 / num_updates))
        return min(buffer_size, max(c, self.cmin))

    def sample_range(self, buffer, update_index: int, num_updates: int) -> slice:
        """The per-environment ``sample_range`` for ``buffer.get_batch``.

        The window is split evenly across environments (each keeps its newest
        ``ceil(c_k / num_environments)`` steps), which is exact when they are fed evenly.
        """
        c = self.recent_count(int(buffer.total_size), update_index, num_updates)
        per_env = max(1, math.ceil(c / buffer.num_environments))
        return slice(-per_env, None)
