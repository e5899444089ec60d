"""The one place that makes ZeroMQ sockets: linger, high-water marks, tracking, closing.

Every socket a process opens comes from a :class:`SocketFactory`, which remembers it so that
``close_all`` can close them all (LIFO) before the context is terminated: terminating a context
with an open socket hangs, and that is the classic zmq shutdown bug.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import platform
import tempfile

import zmq
import zmq.asyncio

# Long enough for a large reply or last message to leave before a closing process drops it;
# ``close_all(linger_ms=0)`` is the forced path.
DEFAULT_LINGER_MS = 2000


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


def socket_dir(key: str) -> str:
    """A short directory for ``ipc://`` files: unix socket paths are limited to ~107 bytes,
    and run directories are often longer than that."""
    path = os.path.join(tempfile.gettempdir(), f"conduit-{key}")
    os.makedirs(path, exist_ok=True)
    return path


def bind(sock: zmq.Socket, endpoint: str) -> str:
    """Bind, removing a stale ipc file a killed process left behind; return the real endpoint."""
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://"):]
        if os.path.exists(path):
            os.unlink(path)
    sock.bind(endpoint)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
_EVENTS = int(zmq.EVENTS)
# pyzmq's compiled send, without the Python wrapper that only handles DRAFT-socket arguments.
_send_frame = zmq.backend.Socket.send


async def recv_batch(sock: zmq.asyncio.Socket, shadow: zmq.Socket, limit: int = 512,
                     copy_first: int = 2) -> list:
    """Every message already waiting (up to ``limit``), or, if none is, the next one.

    Why: each awaited receive costs a future and a loop iteration; under load the messages are
    already there, and draining them through the plain ``shadow`` of the socket is several times
    cheaper. The first ``copy_first`` frames of a message come as ``bytes`` (small: routing,
    headers, envelopes), the rest as ``zmq.Frame`` without a copy (the codec only puts large
    arrays there); a message that had to be waited for has every frame as ``zmq.Frame``.
    Safe because the caller is the socket's only reader, the drain stops only when the socket is
    empty, and zmq.asyncio checks ``EVENTS`` before it waits.
    """
    batch = _drain(shadow, limit, copy_first)
    if not batch:
        batch.append(await sock.recv_multipart(copy=False))
        batch += _drain(shadow, limit - 1, copy_first)
    return batch


def drain(shadow: zmq.Socket, limit: int = 512, copy_first: int = 2) -> list:
    """Every message already waiting (up to ``limit``), without waiting; frames as in
    :func:`recv_batch`. Only for the socket's only reader, and only to empty it."""
    return _drain(shadow, limit, copy_first)


def _drain(shadow: zmq.Socket, limit: int, copy_first: int) -> list:
    # Frames, not copies, so that ``Frame.more`` says whether the message goes on: querying
    # RCVMORE builds an enum per call in pyzmq and costs more than the receive.
    batch = []
    recv = shadow.recv
    try:
        while len(batch) < limit:
            frame = recv(_NOBLOCK, False)
            parts = [frame.bytes if copy_first else frame]
            while frame.more:
                frame = recv(_NOBLOCK, False)
                parts.append(frame.bytes if len(parts) < copy_first else frame)
            batch.append(parts)
    except zmq.Again:
        pass
    return batch


class Sender:
    """Non-blocking sends through the plain shadow of an asyncio socket, for hot paths.

    Why: zmq.asyncio's ``send_multipart`` makes a future, queries ``EVENTS`` and combines enum
    flags for every frame, which costs more than the send itself. The hazard that
    :func:`send_now` avoids is handled here instead: zmq's file descriptor is edge-triggered,
    so a send that processes the command making a message readable swallows the wake-up a
    pending asyncio ``recv`` waits for. After sending, once per loop iteration (before the loop
    can sleep), the sender queries ``EVENTS`` through the asyncio socket, whose ``get`` wakes its
    waiting readers when something is readable (what pyzmq itself does after a send it makes
    without waiting).

    Every send on the socket must go through one ``Sender``: a send waiting inside zmq.asyncio
    would be overtaken. Meant for sockets that never block on send (ROUTER/DEALER with
    ``hwm=0``); raises ``zmq.Again`` or ``zmq.ZMQError`` like a non-blocking send.
    """

    def __init__(self, sock: zmq.asyncio.Socket, copy_threshold: int | None = None):
        self.sock = sock
        self.shadow = shadow_of(sock)
        if copy_threshold is not None:  # smaller frames are copied, larger ones sent in place
            self.shadow.copy_threshold = copy_threshold
        self._rearm_due = False

    def send(self, frames: list) -> None:
        """Send one message. ``bytes`` frames (routing ids, envelopes) are copied; other
        buffers (array frames) are sent in place when they reach the copy threshold."""
        shadow = self.shadow
        for frame in frames[:-1]:
            _send_frame(shadow, frame, _SNDMORE_NOBLOCK, type(frame) is bytes)
        frame = frames[-1]
        _send_frame(shadow, frame, _NOBLOCK, type(frame) is bytes)
        if not self._rearm_due:
            self._rearm_due = True
            try:
                asyncio.get_running_loop().call_soon(self._rearm)
            except RuntimeError:  # no loop yet, so nobody waits on the socket either
                self._rearm()

    def _rearm(self) -> None:
        self._rearm_due = False
        if not self.sock.closed:
            self.sock.get(_EVENTS)


def shadow_of(sock: zmq.asyncio.Socket) -> zmq.Socket:
    """A plain (blocking-API) view of the same socket, for non-blocking drains."""
    return zmq.Socket.shadow(sock.underlying)


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
