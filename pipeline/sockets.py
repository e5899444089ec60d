"""The one place that makes ZeroMQ sockets: linger, high-water marks, tracking, closing.

Every socket a process opens comes from a :class:`SocketFactory`, which remembers it so that
``close_all`` can close them all (LIFO) before the context is terminated: terminating a context
with an open socket hangs, and that is the classic zmq shutdown bug.
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import socket as _socket
import stat
import tempfile

import zmq
import zmq.asyncio

# Long enough for a large reply or last message to leave before a closing process drops it;
# ``close_all(linger_ms=0)`` is the forced path.
DEFAULT_LINGER_MS = 2000


# CurveZMQ keys of this process (pipeline.curve), set once by :func:`use_curve` before its first
# socket: every socket made is then a CURVE client of the run, every tcp bind a CURVE server.
_curve = None
# The host name peers use for an endpoint bound on all interfaces (``run.interface: "*"``).
ADVERTISE_ENV = "CONDUIT_ADVERTISE_HOST"


def use_curve(curve) -> None:
    """Secure every socket this process makes from now on with ``curve`` (a
    :class:`pipeline.curve.Curve`, or None for none)."""
    global _curve
    _curve = curve


def curve_in_use():
    return _curve


# glibc's malloc settings for a process that receives large messages (see tune_allocator).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20
_allocator_tuned = False


def tune_allocator() -> None:
    """Keep freed message buffers mapped instead of handing them back to the kernel.

    Why: libzmq mallocs a buffer for every large message it receives, and we free it once
    the message is handled. glibc's adaptive thresholds give such memory back to the kernel
    (mmap/munmap, heap trimming) as soon as a few messages were in flight together, so the next
    message's buffer page-faults back in, 4 KiB at a time: measured 28 faults and about a third
    of the subscriber's CPU per 1 MiB message. These are the values glibc's own adaptive scheme
    settles at after it has seen a 32 MiB block freed, set from the start. Once per process;
    a no-op where the C library is not glibc.
    """
    global _allocator_tuned
    if _allocator_tuned:
        return
    _allocator_tuned = True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)


class SocketFactory:
    """Creates and tracks the sockets of one process (or one in-loop node)."""

    def __init__(self, context: zmq.asyncio.Context | None = None):
        tune_allocator()
        self.context = context or zmq.asyncio.Context.instance()
        self._sockets: list[zmq.asyncio.Socket] = []

    def make(self, kind: int, *, hwm: int | None = None, linger_ms: int = DEFAULT_LINGER_MS,
             **options) -> zmq.asyncio.Socket:
        sock = self.context.socket(kind)
        sock.setsockopt(zmq.LINGER, linger_ms)
        if hwm is not None:
            sock.setsockopt(zmq.SNDHWM, hwm)
            sock.setsockopt(zmq.RCVHWM, hwm)
        for name, value in options.items():
            sock.setsockopt(getattr(zmq, name.upper()), value)
        if _curve is not None:
            from pipeline.curve import make_client

            make_client(sock, _curve)
        self._sockets.append(sock)
        return sock

    def close(self, sock: zmq.asyncio.Socket) -> None:
        if sock in self._sockets:
            self._sockets.remove(sock)
        sock.close()

    def close_all(self, linger_ms: int | None = None) -> None:
        while self._sockets:
            self._sockets.pop().close(linger=linger_ms)

    @property
    def open_count(self) -> int:
        return len(self._sockets)


SOCKET_DIR_PREFIX = "conduit-"


def private_socket_dir() -> str:
    """A fresh directory for a run's ``ipc://`` files, readable by its owner only.

    Short (unix socket paths are limited to ~107 bytes, run directories are often longer),
    created with a random name and mode 0700 by ``mkdtemp`` (which never takes a name that
    exists: a directory someone else made in advance is never used), and checked after
    creation. The caller removes it (:func:`remove_socket_dir`); if it does not get to (a
    SIGKILL), the next run on the same run directory does."""
    path = tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX)
    check_private_dir(path)
    return path


def check_private_dir(path: str) -> None:
    """Raise PermissionError unless ``path`` is a real directory of ours that nobody else can
    enter (not a symlink, our uid, no group or other permission bits)."""
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or \
            stat.S_IMODE(info.st_mode) & 0o077:
        raise PermissionError(f"socket directory {path} is not a private directory of this "
                              f"user (mode {stat.S_IMODE(info.st_mode):o}, uid {info.st_uid})")


def remove_socket_dir(path: str) -> None:
    """Remove a run's socket directory, only if it is one of ours."""
    name = os.path.basename(path.rstrip("/"))
    if not name.startswith(SOCKET_DIR_PREFIX):
        return
    try:
        check_private_dir(path)
    except OSError:
        return
    shutil.rmtree(path, ignore_errors=True)


