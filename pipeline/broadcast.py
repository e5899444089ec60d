"""Latest and lossy topics over XPUB/SUB, and the taps that mirror reliable topics.

``latest``
    The publisher re-sends its newest message to every new subscription (XPUB_VERBOSE), so a
    late joiner still gets the current value; subscribers keep only messages newer than the last
    they saw from that sender.
``lossy``
    Non-blocking send; drops when a subscriber is slow. Monitors attach here.

A :class:`Tap` mirrors a reliable publisher's messages, but only while a monitor is subscribed
to it, so watching a topic costs nothing when nobody watches.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time

import zmq

from pipeline import codec
from pipeline.channel import Channel
from pipeline.endpoint_context import EndpointContext
from pipeline.sockets import ZERO_COPY_MIN, bind, send_now
from pipeline.topics import LATEST, LOSSY, TopicStats

log = logging.getLogger(__name__)


class _XPubSide:
    """An XPUB socket plus a task that counts its subscribers as (un)subscriptions arrive.

    Why a task: a publisher that only looked when it sent could not answer a late joiner of a
    ``latest`` topic until its next message, which may never come (the learner's first
    parameters are sent once, then it waits for data that needs them).
    """

    def __init__(self, context: EndpointContext, endpoint: str, hwm: int):
        self.context = context
        self.sock = context.sockets.make(zmq.XPUB, hwm=hwm, xpub_verbose=1)
        self.endpoint = bind(self.sock, endpoint)
        self.subscribers = 0
        self._task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while True:
            event = await self.sock.recv()
            if event[:1] == b"\x01":
                self.subscribers += 1
                self.on_subscribe()
            elif event[:1] == b"\x00":
                self.subscribers = max(0, self.subscribers - 1)

    def on_subscribe(self) -> None:
        pass

    def close(self) -> None:
        self._task.cancel()
        self.context.sockets.close(self.sock)


TAP_MAX_RATE = 200.0  # messages/s a tap mirrors at most: a sample for people, not a copy


class Tap(_XPubSide):
    """A lossy XPUB that mirrors a reliable topic while (and only while) someone subscribes.

    It mirrors at most ``TAP_MAX_RATE`` messages per second: on a busy topic a monitor sees a
    sample, and neither the publisher nor the monitor spends CPU the graph needs (on a small
    machine the monitor's own decoding would otherwise take cores from the nodes)."""

    def __init__(self, context: EndpointContext, endpoint: str):
        super().__init__(context, endpoint, hwm=100)
        self._next = 0.0

    def mirror(self, topic: str, frames: list) -> None:
        if self.subscribers:
            now = time.monotonic()
            if now < self._next:
                return
            self._next = now + 1.0 / TAP_MAX_RATE
            with contextlib.suppress(zmq.Again):
                send_now(self.sock, [topic.encode(), *frames])


class BroadcastPublisher(_XPubSide):
    """``latest`` or ``lossy`` publisher: XPUB, never blocks."""

    def __init__(self, context: EndpointContext, topic: str, endpoint: str, hwm: int,
                 delivery: str):
        super().__init__(context, endpoint, hwm)
        self.topic, self.delivery = topic, delivery
        self._sender = context.instance
        self.stats = TopicStats()
        self.seq = 0
        self._topic_frame = topic.encode()
        self._newest: list | None = None

    def on_subscribe(self) -> None:
        if self.delivery == LATEST and self._newest is not None:
            self._send(self._newest)  # a late joiner still gets the current value

    def _send(self, frames: list) -> None:
        copy = sum(memoryview(f).nbytes for f in frames) < ZERO_COPY_MIN
        try:
            send_now(self.sock, [self._topic_frame, *frames], copy=copy)
        except zmq.Again:
            self.stats.dropped += 1

    async def send(self, msg, key: int | None = None) -> None:
        """Send now (``key`` partitions reliable topics only; every subscriber gets this)."""
        self.send_nowait(msg)

    def send_nowait(self, msg) -> None:
        self.seq += 1
        self.stats.sent += 1
        if self.delivery == LOSSY and not self.subscribers:
            return  # nobody listens: do not even encode
        frames = codec.encode(msg, self._sender, self.seq)
        if self.delivery == LATEST:
            self._newest = frames
        self._send(frames)

    def pending(self) -> int:
        return 0

    async def flush(self, timeout: float | None = None, present_only: bool = False) -> bool:
        return True


class BroadcastSubscriber:
    """SUB side of ``latest``/``lossy`` topics (and of reliable taps).

    The socket has one reader, a :class:`~pipeline.channel.Channel` that takes every whole
    message off it as soon as the loop sees it; :meth:`recv` and :meth:`poll_newest` read what
    it queued. Why (issue 11, the unroller's ``Assertion failed: !_more (src/fq.cpp:80)`` abort
    after its learner was killed): asking a SUB socket whether a message is waiting (zmq's
    ``EVENTS``, which every event loop's readiness check does) makes libzmq read the first
    frame of the next message ahead. If the pipe that message came from is then disconnected
    (the supervisor's ``Peers`` replace a dead publisher's endpoint), the rest of the message
    never comes and libzmq aborts the process. :meth:`set_endpoints` therefore takes every
    waiting message off the socket before it disconnects anything.
    """

    def __init__(self, context: EndpointContext, topic: str, delivery: str, hwm: int = 1000):
        self.context, self.topic, self.delivery = context, topic, delivery
        self.stats = TopicStats()
        self.sock = context.sockets.make(zmq.SUB, hwm=hwm)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.endpoints: set[str] = set()
        self._last_seq: dict[str, int] = {}
        # Accepted messages not handed out yet: for ``latest`` only the newest one.
        self._queue: collections.deque[codec.Envelope] = collections.deque()
        self._limit = 1 if delivery == LATEST else max(1, hwm)
        self._wakeup: asyncio.Future | None = None
        self._channel: Channel | None = None  # made inside the running loop, on first use

    def _ensure_channel(self) -> Channel:
        if self._channel is None:
            self._channel = Channel(self.sock, self._on_message)
        return self._channel

    def _drain(self) -> None:
        """Take every whole message waiting on the socket into the queue."""
        if self._channel is not None:
            self._channel.drain()
            return
        while self.sock.get(zmq.EVENTS) & zmq.POLLIN:  # no loop yet: read it directly
            self._on_message(self.sock.recv_multipart(zmq.NOBLOCK, copy=False).result())

    def set_endpoints(self, endpoints: list[str]) -> None:
        gone = self.endpoints - set(endpoints)
        if gone:
            self._drain()  # no message half read from a pipe we are about to cut (see above)
        for endpoint in set(endpoints) - self.endpoints:
            self.sock.connect(endpoint)
        for endpoint in gone:
            self.sock.disconnect(endpoint)
        self.endpoints = set(endpoints)

    def _on_message(self, frames) -> None:
        envelope = self._accept(frames)
        if envelope is None:
            return
        if len(self._queue) >= self._limit:
            self._queue.popleft()  # latest: superseded; lossy: the oldest is dropped
            if self.delivery != LATEST:
                self.stats.dropped += 1
        self._queue.append(envelope)
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    def _accept(self, frames) -> codec.Envelope | None:
        try:
            envelope = codec.decode(frames[1:])
        except codec.ProtocolError as exc:
            self.stats.malformed += 1
            log.warning("%s: dropped malformed message on %s: %s", self.context.instance,
                        self.topic, exc)
            return None
        if self.delivery == LATEST:
            if envelope.seq <= self._last_seq.get(envelope.sender, 0):
                return None  # never go backwards
            self._last_seq[envelope.sender] = envelope.seq
        self.stats.received += 1
        return envelope

    async def recv(self) -> codec.Envelope:
        """Next message; for ``latest``, the newest one available."""
        self._ensure_channel().drain()  # what is waiting now counts, whoever polled the socket
        while not self._queue:
            self._wakeup = asyncio.get_running_loop().create_future()
            try:
                await self._wakeup
            finally:
                self._wakeup = None
        return self._queue.popleft()

    async def recv_message(self) -> list[codec.Envelope]:
        """:meth:`recv` as a list of one: the reliable subscriber's call of the same name (only
        reliable topics batch messages), so a consumer reads either kind of topic."""
        return [await self.recv()]

    def poll_newest(self) -> codec.Envelope | None:
        """The newest message waiting, without blocking (None if nothing new)."""
        self._ensure_channel().drain()
        newest = self._queue[-1] if self._queue else None
        self._queue.clear()
        return newest

    def __aiter__(self):
        return self

    async def __anext__(self):
        return await self.recv()

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self.context.sockets.close(self.sock)
