"""Node processes on this machine (the default launcher), and what every launcher shares:
where ``run.py`` is, and how a process handle's whole group is killed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys

from pipeline.forkserver import PARENT_ENV


def run_py() -> str:
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "run.py")


def kill(process) -> None:
    """SIGKILL a process handle's whole group (a node may have children); None: not started."""
    if process is None:
        return
    if hasattr(process, "kill_group"):
        process.kill_group()
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


class LocalLauncher:
    """Node processes on this machine: forks of the fork server, or fresh interpreters (a
    swapped-in node, or when the fork server is gone)."""

    def __init__(self, forkserver=None):
        self.forkserver = forkserver

    async def start(self, node, launch_path: str, log_path: str, fresh: bool):
        if self.forkserver is not None and self.forkserver.alive and not fresh:
            with contextlib.suppress(OSError):  # the server is gone: a fresh one below
                return await self.forkserver.spawn(launch_path, log_path)
        log_file = open(log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            return await asyncio.create_subprocess_exec(
                sys.executable, run_py(), "node", launch_path, log_path,
                stdout=log_file, stderr=log_file, stdin=asyncio.subprocess.DEVNULL,
                env={**os.environ, PARENT_ENV: str(os.getpid())},
                start_new_session=True)  # our SIGINT is ours to forward, not the terminal's
        finally:
            log_file.close()

    def where(self, process) -> str:
        return f"pid {process.pid}"

    async def close(self) -> None:
        return None
