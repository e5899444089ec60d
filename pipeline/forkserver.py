"""Start node processes by forking a process that has already imported their code.

Why: a fresh interpreter per node imports numpy, zmq and, for a training graph, torch (1.3-2 s
of CPU each). A graph starts several such nodes at once on a machine with few cores, so they
were ready 3.5-4.5 s after launch, and a restarted node paid the same again. The supervisor has
imported every node kind while validating the graph, and the graph's ``imports:`` (the user's
environments and kinds: :func:`pipeline.graph.load` imports them first), so call :func:`start`
after loading the graph: it forks a *fork server* from the supervisor at that moment (before
the event loop or any ZeroMQ context exists, so no thread or socket is copied), and each node
is then a fork of that server: ready in a fraction of a second.

Protocol (newline-delimited JSON over two pipes): the supervisor writes
``{"id", "launch", "log"}``; the server answers ``{"id", "pid"}`` after forking (or
``{"id", "error"}`` when the fork failed) and
``{"exited": pid, "code": returncode}`` when it reaps a child (a negative code is the signal
that killed it, as in :mod:`subprocess`). When the request pipe closes, the server exits as soon
as its last child has. Each child starts its own session (``killpg`` reaches it and its
children), sends its output to its log file and runs :func:`pipeline.node.process_main`.

If the server dies, the supervisor kills the nodes it can no longer reap (their watchers
restart them as usual) and starts every later node as a fresh interpreter.

Nothing outlives the supervisor: the server and every node ask the kernel for SIGKILL when their
parent dies (:func:`die_with_parent`), so a supervisor killed with SIGKILL takes the server with
it, and the server its nodes, at once; nobody is left stepping environments for no one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import select
import signal
import sys
import traceback

log = logging.getLogger(__name__)

DISABLE_ENV = "CONDUIT_FORKSERVER"  # "0": start every node as a fresh interpreter
PARENT_ENV = "CONDUIT_PARENT_PID"  # a fresh-interpreter node's supervisor (die_with_parent)
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when its parent dies, then check that the parent
    is still ``parent``: it may have died between our fork and this call, and the kernel only
    watches from now on. Exits at once if the parent is already gone."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(1)


def available() -> bool:
    """Linux only (fork after imports is what it relies on), not switched off, and not after
    something initialized CUDA in this process (a forked child could not use it)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return False
    return sys.platform.startswith("linux") and os.environ.get(DISABLE_ENV, "1") != "0"


def start() -> ForkServer | None:
    """Fork the server from the calling process; call it before any event loop or ZeroMQ
    context exists. Returns the supervisor's handle, or None where it is not available."""
    if not available():
        return None
    import pipeline.node  # noqa: F401 - what every child runs, imported once here

    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    supervisor = os.getpid()
    pid = os.fork()
    if pid == 0:  # the server
        code = 1
        try:
            die_with_parent(supervisor)
            os.close(requests_w)
            os.close(replies_r)
            _serve(requests_r, replies_w)
            code = 0
        except BaseException:  # noqa: BLE001 - report anything, never return into the caller
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(requests_r)
    os.close(replies_w)
    return ForkServer(pid, requests_w, replies_r)


# --- the server process ---------------------------------------------------------------------------


def _serve(requests: int, replies: int) -> None:
    os.setsid()  # the terminal's Ctrl-C is the supervisor's to handle, not ours
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake select() through wake_w
    children: set[int] = set()
    pending = b""
    open_ = True

    def answer(record: dict) -> None:
        os.write(replies, (json.dumps(record) + "\n").encode())

    while open_ or children:
        ready, _, _ = select.select([requests, wake_r] if open_ else [wake_r], [], [])
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
        while children:  # reap everything that exited, whichever fd woke us
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            answer({"exited": pid, "code": os.waitstatus_to_exitcode(status)})
        if requests in ready:
            chunk = os.read(requests, 65536)
            if not chunk:
                open_ = False
                continue
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                request = json.loads(line)
                try:
                    pid = _fork_node(request["launch"], request["log"],
                                     close=(requests, replies, wake_r, wake_w))
                except OSError as exc:  # e.g. the process limit: that node fails, not us
                    answer({"id": request["id"], "error": f"fork failed: {exc}"})
                    continue
                children.add(pid)
                answer({"id": request["id"], "pid": pid})


