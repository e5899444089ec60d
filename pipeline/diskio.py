"""Writers that degrade when the disk is full or failing, instead of taking the run down.

A log line, a launch file or an event that cannot be written is not worth a process: the
supervisor and the nodes keep running, say once per episode of trouble that they cannot write
(and again when they can), and count what they dropped. Writes that durability needs (a
ledger record before an acknowledgement) are held and retried instead: :mod:`pipeline.ledger`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys


class QuietFileHandler(logging.FileHandler):
    """A log file that never prints ``--- Logging error ---`` tracebacks: a write that fails
    (ENOSPC, EIO) drops the line, counted, with one line on stderr per episode of trouble,
    and one when lines are written again."""

    def __init__(self, filename: str, **kwargs):
        super().__init__(filename, **kwargs)
        self.dropped = 0
        self._failed = False  # this emit failed (handleError ran)
        self._trouble = False  # an episode of trouble is under way

    def emit(self, record: logging.LogRecord) -> None:
        self._failed = False
        super().emit(record)  # StreamHandler.emit: any exception goes to handleError
        if not self._failed and self._trouble:
            self._trouble = False
            _say(f"{self.baseFilename} is written again ({self.dropped} log lines dropped)")

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        self._refused(sys.exc_info()[1])

    def _refused(self, exc) -> None:
        self._failed = True
        self.dropped += 1
        if not self._trouble:
            self._trouble = True
            _say(f"cannot write {self.baseFilename} ({getattr(exc, 'strerror', None) or exc}); "
                 f"log lines are dropped until it can")


    def flush(self) -> None:
        try:
            super().flush()
        except OSError as exc:  # the buffer stays; it goes out once the disk takes it
            self._refused(exc)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            super().close()


def _say(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # stderr gone too: nothing more to do
        print(f"\nwarning: {line}", file=sys.stderr, flush=True)


# What a full or failing disk raises (not a run directory that is broken, e.g. its launch/
# replaced by a file: that still fails the start, with its reason).
DISK_TROUBLE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG, errno.EROFS})


def dump_launch(launch, path: str, fallback_dir: str) -> str:
    """Write a launch file where it belongs or, if the disk refuses it (full, failing,
    read-only), into the run's private socket directory (mode 0700, another filesystem as a
    rule): the node starts either way. Returns where it went."""
    try:
        launch.dump(path)
        return path
    except OSError as exc:
        if exc.errno not in DISK_TROUBLE:
            raise
        os.makedirs(fallback_dir, mode=0o700, exist_ok=True)
        other = os.path.join(fallback_dir, os.path.basename(path))
        launch.dump(other)  # this one failing too is the start's failure, with its reason
        logging.getLogger("pipeline.supervisor").warning(
            "cannot write %s (%s): the launch file went to %s", path, exc.strerror or exc,
            other)
        return other
