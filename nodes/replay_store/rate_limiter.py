"""The replay store's samples-per-insert rate limiter (Reverb's), shard-aware."""

from __future__ import annotations

import asyncio


class RateLimiter:
    """Reverb-style samples-per-insert limiter (disabled when ``spi`` is None)."""

    def __init__(self, spi: float | None, tolerance: float, min_size: int):
        self.spi, self.tolerance, self.min_size = spi, tolerance, min_size
        self.inserted = 0
        self.sampled = 0
        self.sampler_active = True  # False once the learner said it left: stop holding inserts
        # True while a sample request waits because nothing is sampleable (all evicted or
        # stale): only new data can help, so inserts are not held back meanwhile.
        self.starved = False
        self.changed = asyncio.Event()
        # A shard of several: the other shards' ``own_diff`` as the learner last heard them.
        # The limit is on the sum (one store's), so a shard the learner drew from more than
        # its share never waits on a shard drawn from less: each alone would deadlock.
        self.others = 0.0

    def own_diff(self) -> float:
        return max(0, self.inserted - self.min_size) * self.spi - self.sampled

    def _diff(self) -> float:
        return self.own_diff() + self.others

    def can_sample(self, items: int) -> bool:
        if self.inserted < self.min_size:
            return False
        return self.spi is None or self._diff() - items >= -self.tolerance

    def can_insert(self, items: int) -> bool:
        if (self.spi is None or not self.sampler_active or self.starved
                or self.inserted + items <= self.min_size):
            return True
        return self._diff() + items * self.spi <= self.tolerance

    def on_insert(self, items: int) -> None:
        self.inserted += items
        self.changed.set()

    def on_sample(self, items: int) -> None:
        self.sampled += items
        self.changed.set()
