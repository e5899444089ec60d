"""Storage and writer: per-environment rings of time steps.

Terminology (ALF's): a *position* ``pos`` counts the steps an environment has ever
written and only grows; its *index* ``idx = pos % max_length`` is the ring slot holding
it. An environment's stored positions are ``[current_pos - current_size, current_pos)``.
A *slot* number ``env_id * max_length + idx`` names one ring slot across environments
(it is the leaf number in the samplers' trees).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from storage.allocator import MemoryAllocator
from storage.nest import flatten_with_paths, get_field, is_namedtuple, map_structure

try:  # numba is a dependency; without it (a broken install) appends run on torch.
    from storage import _ring_kernels
except ImportError:  # pragma: no cover - exercised where numba is absent
    _ring_kernels = None

FULL_RING = "blocking enqueue on a full ring: nothing dequeues concurrently"


class Claim(NamedTuple):
    """Positions claimed for one step per environment: numpy arrays from the fused writer,
    tensors from the reference one. ``overwritten`` counts claimed slots holding a step."""

    env_ids: object
    positions: object
    slots: object
    overwritten: int


class RingStorage:
    """Where the bytes are: one ``[num_envs, max_length, *shape]`` tensor per field."""

    def __init__(self, data_spec, num_envs: int, max_length: int, allocator=None):
        self.data_spec = data_spec
        self.num_envs = num_envs
        self.max_length = max_length
        self.allocator = allocator or MemoryAllocator()
        self.device = self.allocator.device
        self.data = map_structure(self._make_field, data_spec, _paths(data_spec))
        # On a CPU, reads gather rows with numpy from flat views of the same memory
        # (torch's index_select and reshapes cost several microseconds per field).
        num_slots = num_envs * max_length
        self._host = (
            map_structure(lambda t: t.numpy().reshape((num_slots,) + t.shape[2:]), self.data)
            if self.device.type == "cpu"
            else None
        )
        # A flat dict of fields (what the replay store keeps) is written key by key, without
        # walking the nest (add_batch's largest cost was that walk).
        self._host_items = (
            list(self._host.items())
            if self._host is not None
            and isinstance(self._host, dict)
            and all(isinstance(v, np.ndarray) for v in self._host.values())
            else None
        )

    def _make_field(self, spec, path):
        return self.allocator.tensor(
            f"data.{path}", (self.num_envs, self.max_length) + spec.shape, spec.dtype
        )

    def write_slots(self, slots, batch) -> None:
        """Store ``batch[i]`` at flat slot ``slots[i]`` (numpy on a CPU, else a tensor)."""
        if self._host_items is not None and type(batch) is dict:
            slots = host_array(slots)
            for key, flat in self._host_items:
                value = batch[key]
                flat[slots] = value if type(value) is np.ndarray else host_array(value)
            return
        if self._host is not None:
            slots = host_array(slots)

            def put_host(flat, value):
                flat[slots] = host_array(value)

            map_structure(put_host, self._host, batch)
            return
        num_slots = self.num_envs * self.max_length

        def put(buf, value):
            flat = buf.view((num_slots,) + buf.shape[2:])
            flat[slots] = torch.as_tensor(value).to(device=buf.device, dtype=buf.dtype)

        map_structure(put, self.data, batch)

    def read(self, env_ids: torch.Tensor, idx: torch.Tensor):
        """Steps at (``env_ids``, ``idx``); ``env_ids`` broadcasts against ``idx``."""
        slots = (env_ids * self.max_length + idx).reshape(-1)
        shape = tuple(b if a == 1 else a for a, b in zip(env_ids.shape, idx.shape, strict=True))

        def take(buf):
            flat = buf.reshape((self.num_envs * self.max_length,) + buf.shape[2:])
            return flat.index_select(0, slots).reshape(shape + buf.shape[2:])

        return map_structure(take, self.data)

    def read_slots(self, slots: torch.Tensor, shape: tuple):
        """Steps at flat slot numbers ``env * max_length + idx``, reshaped to ``shape``."""
        if self._host is not None:
            idx = slots.numpy() if isinstance(slots, torch.Tensor) else slots
            shape = tuple(shape)
            return map_structure(
                lambda flat: torch.from_numpy(
                    flat.take(idx, axis=0).reshape(shape + flat.shape[1:])
                ),
                self._host,
            )

        def take(buf):
            flat = buf.reshape((self.num_envs * self.max_length,) + buf.shape[2:])
            return flat.index_select(0, slots).reshape(tuple(shape) + buf.shape[2:])

        return map_structure(take, self.data)

    def field(self, path: str):
        return get_field(self.data, path)

    def state_dict(self) -> dict:
        return {path: t.clone() for path, t in flatten_with_paths(self.data)}

    def load_state_dict(self, state: dict) -> None:
        for path, t in flatten_with_paths(self.data):
            t.copy_(state[path])


class RingWriter:
    """Which slot is written next: per-environment ``current_pos``/``current_size``.

    An append is ``claim`` (positions and slots; a full ring first stops counting the
    oldest step, whose slot is about to be overwritten), then the caller writes the
    slots' data, then ``commit`` (``current_pos`` and ``current_size`` advance). In that
    order a process killed mid-append leaves no counted step whose slot holds other
    data: with memory-mapped storage the re-attached buffer has lost at most the oldest
    step of a full ring, and never shows a half-written one. This is the reference
    (torch) writer; ``FusedRingWriter`` runs the same on numba.
    """

    def __init__(self, num_envs: int, max_length: int, allocator=None):
        allocator = allocator or MemoryAllocator()
        self.num_envs = num_envs
        self.max_length = max_length
        self.current_pos = allocator.tensor("writer.current_pos", (num_envs,), torch.int64)
        self.current_size = allocator.tensor("writer.current_size", (num_envs,), torch.int64)

    def circular(self, pos: torch.Tensor) -> torch.Tensor:
        return pos % self.max_length

    def slots(self, env_ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return env_ids * self.max_length + pos % self.max_length

    def earliest(self, env_ids: torch.Tensor) -> torch.Tensor:
        return self.current_pos[env_ids] - self.current_size[env_ids]

    def claim(self, env_ids, batch_size: int, blocking: bool) -> Claim:
        """The next position of each of ``env_ids`` (None: every environment, in order)
        for a batch of ``batch_size`` steps; ``current_pos`` moves at ``commit``.

        Raises ``ValueError`` for ids out of range, repeated or not matching the batch,
        and ``RuntimeError`` for ``blocking`` on a full ring (nothing dequeues
        concurrently, so it would block forever).
        """
        env_ids = self._env_ids(env_ids, batch_size)
        if torch.unique(env_ids).numel() != env_ids.numel():
            raise ValueError("env_ids of one batch must be distinct")
        full = self.current_size[env_ids] >= self.max_length
        if blocking and bool(full.any()):
            raise RuntimeError(FULL_RING)
        pos = self.current_pos[env_ids].clone()
        self.current_size[env_ids] -= full.to(torch.int64)  # the oldest step's slot is claimed
        return Claim(env_ids, pos, self.slots(env_ids, pos), int(full.sum()))

    def commit(self, claim: Claim) -> None:
        """Advance the cursors over the claimed steps, whose data is written now."""
        env_ids = claim.env_ids
        self.current_pos[env_ids] = claim.positions + 1
        self.current_size[env_ids] += 1

    def _env_ids(self, env_ids, batch_size: int) -> torch.Tensor:
        device = self.current_pos.device
        if env_ids is None:
            if batch_size != self.num_envs:
                raise ValueError(
                    f"env_ids=None needs a batch of num_environments={self.num_envs}, "
                    f"got {batch_size}"
                )
            return torch.arange(self.num_envs, device=device)
        env_ids = torch.as_tensor(env_ids, dtype=torch.int64, device=device).reshape(-1)
        if env_ids.shape[0] != batch_size:
            raise ValueError(f"{batch_size} steps for {env_ids.shape[0]} env_ids")
        if env_ids.numel() and bool((env_ids.min() < 0) | (env_ids.max() >= self.num_envs)):
            raise ValueError(f"env_ids must lie in [0, {self.num_envs})")
        return env_ids

    def remove_oldest(self, env_ids: torch.Tensor, n: int) -> None:
        self.current_size[env_ids] -= n

    def clear(self, env_ids: torch.Tensor) -> None:
        self.current_pos[env_ids] = 0
        self.current_size[env_ids] = 0

    def position_of_slot(self, env_ids: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """The newest position stored (or last stored) at ring index ``idx`` (ALF's _pad)."""
        current = self.current_pos[env_ids]
        return (
            torch.div(current - idx - 1, self.max_length, rounding_mode="floor") * (self.max_length)
            + idx
        )

    def state_dict(self) -> dict:
        return {"current_pos": self.current_pos.clone(), "current_size": self.current_size.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.current_pos.copy_(state["current_pos"])
        self.current_size.copy_(state["current_size"])


class FusedRingWriter(RingWriter):
    """``RingWriter`` whose claim and commit are numba kernels over numpy views of the
    cursors (CPU). Chosen once by ``storage.backend``; same semantics, same errors."""

    def __init__(self, num_envs: int, max_length: int, allocator=None):
        super().__init__(num_envs, max_length, allocator)
        self._pos = self.current_pos.numpy()
        self._size = self.current_size.numpy()
        self._all_env_ids = np.arange(num_envs, dtype=np.int64)

    def claim(self, env_ids, batch_size: int, blocking: bool) -> Claim:
        if env_ids is None:
            if batch_size != self.num_envs:
                raise ValueError(
                    f"env_ids=None needs a batch of num_environments={self.num_envs}, "
                    f"got {batch_size}"
                )
            env_ids = self._all_env_ids
        else:
            env_ids = np.asarray(host_array(env_ids)).reshape(-1)
            if env_ids.dtype != np.int64 or not env_ids.flags.writeable:
                env_ids = env_ids.astype(np.int64)  # a copy: the ids become tensors later
            if env_ids.shape[0] != batch_size:
                raise ValueError(f"{batch_size} steps for {env_ids.shape[0]} env_ids")
        pos = np.empty(env_ids.shape[0], dtype=np.int64)
        slots = np.empty(env_ids.shape[0], dtype=np.int64)
        overwritten = _ring_kernels.claim(
            env_ids, self._pos, self._size, self.max_length, blocking, pos, slots
        )
        if overwritten == _ring_kernels.BAD_ENV:
            raise ValueError(f"env_ids must lie in [0, {self.num_envs})")
        if overwritten == _ring_kernels.DUPLICATE_ENV:
            raise ValueError("env_ids of one batch must be distinct")
        if overwritten == _ring_kernels.FULL:
            raise RuntimeError(FULL_RING)
        return Claim(env_ids, pos, slots, overwritten)

    def commit(self, claim: Claim) -> None:
        _ring_kernels.commit(claim.env_ids, self._pos, self._size, self.max_length)


def host_array(x):
    """A numpy view of a CPU tensor (a copy of any other tensor); other values as given."""
    if not isinstance(x, torch.Tensor):
        return x
    try:
        return x.numpy()
    except (RuntimeError, TypeError):  # needs grad, or not on the CPU
        return x.detach().cpu().numpy()


def _paths(nest, prefix=""):
    """A nest like ``nest`` whose leaves are their dotted paths (file names for mmap)."""
    if isinstance(nest, dict):
        return {k: _paths(v, f"{prefix}.{k}" if prefix else k) for k, v in nest.items()}
    if is_namedtuple(nest):
        return type(nest)(
            *(
                _paths(v, f"{prefix}.{k}" if prefix else k)
                for k, v in zip(nest._fields, nest, strict=True)
            )
        )
    return prefix
