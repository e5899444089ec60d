"""What a replay store does differently as one shard of several (Ape-X's sharded replay).

Experience reaches the shards over a partitioned ``experience`` topic keyed by runner, so each
runner's environments live in one shard. A shard holds only those: it numbers them locally in
the order they first arrive (``ShardEnvs``), so ``num_environments`` is what one shard holds,
not the whole graph; sampled ``env_ids`` are local ids, and the learner sends priority updates
back to the shard that drew them, where they mean the same environments.

Each sample reply carries the shard's sampling mass (``sample_mass``), from which the learner
splits its next batch across shards and rescales importance weights to what one store holding
everything would give (``storage.sharding``).
"""

from __future__ import annotations

import json
import os

import numpy as np


class ShardEnvs:
    """Global environment id -> this shard's local id, assigned on first sight and kept for
    the shard's life: in its checkpoints, and beside a memory-mapped ``storage_dir``."""

    FILE = "shard_envs.json"

    def __init__(self, capacity: int, storage_dir: str | None = None):
        self.capacity, self.storage_dir = capacity, storage_dir
        self.local: dict[int, int] = {}
        if storage_dir is not None and os.path.exists(self._path()):
            with open(self._path()) as f:
                self.local = {int(k): int(v) for k, v in json.load(f).items()}

    def _path(self) -> str:
        return os.path.join(self.storage_dir, self.FILE)

    def to_local(self, env_ids: np.ndarray) -> np.ndarray:
        """Local ids of ``env_ids``; a ValueError once more environments arrive than fit."""
        local, added = self.local, False
        for g in env_ids.tolist():
            if g not in local:
                if len(local) >= self.capacity:
                    raise ValueError(
                        f"experience for a {len(local) + 1}th environment (global id {g}) but "
                        f"this replay_store shard holds num_environments {self.capacity}")
                local[g] = len(local)
                added = True
        if added and self.storage_dir is not None:
            self._save()
        return np.fromiter((local[g] for g in env_ids.tolist()), np.int64, len(env_ids))

    def _save(self) -> None:
        os.makedirs(self.storage_dir, exist_ok=True)
        tmp = self._path() + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.local, f)
        os.replace(tmp, self._path())  # a kill never leaves half a map

    def state(self) -> dict:
        return {str(k): v for k, v in self.local.items()}

    def restore(self, state: dict | None) -> None:
        if state:
            self.local = {int(k): int(v) for k, v in state.items()}


def sample_mass(buffer, credit: float = 0.0) -> list:
    """``[total, count, smallest leaf, beta, credit]`` of the buffer's sampling distribution
    right after a draw (``ReplayBuffer.sampling_mass``); beta is -1 when weights do not use
    it; ``credit`` is the shard's own rate-limiter balance (samples it may still give)."""
    total, count, smallest, beta = buffer.sampling_mass()
    return [total, count, smallest, -1.0 if beta is None else beta, float(credit)]
