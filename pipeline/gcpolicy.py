"""The garbage-collector settings of a node process.

Why: a node that moves many small messages allocates hundreds of thousands of short-lived
container objects a second (messages, envelopes, lists). With CPython's default thresholds
(a young collection every 700 allocations, an older one every 10 of those) the collector ran
so often, and over every module object loaded at start-up, that it cost a subscriber of 64-byte
messages 0.5-0.7 µs of its ~2 µs per message. Nothing a node keeps is freed by the collector
anyway: messages are plain acyclic objects freed by reference counting.

So a node process collects the young generation every :data:`YOUNG_THRESHOLD` allocations
instead, and once it is set up (its imports, networks and buffers made) it freezes what exists
into the permanent generation, which collections never scan. Cycles are still collected; they
wait a little longer.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000  # container allocations between young collections (CPython: 700)
OLDER_THRESHOLDS = (20, 100)  # young collections per middle one, middle per full one


def configure() -> None:
    """Fewer collections: call once at process start."""
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)


def settle() -> None:
    """Everything made so far lives for the whole process: never scan it again."""
    gc.freeze()
