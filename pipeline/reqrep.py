"""Request/reply: a server listens, clients connect one connection per server and match
replies to requests by id, with timeouts.

On one machine (``unix://`` endpoints; a server given ``ipc://`` advertises ``unix://``) both
ends speak over a plain Unix stream socket read from the event loop (:mod:`pipeline.stream`:
one wake-up per message, where ZeroMQ's I/O threads add two). Over ``tcp://`` a server binds a
ROUTER and clients connect a DEALER (CurveZMQ), both run on a
:class:`~pipeline.channel.Channel`.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import struct

import zmq

from pipeline import codec, stream
from pipeline.channel import Channel
from pipeline.endpoint_context import EndpointContext
from pipeline.sockets import bind
from pipeline.topics import TopicStats

log = logging.getLogger(__name__)

_U64 = struct.Struct("<Q")
_RECONNECT_S = 0.05  # a listed server that refused a connection is tried again this often


class Request:
    """A request received by a :class:`ServiceServer`; answer it with :meth:`reply`."""

    __slots__ = ("server", "routing_id", "request_id", "envelope")

    def __init__(self, server, routing_id, request_id, envelope):
        self.server, self.routing_id = server, routing_id
        self.request_id, self.envelope = request_id, envelope

    @property
    def message(self):
        return self.envelope.message

    async def reply(self, msg) -> None:
        """Send the reply now (a ROUTER with no high-water mark never blocks on send)."""
        self.server.send_reply(self, msg)


class ServiceServer:
    """Answers requests from every client of a service. The socket is driven by a
    :class:`~pipeline.channel.Channel`: requests are parsed as they arrive and queued, replies
    go out at once (the env runners wait on this round trip every step)."""

    def __init__(self, context: EndpointContext, service: str, endpoint: str):
        self.context, self.service = context, service
        self._sender = context.instance
        self.stats = TopicStats()
        self._waiting: collections.deque[Request] = collections.deque()
        self._wakeup: asyncio.Future | None = None
        self._channel: Channel | None = None  # made on first use, inside the running loop
        self.sock = self._listener = None
        self._streams: set[stream.StreamChannel] = set()  # one per connected client
        if stream.is_stream(endpoint):
            path = stream.path_of(endpoint)
            self._listener = stream.Listener(path)
            self.endpoint = stream.SCHEME + path
        else:
            self.sock = context.sockets.make(zmq.ROUTER, hwm=0)
            self.endpoint = bind(self.sock, endpoint)
        self._started = False

    def _ensure_channel(self) -> None:
        if self._started:
            return
        self._started = True
        if self._listener is not None:
            self._listener.start(self._on_connection)
        else:
            self._channel = Channel(self.sock, self._on_message)

    def _on_connection(self, conn) -> None:
        channel = stream.StreamChannel(conn, None)
        channel.on_message = lambda frames: self._on_stream_message(channel, frames)
        channel.on_close = lambda: self._streams.discard(channel)
        self._streams.add(channel)

    async def recv(self) -> Request:
        self._ensure_channel()
        while not self._waiting:
            self._wakeup = asyncio.get_running_loop().create_future()
            try:
                await self._wakeup
            finally:
                self._wakeup = None
        return self._waiting.popleft()

    def recv_nowait(self) -> Request | None:
        """A request that is already waiting, or None (for batching requests together)."""
        self._ensure_channel()
        return self._waiting.popleft() if self._waiting else None

    def send_reply(self, request: Request, msg) -> None:
        frames = codec.encode(msg, self._sender)
        route = request.routing_id
        if type(route) is stream.StreamChannel:
            if not route.closed:  # a client that went away gets nothing, as from a ROUTER
                route.send([request.request_id, *frames])
        else:
            self._channel.send([route, request.request_id, *frames])

    def _on_message(self, frames) -> None:
        if len(frames) < 3:
            self.stats.malformed += 1
            return
        self._queue(frames[0].bytes, frames[1].bytes, frames[2:])

    def _on_stream_message(self, channel: stream.StreamChannel, frames) -> None:
        if len(frames) < 2:
            self.stats.malformed += 1
            return
        self._queue(channel, bytes(frames[0]), frames[1:])

    def _queue(self, route, request_id: bytes, frames) -> None:
        try:
            envelope = codec.decode(frames)
        except codec.ProtocolError as exc:
            self.stats.malformed += 1
            log.warning("%s: malformed request on %s: %s", self.context.instance, self.service,
                        exc)
            return
        self.stats.received += 1
        self._waiting.append(Request(self, route, request_id, envelope))
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    def __aiter__(self):
        return self

    async def __anext__(self) -> Request:
        return await self.recv()

    async def flush(self, timeout: float) -> bool:
        """Wait until every reply sent so far is written out (a Unix socket takes a large
        reply over several writes); whether that happened within ``timeout``."""
        try:
            async with asyncio.timeout(timeout):
                for channel in list(self._streams):
                    await channel.sent()
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        if self.sock is not None:
            self.context.sockets.close(self.sock)
        if self._listener is not None:
            self._listener.close()
            for channel in list(self._streams):
                channel.close(linger_s=stream.LINGER_S)
            self._streams.clear()


class ServerGone(TimeoutError):
    """The server a request went to exited before replying (a TimeoutError, so callers that
    retry on timeouts retry on this too, only sooner)."""


class ServiceClient:
    """Sends requests round-robin over every server of a service; replies matched by id.

    A pending request is a plain future with a timer, not a task: the env runner makes one per
    step of its environments, and tasks and ``wait_for`` cost more than the round trip."""

    def __init__(self, context: EndpointContext, service: str):
        self.context, self.service = context, service
        self._sender = context.instance
        self.stats = TopicStats()
        self._conns: dict[str, tuple] = {}  # endpoint -> (socket, Channel or StreamChannel)
        self._pending: dict[bytes, asyncio.Future] = {}
        self._sent_to: dict[bytes, str] = {}  # request id -> endpoint it went to
        self._ids = itertools.count(1)
        self._rotation = itertools.count()
        # Requests made while no server was connected (issue 11: a restarting server is
        # absent for a moment): (future, msg, deadline, timer), sent once one connects.
        self._parked: list = []
        self._connected = asyncio.Event()  # some server is connected now
        self._listed: list[str] = []  # the servers the supervisor last reported
        self._retry: asyncio.TimerHandle | None = None  # the next reconnection attempt
        self._closed = False

    @property
    def connections(self) -> dict:
        """The servers connected now: endpoint -> socket (a Unix socket on one machine, a
        ZeroMQ DEALER over tcp)."""
        return {endpoint: sock for endpoint, (sock, _) in self._conns.items()}

    def set_endpoints(self, endpoints: list[str]) -> None:
        self._listed = list(endpoints)
        for endpoint in endpoints:
            if endpoint not in self._conns:
                if stream.is_stream(endpoint):
                    self._connect_stream(endpoint)
                else:
                    sock = self.context.sockets.make(zmq.DEALER, hwm=0)
                    sock.connect(endpoint)
                    self._conns[endpoint] = (sock, Channel(sock, self._on_reply))
        for endpoint in list(self._conns):
            if endpoint not in endpoints:
                self._disconnect(endpoint)
                self._fail_requests_to(endpoint)
        self._on_connections_changed()

    def _disconnect(self, endpoint: str) -> None:
        sock, channel = self._conns.pop(endpoint)
        channel.close()  # a stream channel closes its socket itself
        if not isinstance(channel, stream.StreamChannel):
            self.context.sockets.close(sock)

    def _on_connections_changed(self) -> None:
        if self._conns:
            self._connected.set()
            self._send_parked()
        else:
            self._connected.clear()

    async def wait_connected(self) -> None:
        """Return once some server is connected (at once if one is)."""
        await self._connected.wait()

    # Same-machine servers (pipeline.stream) ---------------------------------------------------
    # A connection is made when the server is listed. If the server refuses (it is gone, or
    # not listening yet) or closes the connection (it exited), its pending requests fail with
    # ServerGone at once and the connection is tried again while the server stays listed; a
    # restarted server is a new endpoint, so this only ever reconnects to a live one.

    def _connect_stream(self, endpoint: str) -> None:
        try:
            sock = stream.connect(stream.path_of(endpoint))
        except OSError:
            self._retry_later()
            return
        channel = stream.StreamChannel(sock, self._on_stream_reply)
        channel.on_close = lambda: self._on_stream_closed(endpoint, channel)
        self._conns[endpoint] = (sock, channel)

    def _on_stream_closed(self, endpoint: str, channel) -> None:
        if self._conns.get(endpoint, (None, None))[1] is not channel:
            return
        del self._conns[endpoint]
        self._fail_requests_to(endpoint)
        self._on_connections_changed()
        self._retry_later()

    def _retry_later(self) -> None:
        if self._retry is None and not self._closed:
            self._retry = asyncio.get_running_loop().call_later(_RECONNECT_S, self._reconnect)

    def _reconnect(self) -> None:
        self._retry = None
        missing = [e for e in self._listed if e not in self._conns]
        for endpoint in missing:
            self._connect_stream(endpoint)
        if any(e in self._conns for e in missing):
            self._on_connections_changed()

    def _fail_requests_to(self, endpoint: str) -> None:
        """The server behind ``endpoint`` is gone: its pending requests fail now, not at their
        timeout, so callers can ask a replacement at once."""
        for request_id, sent_to in list(self._sent_to.items()):
            future = self._pending.get(request_id)
            if sent_to == endpoint and future is not None and not future.done():
                future.set_exception(ServerGone(
                    f"server of {self.service!r} at {endpoint} went away"))

    def _on_reply(self, frames) -> None:
        self._complete(frames[0].bytes, frames[1:])

    def _on_stream_reply(self, frames) -> None:
        self._complete(bytes(frames[0]), frames[1:])

    def _complete(self, request_id: bytes, frames) -> None:
        future = self._pending.get(request_id)
        if future is None or future.done():
            return  # reply to a request that timed out
        try:
            future.set_result(codec.decode(frames))
        except codec.ProtocolError as exc:
            self.stats.malformed += 1
            future.set_exception(exc)

    def drain(self) -> None:
        """Take in every reply already waiting on the sockets now, completing its future
        without a trip through the event loop. For a caller that computed while its prefetched
        reply arrived (the learner trains while its next batch comes): the reply is then ready
        at once, where awaiting it would first go round the loop (~50 µs per update)."""
        for _, channel in list(self._conns.values()):
            channel.drain()

    async def request(self, msg, timeout: float = 30.0) -> codec.Envelope:
        """Send ``msg`` to one server and wait for its reply; TimeoutError after ``timeout``
        (waiting for a server to connect, if none is, counts in it)."""
        return await self.submit(msg, timeout)

    def submit(self, msg, timeout: float = 30.0, endpoint: str | None = None) -> asyncio.Future:
        """Send ``msg`` now (needs a connected server) and return a future of the reply; it
        fails with TimeoutError after ``timeout`` seconds, or ServerGone if the server exits.

        For prefetching: the request is on its way before the caller goes on to other work.
        ``endpoint`` picks the server (one of :attr:`connections`: a replay shard); by
        default requests go round-robin.
        """
        loop = asyncio.get_running_loop()
        if endpoint is not None and endpoint not in self._conns:
            future = loop.create_future()
            future.set_exception(ServerGone(f"server of {self.service!r} at {endpoint} is gone"))
            return future
        if not self._conns:
            return self._park(msg, timeout)
        if endpoint is None:
            endpoints = list(self._conns)
            endpoint = endpoints[next(self._rotation) % len(endpoints)]
        request_id = _U64.pack(next(self._ids))
        future = loop.create_future()
        self._pending[request_id] = future
        self._sent_to[request_id] = endpoint
        timer = loop.call_later(timeout, self._time_out, future, timeout)
        future.add_done_callback(lambda _: self._forget(request_id, timer))
        self.stats.sent += 1
        self._conns[endpoint][1].send([request_id, *codec.encode(msg, self._sender)])
        return future

    # Waiting for a server (issue 11) ---------------------------------------------------------
    # A request made while no server is connected (the server is restarting, or not up yet)
    # waits for one within its own timeout instead of failing at once: the caller sees the
    # same future either way, and only the timeout fails it.

    def _park(self, msg, timeout: float) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        timer = loop.call_later(timeout, self._time_out_parked, future, timeout)
        self._parked.append((future, msg, loop.time() + timeout, timer))
        return future

    def _time_out_parked(self, future: asyncio.Future, timeout: float) -> None:
        if not future.done():
            future.set_exception(TimeoutError(
                f"no server for service {self.service!r} within {timeout:.0f}s"))

    def _send_parked(self) -> None:
        parked, self._parked = self._parked, []
        if not parked:
            return
        now = asyncio.get_running_loop().time()
        for future, msg, deadline, timer in parked:
            timer.cancel()
            if future.done():  # cancelled by the caller, or timed out
                continue
            inner = self.submit(msg, max(0.0, deadline - now))
            inner.add_done_callback(lambda f, outer=future: _chain(f, outer))
            future.add_done_callback(lambda f, inner=inner: inner.cancel() if f.cancelled()
                                     else None)

    def _time_out(self, future: asyncio.Future, timeout: float) -> None:
        if not future.done():
            future.set_exception(TimeoutError(
                f"no reply from service {self.service!r} within {timeout:.0f}s"))

    def _forget(self, request_id: bytes, timer: asyncio.TimerHandle) -> None:
        timer.cancel()
        self._pending.pop(request_id, None)
        self._sent_to.pop(request_id, None)

    def close(self) -> None:
        self._closed = True
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        for future, _, _, timer in self._parked:
            timer.cancel()
            if not future.done():
                future.cancel()
        self._parked.clear()
        for endpoint in list(self._conns):
            self._disconnect(endpoint)


def _chain(inner: asyncio.Future, outer: asyncio.Future) -> None:
    """Give a parked request's caller the outcome of the request sent for it."""
    if outer.done():
        return
    if inner.cancelled():
        outer.cancel()
    elif inner.exception() is not None:
        outer.set_exception(inner.exception())
    else:
        outer.set_result(inner.result())
