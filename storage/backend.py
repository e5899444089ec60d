"""The storage backend, chosen once when a buffer is built.

Two backends implement the same writer and sampler interfaces over the same arrays:

* ``fused``: numba kernels, one call per batch of events (a CPU, numba importable, and
  numba segment trees). The default wherever it can run.
* ``reference``: numpy views on a CPU, torch elsewhere (CUDA, torch trees). It is the
  readable statement of the semantics, and the model tests hold the fused one to it.

Nothing downstream asks which backend it got: it calls the writer's ``claim``/``commit``
and the sampler's methods.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from storage.ring import FusedRingWriter, RingWriter
from storage.sampler import SlotSampler
from storage.segment_tree import available_backends, default_backend

BACKENDS = ("fused", "reference")


@dataclass(frozen=True)
class Backend:
    """Which classes a buffer builds: ``name`` is ``"fused"`` or ``"reference"``."""

    name: str
    writer: type
    sampler: type
    tree_backend: str


def select_backend(device, backend: str | None = None, tree_backend: str | None = None):
    """The backend for ``device``: ``backend`` if given (``ValueError`` if it cannot run
    there), else fused where it can run. ``tree_backend`` forces the trees' kernel
    (``"numba"`` or ``"torch"``); torch trees mean the reference backend."""
    device = torch.device(device)
    if backend not in (None, *BACKENDS):
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    trees = tree_backend or default_backend(device)
    fused_ok = device.type == "cpu" and trees == "numba" and "numba" in available_backends()
    if backend == "fused" and not fused_ok:
        raise ValueError(
            f"the fused backend needs a CPU, numba and numba trees (device {device}, trees {trees})"
        )
    if backend is None:
        backend = "fused" if fused_ok else "reference"
    if backend == "fused":
        from storage.fused_sampler import FusedSlotSampler

        return Backend("fused", FusedRingWriter, FusedSlotSampler, trees)
    return Backend("reference", RingWriter, SlotSampler, trees)
