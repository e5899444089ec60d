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
import contextlib
import logging
import time
from typing import TYPE_CHECKING

import zmq

from pipeline import codec
from pipeline.sockets import bind, recv_now, send_now
from pipeline.topics import LATEST, LOSSY, TopicStats

if TYPE_CHECKING:
    from pipeline.bus import Bus

log = logging.getLogger(__name__)


class _XPubSide:
    """An XPUB socket plus a task that counts its subscribers as (un)subscriptions arrive.

    Why a task: a publisher that only looked when it sent could not answer a late joiner of a
    ``latest`` topic until its next message, which may never come (the learner's first
    parameters are sent once, then it waits for data that needs them).
    """

    def __init__(self, bus: Bus, endpoint: str, hwm: int):
        self.bus = bus
        self.sock = bus.sockets.make(zmq.XPUB, hwm=hwm, xpub_verbose=1)
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
        self.bus.sockets.close(self.sock)


TAP_MAX_RATE = 200.0  # messages/s a tap mirrors at most: a sample for people, not a copy


class Tap(_XPubSide):
    """A lossy XPUB that mirrors a reliable topic while (and only while) someone subscribes.

    It mirrors at most ``TAP_MAX_RATE`` messages per second: on a busy topic a monitor sees a
    sample, and neither the publisher nor the monitor spends CPU the graph needs (on a small
    machine the monitor's own decoding would otherwise take cores from the nodes)."""

    def __init__(self, bus: Bus, endpoint: str):
        super().__init__(bus, endpoint, hwm=100)
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

    def __init__(self, bus: Bus, topic: str, endpoint: str, hwm: int, delivery: str):
        super().__init__(bus, endpoint, hwm)
        self.topic, self.delivery = topic, delivery
        self.stats = TopicStats()
        self.seq = 0
        self._topic_frame = topic.encode()
        self._newest: list | None = None

    def on_subscribe(self) -> None:
        if self.delivery == LATEST and self._newest is not None:
            self._send(self._newest)  # a late joiner still gets the current value

    def _send(self, frames: list) -> None:
        try:
            send_now(self.sock, [self._topic_frame, *frames])
        except zmq.Again:
            self.stats.dropped += 1

    async def send(self, msg) -> None:
        self.send_nowait(msg)

    def send_nowait(self, msg) -> None:
        self.seq += 1
        self.stats.sent += 1
        if self.delivery == LOSSY and not self.subscribers:
            return  # nobody listens: do not even encode
        frames = codec.encode(msg, self.bus.instance, self.seq)
        if self.delivery == LATEST:
            self._newest = frames
        self._send(frames)

    def pending(self) -> int:
        return 0

    async def flush(self, timeout: float | None = None) -> bool:
        return True


class BroadcastSubscriber:
    """SUB side of ``latest``/``lossy`` topics (and of reliable taps)."""

    def __init__(self, bus: Bus, topic: str, delivery: str, hwm: int = 1000):
        self.bus, self.topic, self.delivery = bus, topic, delivery
        self.stats = TopicStats()
        self.sock = bus.sockets.make(zmq.SUB, hwm=hwm)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.endpoints: set[str] = set()
        self._last_seq: dict[str, int] = {}

    def set_endpoints(self, endpoints: list[str]) -> None:
        for endpoint in set(endpoints) - self.endpoints:
            self.sock.connect(endpoint)
        for endpoint in self.endpoints - set(endpoints):
            self.sock.disconnect(endpoint)
        self.endpoints = set(endpoints)

    def _accept(self, frames) -> codec.Envelope | None:
        try:
            envelope = codec.decode(frames[1:])
        except codec.ProtocolError as exc:
            self.stats.malformed += 1
            log.warning("%s: dropped malformed message on %s: %s", self.bus.instance,
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
        while True:
            envelope = self._accept(await self.sock.recv_multipart(copy=False))
            if envelope is None:
                continue
            if self.delivery == LATEST:
                newer = self.poll_newest()
                envelope = newer or envelope
            return envelope

    def poll_newest(self) -> codec.Envelope | None:
        """The newest message waiting, without blocking (None if nothing new)."""
        newest = None
        while (frames := recv_now(self.sock)) is not None:
            newest = self._accept(frames) or newest
        return newest

    def __aiter__(self):
        return self

    async def __anext__(self):
        return await self.recv()

    def close(self) -> None:
        self.bus.sockets.close(self.sock)
