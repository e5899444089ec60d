"""ALF's ``RingBuffer``: the storage parts (``RingStorage`` bytes, ``RingWriter`` slots, the
backend's sampler and ``EpisodeIndex``) behind ALF's FIFO names, plus ``SlotInfo``. The replay
sampling, priorities and controls on top of it are :class:`storage.replay_buffer.ReplayBuffer`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from storage import arrays
from storage.allocator import MemoryAllocator, MmapAllocator
from storage.backend import select_backend
from storage.nest import leaves
from storage.ring import RingStorage


class BatchInfo(NamedTuple):
    """What ``get_batch`` says about each sampled sequence (ALF's fields, shapes [B])."""

    env_ids: torch.Tensor = ()
    positions: torch.Tensor = ()
    importance_weights: torch.Tensor = ()
    replay_buffer: object = ()
    discounted_return: torch.Tensor = ()


class SlotInfo:
    """Per-slot counters the controls read: times sampled, and collecting version."""

    def __init__(self, num_slots: int, allocator):
        self.use_count = allocator.tensor("slots.use_count", (num_slots,), torch.int64)
        self.version = allocator.tensor("slots.version", (num_slots,), torch.int64)
        on_cpu = arrays.numpy_views(self.use_count.device)
        self._use_count = self.use_count.numpy() if on_cpu else self.use_count
        self._version = self.version.numpy() if on_cpu else self.version

    def on_write(self, slots, version: int) -> None:
        """Fresh steps in ``slots`` (numpy on a CPU): never used, collected by ``version``."""
        self._use_count[slots] = 0
        self._version[slots] = int(version)

    def state_dict(self) -> dict:
        return {"use_count": self.use_count.clone(), "version": self.version.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.use_count.copy_(state["use_count"])
        self.version.copy_(state["version"])


class RingBuffer:
    """Per-environment rings of a nest of tensors (ALF's ``alf.utils.data_buffer``).

    Args:
        data_spec: nest of ``TensorSpec`` describing one step.
        num_environments: number of rings.
        max_length: steps kept per environment.
        device: where every tensor lives.
        allow_multiprocess: ALF's flag for a buffer shared by processes. Not supported:
            ``True`` raises; a buffer that must outlive its process uses ``storage_dir``.
        storage_dir: if given, all arrays live in memory-mapped files there, and a
            buffer built again on the same directory re-attaches to them.
        backend: ``"fused"`` (numba kernels) or ``"reference"`` (numpy/torch); the
            default is fused wherever it can run (see ``storage.backend``).
    """

    def __init__(
        self,
        data_spec,
        num_environments: int,
        max_length: int = 1024,
        device="cpu",
        allow_multiprocess: bool = False,
        name: str = "RingBuffer",
        storage_dir: str | None = None,
        *,
        backend: str | None = None,
        tree_backend: str | None = None,
    ):
        if num_environments < 1 or max_length < 1:
            raise ValueError("num_environments and max_length must be positive")
        if allow_multiprocess:
            raise ValueError(
                "allow_multiprocess=True is not supported: one process owns a buffer; use "
                "storage_dir=... for one that outlives its process"
            )
        self._name = name
        self._num_envs = int(num_environments)
        self._max_length = int(max_length)
        self._device = torch.device(device)
        if storage_dir is not None and self._device.type != "cpu":
            raise ValueError("memory-mapped storage lives on the CPU")
        self._allocator = (
            MmapAllocator(storage_dir) if storage_dir else MemoryAllocator(self._device)
        )
        self.data_spec = data_spec
        self.backend = select_backend(self._device, backend, tree_backend)
        self.storage = RingStorage(data_spec, self._num_envs, self._max_length, self._allocator)
        self.writer = self.backend.writer(self._num_envs, self._max_length, self._allocator)

    # ------------------------------------------------------------------ basics
    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def name(self) -> str:
        return self._name

    @property
    def num_environments(self) -> int:
        return self._num_envs

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def total_size(self) -> torch.Tensor:
        """Total number of steps stored, over all environments."""
        return self.writer.current_size.sum()

    @property
    def reattached(self) -> bool:
        """True if this buffer mapped existing files (``storage_dir`` re-attach)."""
        return bool(getattr(self._allocator, "reattached", ()))

    def circular(self, pos):
        return pos % self._max_length

    def _env_ids(self, env_ids, batch_size: int | None = None) -> torch.Tensor:
        if env_ids is None:
            if batch_size is not None and batch_size != self._num_envs:
                raise ValueError(
                    f"env_ids=None needs a batch of num_environments={self._num_envs}, "
                    f"got {batch_size}"
                )
            return torch.arange(self._num_envs, device=self._device)
        env_ids = torch.as_tensor(env_ids, dtype=torch.int64, device=self._device).reshape(-1)
        if env_ids.numel() and bool((env_ids.min() < 0) | (env_ids.max() >= self._num_envs)):
            raise ValueError(f"env_ids must lie in [0, {self._num_envs})")
        return env_ids

    def get_earliest_position(self, env_ids):
        return self.writer.earliest(self._env_ids(env_ids))

    def get_current_position(self):
        return self.writer.current_pos.clone()

    # ------------------------------------------------------------------ ring ops
    def enqueue(self, batch, env_ids=None, blocking: bool = False) -> torch.Tensor:
        """Write one step per environment; returns the positions written."""
        claim = self.writer.claim(env_ids, _batch_size(batch), blocking)
        self.storage.write_slots(claim.slots, batch)
        self.writer.commit(claim)  # only now: a kill before this exposes nothing
        return torch.as_tensor(claim.positions)

    def dequeue(self, env_ids=None, n: int = 1, blocking: bool = False):
        """Remove and return the earliest ``n`` steps of each environment, ``[B, n, ...]``.

        Nothing enqueues concurrently, so a ``blocking`` dequeue of missing steps would
        wait forever: it raises ``RuntimeError`` (ALF's non-blocking one asserts; here
        ``ValueError``)."""
        env_ids = self._env_ids(env_ids)
        if bool((self.writer.current_size[env_ids] < n).any()):
            if blocking:
                raise RuntimeError(f"blocking dequeue of {n} steps: nothing enqueues concurrently")
            raise ValueError(f"not every environment holds {n} steps to dequeue")
        start = self.writer.earliest(env_ids)
        idx = (start[:, None] + torch.arange(n, device=self._device)) % self._max_length
        result = self.storage.read(env_ids[:, None], idx)
        self.writer.remove_oldest(env_ids, n)
        self._after_remove(env_ids, n)
        return result

    def remove_up_to(self, n: int, env_ids=None) -> None:
        """Drop up to ``n`` earliest steps of each environment."""
        env_ids = self._env_ids(env_ids)
        removed = torch.clamp(self.writer.current_size[env_ids], max=n)
        self.writer.current_size[env_ids] -= removed
        self._after_remove(env_ids, int(removed.sum()))

    def _after_remove(self, env_ids, count: int) -> None:
        """Hook for the replay buffer (its sampler must forget the removed steps)."""

    def clear(self, env_ids=None) -> None:
        """Empty all rings, or those of ``env_ids`` (positions keep growing)."""
        env_ids = self._env_ids(env_ids)
        self.writer.current_size[env_ids] = 0

    def gather_all(self, ignore_earliest_frames: bool = False, convert_to_default_device=True):
        """Every stored step, ``[num_environments, size, ...]``; sizes must be equal.

        The buffer's device is the default device here, so ``convert_to_default_device``
        has nothing to convert either way."""
        sizes = self.writer.current_size
        size = int(sizes.min())
        if size != int(sizes.max()):
            raise ValueError(
                f"environments hold different numbers of steps (min {size}, "
                f"max {int(sizes.max())}); gather_all needs them equal"
            )
        envs = torch.arange(self._num_envs, device=self._device)
        start = self.writer.earliest(envs)
        skip = getattr(self, "_num_earliest_frames_ignored", 0) if ignore_earliest_frames else 0
        if ignore_earliest_frames and size and size <= skip:
            raise ValueError(f"only {size} steps per environment, asked to ignore {skip}")
        start = start + skip if size else start
        length = max(size - skip, 0) if size else 0
        idx = (start[:, None] + torch.arange(length, device=self._device)) % self._max_length
        result = self.storage.read(envs[:, None], idx)
        info = BatchInfo(env_ids=envs, positions=start, replay_buffer=self)
        return result, info

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return {"writer": self.writer.state_dict(), "storage": self.storage.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.writer.load_state_dict(state["writer"])
        self.storage.load_state_dict(state["storage"])

    def flush(self) -> None:
        """Push memory-mapped pages to disk (no-op in memory)."""
        self._allocator.flush()

    def close(self) -> None:
        """Release a memory-mapped ``storage_dir`` for another writer (flushes first)."""
        self._allocator.flush()
        self._allocator.close()


def _batch_size(batch) -> int:
    if type(batch) is dict:  # the flat dict the replay store writes: no nest walk
        try:
            sizes = {v.shape[0] for v in batch.values()}
        except AttributeError:  # nested
            sizes = {int(t.shape[0]) for t in leaves(batch)}
    else:
        sizes = {int(t.shape[0]) for t in leaves(batch)}
    if len(sizes) != 1:
        raise ValueError(f"every tensor of a batch needs the same leading size, got {sizes}")
    return sizes.pop()