def tap_endpoint(endpoint: str) -> str:
    """Where a reliable topic's monitor tap binds, next to the topic's own endpoint: a sibling
    file for ``ipc://``, another port the OS picks on the same host for ``tcp://``."""
    if endpoint.startswith("tcp://"):
        return endpoint.rsplit(":", 1)[0] + ":*"
    return endpoint + ".tap"


def bind(sock: zmq.Socket, endpoint: str) -> str:
    """Bind, removing a stale ipc file a killed process left behind; return the real endpoint."""
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://"):]
        if os.path.exists(path):
            os.unlink(path)
    if _curve is not None and endpoint.startswith("tcp://"):
        _bind_curve_server(sock, endpoint)
    else:
        sock.bind(endpoint)
    return advertised(sock.getsockopt_string(zmq.LAST_ENDPOINT))


def _bind_curve_server(sock: zmq.Socket, endpoint: str) -> None:
    """Bind as a CURVE server of the run: the context's ZAP handler admits only the run's keys
    (started first: without a handler libzmq would admit any key). libzmq copies the options
    into the listener at bind time, so the socket is a client again afterwards for any later
    connect."""
    from pipeline.curve import Gate, make_client

    if _curve.server_secret is None:
        raise RuntimeError("this process has no server key: it cannot bind over tcp")
    gate = Gate.of(sock.context, _curve.authorized)
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, _curve.server_secret)
    try:
        sock.bind(endpoint)
    finally:
        sock.setsockopt(zmq.CURVE_SERVER, 0)
        make_client(sock, _curve)
    gate.watch(sock)


def advertised(endpoint: str) -> str:
    """An endpoint bound on all interfaces, with the address peers should connect to: this
    machine's cluster address (``CONDUIT_ADVERTISE_HOST``, set by the Ray launcher) or the
    address its host name resolves to."""
    for wildcard in ("tcp://0.0.0.0:", "tcp://[::]:"):
        if endpoint.startswith(wildcard):
            host = os.environ.get(ADVERTISE_ENV) or _socket.gethostbyname(_socket.gethostname())
            return f"tcp://{host}:{endpoint[len(wildcard):]}"
    return endpoint


_NOBLOCK = int(zmq.NOBLOCK)

# Messages smaller than this are copied into zmq rather than sent in place. Zero-copy hands a
# Python reference to pyzmq's garbage-collector thread, which takes the GIL to release it: a
# GIL round trip per message, more than copying a few hundred KiB costs (a 260 KiB batch: ~15 µs
# to send copied, ~22 µs in place plus the collector's work). A learner publishing a SAC actor
# (262 KiB) after every update showed the collector thread in 2-3% of its profile.
ZERO_COPY_MIN = 512 << 10


def send_now(sock: zmq.asyncio.Socket, frames: list, copy: bool = False) -> None:
    """Send without waiting, through the asyncio socket itself.

    Why not a plain shadow socket: zmq's file descriptor is edge-triggered, and a send made
    behind zmq.asyncio's back can swallow the wake-up a pending ``recv`` is waiting for.
    Raises ``zmq.Again`` when the message cannot be queued, ``zmq.ZMQError`` otherwise.
    """
    future = sock.send_multipart(frames, flags=_NOBLOCK, copy=copy)
    if not future.done():  # only when other sends are already waiting: keep FIFO order
        return
    error = future.exception()
    if error is not None:
        raise error


def recv_now(sock: zmq.asyncio.Socket, copy: bool = False) -> list | None:
    """Receive one message if one is waiting, else None (see :func:`send_now` for why)."""
    future = sock.recv_multipart(flags=_NOBLOCK, copy=copy)
    error = future.exception()
    if isinstance(error, zmq.Again):
        return None
    if error is not None:
        raise error
    return future.result()