def _fork_node(launch_path: str, log_path: str, close: tuple[int, ...]) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    server = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:  # the node: its own session, default signals, output to its log file
        die_with_parent(server)
        os.setsid()
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        for fd in close:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(null)
        os.close(out)
        from pipeline.node import process_main

        code = process_main(launch_path, log_path)
    except BaseException:  # noqa: BLE001 - a child must never return into the server's loop
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


# --- the supervisor's side ------------------------------------------------------------------------


class SpawnFailed(Exception):
    """The server is alive but could not fork this node (e.g. the process limit)."""


class ForkedProcess:
    """The part of ``asyncio.subprocess.Process`` the supervisor uses, for a forked node."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self._exited = asyncio.Event()

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode

    def _exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._exited.set()


class ForkServer:
    """The supervisor's handle on the fork server: :meth:`spawn` a node, learn when it exits."""

    def __init__(self, pid: int, requests: int, replies: int):
        self.pid, self._requests, self._replies = pid, requests, replies
        self.alive = True
        self._ids = 0
        self._spawning: dict[int, asyncio.Future] = {}
        self._children: dict[int, ForkedProcess] = {}
        self._buffer = b""
        self._loop: asyncio.AbstractEventLoop | None = None

    async def spawn(self, launch_path: str, log_path: str) -> ForkedProcess:
        """Fork one node; raises ``OSError`` if the server is gone (start it another way)."""
        if not self.alive:
            raise OSError("the fork server is gone")
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            os.set_blocking(self._replies, False)
            self._loop.add_reader(self._replies, self._on_readable)
        self._ids += 1
        future = self._loop.create_future()
        self._spawning[self._ids] = future
        request = {"id": self._ids, "launch": launch_path, "log": log_path}
        try:
            os.write(self._requests, (json.dumps(request) + "\n").encode())
        except OSError:
            self._spawning.pop(self._ids, None)
            self._lost("its request pipe broke")
            raise
        return await future

    def _on_readable(self) -> None:
        try:
            chunk = os.read(self._replies, 65536)
        except BlockingIOError:
            return
        if not chunk:
            self._lost("it exited")
            return
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            record = json.loads(line)
            if "exited" in record:  # always after its spawn answer: one writer, in order
                child = self._children.pop(record["exited"], None)
                if child is not None:
                    child._exit(record["code"])
                continue
            future = self._spawning.pop(record["id"], None)
            if "error" in record:
                if future is not None and not future.done():
                    future.set_exception(SpawnFailed(record["error"]))
                continue
            child = self._children[record["pid"]] = ForkedProcess(record["pid"])
            if future is not None and not future.done():
                future.set_result(child)

    def _lost(self, why: str) -> None:
        """The server died: nobody can reap its children any more, so they are killed (their
        watchers restart them as fresh interpreters) and reported as killed."""
        if not self.alive:
            return
        self.alive = False
        log.error("the fork server (pid %d) is gone (%s): its %d nodes are killed and "
                  "restarted as fresh processes", self.pid, why, len(self._children))
        if self._loop is not None:
            self._loop.remove_reader(self._replies)
        for child in self._children.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)
            child._exit(-signal.SIGKILL)
        self._children.clear()
        for future in self._spawning.values():
            if not future.done():
                future.set_exception(OSError(f"the fork server is gone ({why})"))
        self._spawning.clear()

    async def close(self, timeout_s: float = 10.0) -> None:
        """No more nodes: the server exits once its last child has; reap it."""
        with contextlib.suppress(OSError):
            os.close(self._requests)
        if self._loop is not None and self.alive:
            self._loop.remove_reader(self._replies)
        self.alive = False
        with contextlib.suppress(OSError):
            os.close(self._replies)
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(loop.run_in_executor(None, os.waitpid, self.pid, 0),
                                   timeout_s)
        except TimeoutError:
            log.error("the fork server (pid %d) did not exit: SIGKILL", self.pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
