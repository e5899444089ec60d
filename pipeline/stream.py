"""Request/reply between processes of one machine over a plain Unix stream socket.

Why not ZeroMQ here: a ZeroMQ message between two processes wakes the sender's I/O thread,
the receiver's I/O thread and then the receiver's own thread; a Unix socket read straight from
the event loop wakes only the receiver. On a 2-vCPU machine, with the two processes on
different vCPUs, a raw 200-byte round trip measured 42-54 µs and 15-21 µs of the caller's CPU
this way against 122-133 µs and 57-68 µs through ZeroMQ ipc (``bench/cpu_sharing.py``). The
env runner makes one round trip per step of its environments, so that difference is the
graph's step rate (issue 13, item 2). Topics keep ZeroMQ (fan-out, credits, taps) and
services over tcp keep it too (CurveZMQ).

The wire: each message is ``<u32 length of the rest><u16 frame count><u32 length per frame>``
followed by the frames' bytes, written with one ``sendmsg`` (the frames are not joined;
a message of more frames than one call takes goes out in several).
A frame handed to the receiver is a view of a buffer of that message's own (never of a buffer
that is reused), writable, as a ``zmq.Frame`` received without copying is.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import os
import socket
import struct
from collections.abc import Callable

SCHEME = "unix://"

_LENGTH = struct.Struct("<I")
_COUNT = struct.Struct("<H")
_U32 = struct.Struct("<I")
_READ_SIZE = 256 << 10  # bytes asked of the kernel per read
_BIG = 64 << 10  # a message at least this long is read into a buffer of its own
_BUFFER_BYTES = 4 << 20  # socket buffers: a batch of pixels fits in a few writes
_MAX_FRAMES = 1000  # under IOV_MAX (1024) with the header
LINGER_S = 2.0  # how long a closing server still writes its last replies (ZeroMQ's linger)


def path_of(endpoint: str) -> str:
    """The socket file of a ``unix://`` (or ``ipc://``) endpoint."""
    return endpoint.split("://", 1)[1]


def is_stream(endpoint: str) -> bool:
    """Whether a service at ``endpoint`` speaks this protocol: every same-machine endpoint."""
    return endpoint.startswith((SCHEME, "ipc://"))


def listen(path: str) -> socket.socket:
    """A listening socket at ``path``, replacing a stale file a killed process left behind."""
    if os.path.exists(path):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(128)
    sock.setblocking(False)
    return sock


