"""The datasets a replay store serves beside (hybrid) or instead of (offline) its experience.

Each dataset is loaded once, read-only, into :class:`storage.datasets.DatasetRows` (never
checkpointed: a restarted store loads it again from its files). A sample request gets
``offline_share`` of its rows from the datasets, split between them by ``dataset_weights``,
and the rest from the replay buffer; the rows are shuffled together, so each mini-batch of a
request holds both kinds. Dataset rows carry env ids past the store's own
(``num_environments + i`` for dataset ``i``), so the priorities a learner sends back for them
are recognised and ignored: a dataset is never re-prioritized.
"""

from __future__ import annotations

import numpy as np

from nodes._common import experience_schema
from nodes._datasets import check_dataset
from storage.datasets import DatasetRows


class OfflineRows:
    """The store's datasets, sampled together by weight."""

    def __init__(self, config, first_env_id: int):
        agent = config.agent
        if agent is None:
            raise ValueError("replay_store datasets need the graph's agent (its experience "
                             "schema)")
        spec = {name: (f.shape, np.dtype(f.dtype))
                for name, f in experience_schema(agent).fields.items()}
        caps = config.dataset_caps or [None] * len(config.datasets)
        self.parts = [DatasetRows(check_dataset(path, agent), spec, cap, first_env_id + i)
                      for i, (path, cap) in enumerate(zip(config.datasets, caps, strict=True))]
        weights = np.asarray(config.dataset_weights or [1.0] * len(self.parts), np.float64)
        self.weights = weights / weights.sum()
        self.share = config.offline_share
        self.first_env_id = first_env_id
        self.rng = np.random.default_rng(config.seed + 7919)  # apart from the buffer's draws

    @property
    def size(self) -> int:
        return sum(part.size for part in self.parts)

    def rows_of(self, batch_size: int) -> int:
        """How many of a batch's rows come from the datasets."""
        return batch_size if self.share >= 1.0 else int(round(self.share * batch_size))

    def sample(self, count: int, length: int) -> tuple[dict, np.ndarray, np.ndarray]:
        """``count`` windows across the datasets: ``(fields [count, length, ...], env_ids,
        positions)``."""
        counts = self.rng.multinomial(count, self.weights) if len(self.parts) > 1 else [count]
        fields, env_ids, positions = [], [], []
        for part, n in zip(self.parts, counts, strict=True):
            if n == 0:
                continue
            rows, starts = part.sample(int(n), length, self.rng)
            fields.append(rows)
            positions.append(starts)
            env_ids.append(np.full(int(n), self.first_env_id + self.parts.index(part), np.int64))
        merged = {k: np.concatenate([f[k] for f in fields]) for k in fields[0]}
        return merged, np.concatenate(env_ids), np.concatenate(positions).astype(np.int64)

    def describe(self) -> list[dict]:
        return [{"path": part.dataset.path, "steps": part.size, "weight": float(w),
                 "env_id": self.first_env_id + i}
                for i, (part, w) in enumerate(zip(self.parts, self.weights, strict=True))]
