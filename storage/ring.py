"""Storage and writer: per-environment rings of time steps.

Terminology (ALF's): a *position* ``pos`` counts the steps an environment has ever
written and only grows; its *index* ``idx = pos % max_length`` is the ring slot holding
it. An environment's stored positions are ``[current_pos - current_size, current_pos)``.
A *slot* number ``env_id * max_length + idx`` names one ring slot across environments
(it is the leaf number in the samplers' trees).
"""

from __future__ import annotations

import numpy as np
import torch

from storage.allocator import MemoryAllocator
from storage.nest import flatten_with_paths, get_field, is_namedtuple, map_structure


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

    def _make_field(self, spec, path):
        return self.allocator.tensor(
            f"data.{path}", (self.num_envs, self.max_length) + spec.shape, spec.dtype
        )

    def write(self, env_ids: torch.Tensor, idx: torch.Tensor, batch) -> None:
        """Store ``batch[i]`` at ring slot ``idx[i]`` of environment ``env_ids[i]``."""

        def put(buf, value):
            buf[env_ids, idx] = value.to(device=buf.device, dtype=buf.dtype)

        map_structure(put, self.data, batch)

    def write_slots(self, slots: np.ndarray, batch) -> None:
        """Store ``batch[i]`` at flat slot ``slots[i]`` (CPU storage)."""

        def put(flat, value):
            flat[slots] = host_array(value)

        map_structure(put, self._host, batch)

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
    """Which slot is written next: per-environment ``current_pos``/``current_size``."""

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

    def advance(self, env_ids: torch.Tensor) -> torch.Tensor:
        """Claim the next position of each environment; returns the positions claimed."""
        pos = self.current_pos[env_ids].clone()
        self.current_pos[env_ids] = pos + 1
        self.current_size[env_ids] = torch.clamp(
            self.current_size[env_ids] + 1, max=self.max_length
        )
        return pos

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