def connect(path: str) -> socket.socket:
    """A connected socket; OSError (FileNotFoundError, ConnectionRefusedError) if no server
    listens at ``path`` now."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    _tune(sock)
    return sock


def _tune(sock: socket.socket) -> None:
    sock.setblocking(False)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUFFER_BYTES)


class Listener:
    """A listening socket at ``path``, bound at once (clients may connect before the loop
    watches it: the kernel holds them); :meth:`start` hands each connection, from the event
    loop, to ``on_connection``."""

    def __init__(self, path: str):
        self.path = path
        self._sock = listen(path)
        self._on_connection: Callable[[socket.socket], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, on_connection: Callable[[socket.socket], None]) -> None:
        self._on_connection = on_connection
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._sock.fileno(), self._accept)
        self._accept()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # closed under us, or out of descriptors: the client sees it refused
            _tune(conn)
            self._on_connection(conn)

    def close(self) -> None:
        if self._sock.fileno() >= 0:
            if self._loop is not None:
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


class StreamChannel:
    """Hands every whole message arriving on ``sock`` to ``on_message(frames)`` as soon as the
    loop sees it, and sends without waiting (what the kernel does not take at once is queued
    and written when the socket is writable, in order). ``on_close()`` is called once when the
    peer goes away or the socket fails; the channel is closed by then."""

    def __init__(self, sock: socket.socket, on_message: Callable[[list], None],
                 on_close: Callable[[], None] | None = None):
        self.sock = sock
        self.on_message = on_message
        self.on_close = on_close
        self.closed = False
        self._fd = sock.fileno()
        self._loop = asyncio.get_running_loop()
        self._buf = bytearray(_READ_SIZE)
        self._view = memoryview(self._buf)
        self._start = self._end = 0  # unparsed bytes are _buf[_start:_end]
        self._big: bytearray | None = None  # a long message being read into its own buffer
        self._big_filled = 0
        self._unsent: collections.deque = collections.deque()  # buffers not yet written
        self._all_sent: asyncio.Future | None = None  # for sent()
        self._linger: asyncio.TimerHandle | None = None  # closed, still writing until then
        self._loop.add_reader(self._fd, self._readable)

    # sending -------------------------------------------------------------------------------

    def send(self, frames: list) -> None:
        """Send one message (a list of bytes-like frames). Buffers other than ``bytes`` are
        read when written, as ZeroMQ's zero-copy frames are: do not change them meanwhile."""
        if self.closed:
            raise ConnectionError("stream channel is closed")
        header, total = frame_header(frames)
        if self._unsent or len(frames) >= _MAX_FRAMES:
            # Behind what is queued, or more buffers than one sendmsg takes: the queue
            # writes them in order, _MAX_FRAMES at a time.
            idle = not self._unsent
            self._unsent.append(header)
            self._unsent.extend(frames)
            if idle:
                self._loop.add_writer(self._fd, self._writable)
                self._writable()
            return
        buffers = [header, *frames]
        try:
            sent = self.sock.sendmsg(buffers)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._lost()
            return
        if sent < total:
            self._unsent.extend(buffers)
            self._drop_written(sent)
            self._loop.add_writer(self._fd, self._writable)

    def _drop_written(self, sent: int) -> None:
        """Take the first ``sent`` bytes off the queue (a buffer written in part stays as the
        view of its rest)."""
        while sent:
            size = _nbytes(self._unsent[0])
            if sent < size:
                self._unsent[0] = memoryview(self._unsent[0]).cast("B")[sent:]
                return
            sent -= size
            self._unsent.popleft()

    def _writable(self) -> None:
        while self._unsent:
            batch = list(itertools.islice(self._unsent, _MAX_FRAMES))
            try:
                sent = self.sock.sendmsg(batch)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._lost()
                return
            self._drop_written(sent)
            if sent < sum(map(_nbytes, batch)):
                return  # the socket is full again: the loop calls back when it is writable
        self._loop.remove_writer(self._fd)
        if self._linger is not None:
            self._shut()
        self._signal_sent()

    # receiving -----------------------------------------------------------------------------

    def drain(self) -> None:
        """Hand over every whole message the kernel holds now, without waiting for the loop
        (see :meth:`pipeline.reqrep.ServiceClient.drain`)."""
        while not self.closed and self._readable():
            pass

    def _readable(self) -> bool:
        """Read once; whether anything was read."""
        if self._big is not None:
            return self._read_big()
        if self._end == len(self._buf):
            self._compact()
        got = self._recv_into(self._view[self._end:])
        if not got:
            return False
        self._end += got
        self._parse()
        return True

    def _recv_into(self, view) -> int:
        """Bytes read into ``view``; 0 if none are there now or the connection ended (then
        the channel is closed)."""
        try:
            got = self.sock.recv_into(view)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError:
            self._lost()
            return 0
        if got == 0:
            self._lost()
        return got

    def _compact(self) -> None:
        pending = self._end - self._start
        self._buf[:pending] = self._buf[self._start:self._end]
        self._start, self._end = 0, pending

    def _parse(self) -> None:
        buf = self._buf
        while not self.closed and self._end - self._start >= 4:
            length = _LENGTH.unpack_from(buf, self._start)[0]
            whole = 4 + length
            if self._end - self._start >= whole:
                message = bytearray(self._view[self._start + 4:self._start + whole])
                self._start += whole
                self._deliver(message)
                continue
            if whole > len(buf) or length >= _BIG:  # read the rest straight into its own buffer
                have = self._end - self._start - 4
                self._big = bytearray(length)
                self._big[:have] = self._view[self._start + 4:self._end]
                self._big_filled = have
                self._start = self._end = 0
                return
            if self._start:
                self._compact()
            return
        if self._start == self._end:
            self._start = self._end = 0

    def _read_big(self) -> bool:
        big = self._big
        got = self._recv_into(memoryview(big)[self._big_filled:])
        if not got:
            return False
        self._big_filled += got
        if self._big_filled == len(big):
            self._big = None
            self._deliver(big)
        return True

    def _deliver(self, message) -> None:
        try:
            frames = _split(message)
        except ValueError:
            self._lost()  # not our protocol: nothing after it can be trusted
            return
        self.on_message(frames)

    # closing -------------------------------------------------------------------------------

    def _lost(self) -> None:
        if self.closed:
            if self._linger is not None:
                self._shut()  # the peer went away while we lingered
            return
        self.close()
        if self.on_close is not None:
            self.on_close()

    async def sent(self) -> None:
        """Return once everything sent so far is written to the socket (or the channel is
        closed): what a node awaits before it exits, so its last replies go out."""
        if not self._unsent or self.closed and self._linger is None:
            return
        if self._all_sent is None:
            self._all_sent = self._loop.create_future()
        await asyncio.shield(self._all_sent)

    def close(self, linger_s: float = 0.0) -> None:
        """Close; what is still unsent goes on being written from the loop for up to
        ``linger_s`` seconds (as a ZeroMQ socket lingers: a server that answers a last request
        and closes must not lose the answer), then the socket closes."""
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self._fd)
        if self._unsent and linger_s > 0:
            self._linger = self._loop.call_later(linger_s, self._shut)
            return
        self._shut()

    def _shut(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if self._unsent:
            self._loop.remove_writer(self._fd)
            self._unsent.clear()
        self._signal_sent()
        self.sock.close()

    def _signal_sent(self) -> None:
        if self._all_sent is not None:
            if not self._all_sent.done():
                self._all_sent.set_result(None)
            self._all_sent = None


def frame_header(frames: list) -> tuple[bytes, int]:
    """The header that goes before ``frames`` on the wire, and the whole message's length."""
    sizes = [_nbytes(frame) for frame in frames]
    rest = 2 + 4 * len(frames) + sum(sizes)
    return b"".join([_LENGTH.pack(rest), _COUNT.pack(len(frames)), *map(_U32.pack, sizes)]), \
        4 + rest


def read_message(sock: socket.socket) -> list:
    """One whole message from a blocking socket (for tools and tests that drive a socket by
    hand; the event loop's reader is :class:`StreamChannel`)."""
    length = _LENGTH.unpack(_read_exactly(sock, 4))[0]
    return _split(_read_exactly(sock, length))


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("peer closed the connection mid-message")
        data += chunk
    return bytes(data)


def _nbytes(buffer) -> int:
    return len(buffer) if type(buffer) is bytes else memoryview(buffer).nbytes


def _split(message) -> list:
    """The frames of one message (without its length prefix): views of ``message``."""
    if len(message) < 2:
        raise ValueError("message shorter than its frame count")
    count = _COUNT.unpack_from(message, 0)[0]
    at = 2 + 4 * count
    if count == 0 or at > len(message):
        raise ValueError("bad frame count")
    sizes = struct.unpack_from(f"<{count}I", message, 2)
    if at + sum(sizes) != len(message):
        raise ValueError("frame lengths do not add up to the message")
    view = memoryview(message)
    frames = []
    for size in sizes:
        frames.append(view[at:at + size])
        at += size
    return frames
