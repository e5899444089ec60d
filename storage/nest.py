"""Specs, step types and the few nest helpers the buffers need.

A nest is a tensor, a dict of nests or a named tuple of nests (ALF's convention). The
buffers only map over nests, flatten them and pick fields by dotted path, so these
helpers stay small instead of pulling in ALF's nest library.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


class StepType(enum.IntEnum):
    """ALF's step types: an episode is FIRST, MID..., LAST; the step after LAST is FIRST.

    A LAST step with discount 0 ends the episode (termination); a LAST step with discount
    1 cuts it (truncation, e.g. a time limit), so values may bootstrap from it.
    """

    FIRST = 0
    MID = 1
    LAST = 2


@dataclass(frozen=True)
class TensorSpec:
    """Shape (without batch dimensions) and dtype of one stored tensor."""

    shape: tuple = ()
    dtype: torch.dtype = torch.float32

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    def zeros(self, outer_shape=(), device="cpu") -> torch.Tensor:
        return torch.zeros(tuple(outer_shape) + self.shape, dtype=self.dtype, device=device)

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor, from_dim: int = 1) -> TensorSpec:
        """The spec of ``tensor`` without its first ``from_dim`` (batch) dimensions."""
        return cls(tuple(tensor.shape[from_dim:]), tensor.dtype)


def is_namedtuple(x) -> bool:
    return isinstance(x, tuple) and hasattr(x, "_fields")


def map_structure(fn: Callable, *nests):
    """Apply ``fn`` leaf-wise over nests of the same structure."""
    first = nests[0]
    if isinstance(first, dict):
        return {k: map_structure(fn, *(n[k] for n in nests)) for k in first}
    if is_namedtuple(first):
        return type(first)(*(map_structure(fn, *parts) for parts in zip(*nests, strict=True)))
    if isinstance(first, (list, tuple)):
        return type(first)(map_structure(fn, *parts) for parts in zip(*nests, strict=True))
    return fn(*nests)


def leaves(nest) -> list:
    """The leaves of ``nest``, in ``flatten_with_paths`` order."""
    if isinstance(nest, dict):
        return [leaf for value in nest.values() for leaf in leaves(value)]
    if isinstance(nest, (list, tuple)):  # named tuples included
        return [leaf for value in nest for leaf in leaves(value)]
    return [nest]


def flatten_with_paths(nest, prefix: str = "") -> list[tuple[str, Any]]:
    """``[(dotted path, leaf), ...]`` in a fixed order."""
    if isinstance(nest, dict):
        items = list(nest.items())
    elif is_namedtuple(nest):
        items = list(zip(nest._fields, nest, strict=True))
    elif isinstance(nest, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(nest)]
    else:
        return [(prefix, nest)]
    out = []
    for key, value in items:
        out.extend(flatten_with_paths(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def get_field(nest, path: str):
    """The sub-nest at dotted ``path`` (attribute or key at each level). A flat dict whose
    key holds the dots itself (``observation.desired_goal``, how the replay store keeps a
    dict observation's fields) is found by the whole key first."""
    if isinstance(nest, dict) and path in nest:
        return nest[path]
    for part in path.split(".") if path else []:
        if isinstance(nest, dict):
            nest = nest[part]
        elif is_namedtuple(nest):
            nest = getattr(nest, part)
        elif isinstance(nest, (list, tuple)):
            nest = nest[int(part)]
        else:
            raise KeyError(f"no field {part!r} in a {type(nest).__name__}")
    return nest


def has_field(nest, name: str) -> bool:
    if isinstance(nest, dict):
        return name in nest
    return is_namedtuple(nest) and name in nest._fields
