"""Whole-episode storage with fixed-length window sampling (DI-engine's EpisodeReplayBuffer).

Each entry is one episode: a nest of tensors with a leading time dimension. ``sample``
draws windows of ``window`` consecutive steps uniformly over every window that fits in
a stored episode (an episode of length T offers T - window + 1), so long episodes are
not under-sampled the way "pick an episode, then a window" would.
"""

from __future__ import annotations

import torch

from storage.nest import map_structure


class EpisodeReplayBuffer:
    def __init__(self, max_episodes: int, device="cpu", seed: int | None = None):
        if max_episodes < 1:
            raise ValueError("max_episodes must be positive")
        self.max_episodes = int(max_episodes)
        self.device = torch.device(device)
        self._episodes: list = []
        self._lengths: list[int] = []
        self._next = 0  # ring cursor once full
        self._pushed = 0
        self._generator = torch.Generator(device="cpu")
        self._generator.manual_seed(
            seed if seed is not None else int(torch.randint(0, 2**62, (1,)))
        )

    def __len__(self) -> int:
        return len(self._episodes)

    def count(self) -> int:
        return len(self._episodes)

    @property
    def push_count(self) -> int:
        return self._pushed

    def push(self, episode) -> None:
        """Store one episode (overwrites the oldest when full)."""
        lengths = set()
        map_structure(lambda t: lengths.add(int(t.shape[0])), episode)
        if len(lengths) != 1:
            raise ValueError(f"episode fields disagree on length: {sorted(lengths)}")
        episode = map_structure(lambda t: t.to(self.device), episode)
        length = lengths.pop()
        if len(self._episodes) < self.max_episodes:
            self._episodes.append(episode)
            self._lengths.append(length)
        else:
            self._episodes[self._next] = episode
            self._lengths[self._next] = length
            self._next = (self._next + 1) % self.max_episodes
        self._pushed += 1

    def sample(self, batch_size: int, window: int):
        """``(data [batch_size, window, ...], episode_ids, starts)``."""
        lengths = torch.tensor(self._lengths, dtype=torch.int64)
        counts = (lengths - window + 1).clamp(min=0)
        total = int(counts.sum())
        if total == 0:
            raise ValueError(f"no stored episode has {window} steps")
        flat = torch.randint(total, (batch_size,), generator=self._generator)
        ends = torch.cumsum(counts, 0)
        episode_ids = torch.searchsorted(ends, flat, right=True)
        starts = flat - (ends[episode_ids] - counts[episode_ids])
        windows = [
            map_structure(lambda t, s=int(s): t[s : s + window], self._episodes[int(e)])
            for e, s in zip(episode_ids, starts, strict=True)
        ]
        data = map_structure(lambda *ts: torch.stack(ts), *windows)
        return data, episode_ids, starts

    def clear(self) -> None:
        self._episodes.clear()
        self._lengths.clear()
        self._next = 0

    def state_dict(self) -> dict:
        return {
            "episodes": [map_structure(lambda t: t.clone(), e) for e in self._episodes],
            "lengths": list(self._lengths),
            "next": self._next,
            "pushed": self._pushed,
            "rng": self._generator.get_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        self._episodes = [map_structure(lambda t: t.to(self.device), e) for e in state["episodes"]]
        self._lengths = list(state["lengths"])
        self._next = int(state["next"])
        self._pushed = int(state["pushed"])
        self._generator.set_state(state["rng"])
