"""Where a buffer's bytes live: process memory, or memory-mapped files.

Every array a buffer keeps (data fields, ring cursors, priorities, episode index) is made
by one allocator, so choosing ``MmapAllocator(directory)`` puts all of it in files: a
restarted process that builds the same buffer on the same directory re-attaches to the
arrays as they were, without a checkpoint. Writes reach the page cache at once; the
kernel writes them back to disk (``flush()`` forces it, e.g. before a planned stop).

One writer per directory: ``MmapAllocator`` holds an exclusive ``flock`` on
``<directory>/lock`` while it lives (the kernel drops it when the process dies, kill -9
included), and a second one on the same directory, in any process, is refused with
``StorageLocked`` instead of two writers corrupting each other's rings.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import weakref

import torch


class StorageLocked(RuntimeError):
    """Another live buffer owns this storage directory."""


def _lock_directory(directory: str) -> int:
    """An open descriptor holding an exclusive flock on ``<directory>/lock`` (with this
    process's pid in it), or ``StorageLocked`` naming the directory and the holder."""
    path = os.path.join(directory, "lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise StorageLocked(
                f"replay storage {directory} is in use by another writer (pid {holder})"
            ) from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


class MemoryAllocator:
    """Plain tensors on ``device``."""

    persistent = False

    def __init__(self, device="cpu"):
        self.device = torch.device(device)

    def tensor(self, name: str, shape, dtype: torch.dtype, fill=0) -> torch.Tensor:
        return torch.full(tuple(shape), fill, dtype=dtype, device=self.device)

    def flush(self) -> None:
        pass

    def close(self) -> None:
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
        self._lock_fd = _lock_directory(directory)
        # Closing the descriptor releases the lock: at close(), or when this is collected.
        self._release = weakref.finalize(self, os.close, self._lock_fd)
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
        fresh = not os.path.exists(path)
        existed = not fresh and os.path.getsize(path) == nbytes
        if self._layout.get(name) not in (None, entry):
            raise ValueError(
                f"{path} holds {self._layout[name]}, but the buffer asks for {entry}: "
                "use a fresh directory for a different buffer"
            )
        tensor = torch.from_file(path, shared=True, size=numel, dtype=dtype).reshape(shape)
        if existed:
            self.reattached.add(name)
        elif not (fresh and fill == 0):  # a new file is sparse and reads as zeros already
            tensor.fill_(fill)
        if self._layout.get(name) != entry:
            self._layout[name] = entry
            tmp = self._layout_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self._layout, f)
            os.replace(tmp, self._layout_path)
        return tensor

    def close(self) -> None:
        """Release the directory (the mapped tensors stay valid until dropped)."""
        self._release()

    def flush(self) -> None:
        # Mapped pages are written back by the kernel; syncing the directory makes the
        # files' existence durable as well.
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
