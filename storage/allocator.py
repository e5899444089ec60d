"""Where a buffer's bytes live: process memory, or memory-mapped files.

Every array a buffer keeps (data fields, ring cursors, priorities, episode index) is made
by one allocator, so choosing ``MmapAllocator(directory)`` puts all of it in files: a
restarted process that builds the same buffer on the same directory re-attaches to the
arrays as they were, without a checkpoint. Writes reach the page cache at once; the
kernel writes them back to disk (``flush()`` forces it, e.g. before a planned stop).
"""

from __future__ import annotations

import json
import math
import os

import torch


class MemoryAllocator:
    """Plain tensors on ``device``."""

    persistent = False

    def __init__(self, device="cpu"):
        self.device = torch.device(device)

    def tensor(self, name: str, shape, dtype: torch.dtype, fill=0) -> torch.Tensor:
        return torch.full(tuple(shape), fill, dtype=dtype, device=self.device)

    def flush(self) -> None:
        pass


class MmapAllocator:
    """Tensors backed by files ``<directory>/<name>.bin`` (CPU only).

    A file that already exists with the expected size is mapped as it is (re-attach);
    otherwise it is created and filled. ``layout.json`` records every array's shape and
    dtype, and a mismatch on re-attach is an error rather than silent garbage.
    """

    persistent = True

    def __init__(self, directory: str):
        self.device = torch.device("cpu")
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        self._layout_path = os.path.join(directory, "layout.json")
        self._layout = {}
        if os.path.exists(self._layout_path):
            with open(self._layout_path) as f:
                self._layout = json.load(f)
        self.reattached: set[str] = set()

    def tensor(self, name: str, shape, dtype: torch.dtype, fill=0) -> torch.Tensor:
        shape = tuple(int(d) for d in shape)
        path = os.path.join(self.directory, f"{name}.bin")
        entry = {"shape": list(shape), "dtype": str(dtype)}
        numel = math.prod(shape)
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        existed = os.path.exists(path) and os.path.getsize(path) == nbytes
        if self._layout.get(name) not in (None, entry):
            raise ValueError(
                f"{path} holds {self._layout[name]}, but the buffer asks for {entry}: "
                "use a fresh directory for a different buffer"
            )
        tensor = torch.from_file(path, shared=True, size=numel, dtype=dtype).reshape(shape)
        if existed:
            self.reattached.add(name)
        else:
            tensor.fill_(fill)
        if self._layout.get(name) != entry:
            self._layout[name] = entry
            tmp = self._layout_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self._layout, f)
            os.replace(tmp, self._layout_path)
        return tensor

    def flush(self) -> None:
        # Mapped pages are written back by the kernel; syncing the directory makes the
        # files' existence durable as well.
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
