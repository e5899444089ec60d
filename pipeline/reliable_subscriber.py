"""Reliable topics, the subscriber side: one DEALER per publisher (``_Connection``) and the
``ReliableSubscriber`` that joins a consumer group on each, checks delivery counters, grants
credit and acknowledges what the node handled. The protocol and the publisher are in
:mod:`pipeline.reliable`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import struct

import zmq

from pipeline import batch_codec, codec, reliable
from pipeline.channel import Channel
from pipeline.endpoint_context import EndpointContext
from pipeline.messages import Batch, Credit, Join, Leave
from pipeline.reliable import (
    _BATCH,
    _BATCH_HEAD,
    _CTRL,
    _DATA,
    _HEAD,
    _LEAVE_ACK,
    _REJOIN,
    _U64,
    _WELCOME,
    SECRET_ENV,
)
from pipeline.topics import TopicStats

log = logging.getLogger(__name__)

_BATCH_KIND = Batch.KIND


class _Connection:
    """One DEALER from a reliable subscriber to one publisher endpoint."""

    def __init__(self, sub: ReliableSubscriber, endpoint: str):
        self.sub, self.endpoint = sub, endpoint
        # A routing id of our own: a tcp connection that breaks and comes back is the same
        # member to the publisher (it takes the id over: ROUTER_HANDOVER), not a stranger.
        self.sock = sub.context.sockets.make(zmq.DEALER, hwm=0,
                                             routing_id=b"m" + os.urandom(11))
        self.sock.connect(endpoint)
        self._channel = Channel(self.sock, self._on_message)  # every send and receive on sock
        self.expected = 1
        self.unacked = 0  # delivered and not yet acknowledged
        self.handled = 0  # of those, handed out by recv() and then asked past
        self.handled_bytes = 0  # their envelopes and array frames
        self.left = False
        # False from a rejoin until the publisher confirms it took that Join (see _rejoin).
        self.welcomed = True
        # The DEALER queues this until the connection is up: no handshake, no sleep.
        self._join()

    def _join(self) -> None:
        sub = self.sub
        self.send_control(Join(sub.topic, sub.group, sub.context.instance, sub.window,
                               sub.window_bytes, os.environ.get(SECRET_ENV, ""), self.unacked))
        if sub.leaving:
            self.send_control(Leave(sub.topic))

    def _rejoin(self) -> None:
        """The publisher does not know us any more: it evicted us after a silence (this
        process was stopped, or cut off, past the membership timeout) and gave what we held
        back to our group. Join again, saying how many messages we still hold: it gives back
        those nobody took meanwhile, so we handle and acknowledge them as before. Told once
        per eviction: asks that cross our Join (FIFO per connection) are ignored."""
        if not self.welcomed:
            return
        self.welcomed = False
        self.expected = 1  # a new membership numbers its deliveries from 1
        self.sub.stats.rejoined += 1
        log.warning("%s: evicted from %s by %s; joining again holding %d messages",
                    self.sub.context.instance, self.sub.topic, self.endpoint, self.unacked)
        self._join()

    def send_control(self, msg) -> None:
        self._channel.send(codec.encode(msg))

    def ack(self, count: int) -> None:
        self.unacked -= count
        self.send_control(Credit(self.sub.topic, count))

    def ack_handled(self) -> None:
        count, self.handled, self.handled_bytes = self.handled, 0, 0
        if count and not self.sock.closed:
            self.ack(count)

    def _on_message(self, frames: list) -> None:
        # Only the head frame is small (copied): the rest are large arrays, left in place.
        self._on_frames(frames[0].bytes, frames)
        self.sub._wake()

    def _on_frames(self, head: bytes, frames: list) -> None:
        sub = self.sub
        if head[:1] == _CTRL:
            tag = head[1:2]
            if tag == _LEAVE_ACK:
                self.left = True
            elif tag == _WELCOME:
                self.welcomed = True
            elif tag == _REJOIN:
                self._rejoin()
            return
        if head[:1] == _BATCH:
            self._on_batch(head, frames)
            return
        if head[:1] != _DATA or len(head) < _HEAD.size:
            sub.stats.malformed += 1
            log.warning("%s: dropped badly framed message on %s", sub.context.instance, sub.topic)
            self.ack(1)  # it took a credit: give it back so the publisher is not starved
            return
        delivery = _U64.unpack_from(head, 1)[0]
        if delivery != self.expected:
            sub.stats.gaps += abs(delivery - self.expected)
            log.error("%s: gap on %s from %s: expected %d, got %d", sub.context.instance,
                      sub.topic, self.endpoint, self.expected, delivery)
        self.expected = delivery + 1
        self.unacked += 1
        try:
            if len(frames) == 1:
                envelope = codec.decode([head], _HEAD.size)
                nbytes = len(head) - _HEAD.size
            else:
                envelope = codec.decode([head, *frames[1:]], _HEAD.size)
                nbytes = len(head) - _HEAD.size + sum(map(len, frames[1:]))
            self._enqueue(envelope, nbytes)
        except codec.ProtocolError as exc:
            sub.stats.malformed += 1
            log.warning("%s: dropped malformed message on %s: %s", sub.context.instance,
                        sub.topic, exc)
            self.ack(1)

    def _enqueue(self, envelope: codec.Envelope, nbytes: int) -> None:
        """Queue a delivered message; a :class:`~pipeline.messages.Batch` as its items, of which
        only the last carries this connection: the batch is one message to acknowledge, once
        the consumer asked past its last item. ProtocolError (nothing queued) if an item is bad."""
        queue = self.sub._queue
        if envelope.kind != _BATCH_KIND:
            queue.append((self, envelope, nbytes))
            return
        items = batch_codec.unbatch(envelope)
        for item in items[:-1]:
            queue.append((None, item, 0))
        queue.append((self, items[-1], nbytes))

    def _on_batch(self, head: bytes, frames) -> None:
        """Unpack a batch delivery (layout at ``_BATCH_HEAD``) into the queue, in order."""
        sub = self.sub
        if len(head) < _BATCH_HEAD.size:
            sub.stats.malformed += 1
            log.warning("%s: dropped badly framed batch on %s", sub.context.instance, sub.topic)
            self.ack(1)
            return
        _, first, count = _BATCH_HEAD.unpack_from(head)
        # More messages than the credit we ever grant is a lie: count the batch as one message.
        sane = 1 <= count <= sub.window
        messages = count if sane else 1
        if first != self.expected:
            sub.stats.gaps += abs(first - self.expected)
            log.error("%s: gap on %s from %s: expected %d, got %d", sub.context.instance,
                      sub.topic, self.endpoint, self.expected, first)
        self.expected = first + messages
        self.unacked += messages
        table_end = _BATCH_HEAD.size + 8 * count
        if sane and len(head) >= table_end:
            table = struct.unpack_from(f"<{2 * count}I", head, _BATCH_HEAD.size)
            lengths, buffer_counts = table[:count], table[count:]
            sane = (table_end + sum(lengths) == len(head)
                    and sum(buffer_counts) == len(frames) - 1)
        else:
            sane = False
        if not sane:
            # Every message in it took a credit: give them all back.
            sub.stats.malformed += messages
            log.warning("%s: dropped a badly framed batch of %d on %s", sub.context.instance,
                        messages, sub.topic)
            self.ack(messages)
            return
        decode, enqueue, alone = codec.decode, self._enqueue, [head]
        start, frame, bad = table_end, 1, 0
        for length, buffers in zip(lengths, buffer_counts, strict=True):
            end = start + length
            try:
                if buffers:
                    arrays = frames[frame:frame + buffers]
                    frame += buffers
                    enqueue(decode([head, *arrays], start, end), length + sum(map(len, arrays)))
                else:
                    enqueue(decode(alone, start, end), length)
            except codec.ProtocolError as exc:
                bad += 1
                log.warning("%s: dropped malformed message on %s: %s", sub.context.instance,
                            sub.topic, exc)
            start = end
        if bad:
            sub.stats.malformed += bad
            self.ack(bad)

    def close(self) -> None:
        self._channel.close()
        self.sub.context.sockets.close(self.sock)


class ReliableSubscriber:
    """Consumes a reliable topic from every publisher of it, as a member of ``group``.

    ``recv()`` returns the next :class:`codec.Envelope`; asking for the next message acknowledges
    the previous one, so a message counts as handled only once its consumer came back for more.
    After :meth:`leave`, ``recv()`` returns None once every publisher confirmed that nothing more
    is coming and everything already delivered was returned.
    """

    def __init__(self, context: EndpointContext, topic: str, window: int, window_bytes: int,
                 group: str):
        self.context, self.topic, self.group = context, topic, group
        # The end-to-end acknowledgement, asked once per handled message: bound here.
        self._outputs, self._watermark = context.outputs, context.watermark
        self.window, self.window_bytes = window, window_bytes  # credit per publisher
        self.stats = TopicStats()
        self.connections: dict[str, _Connection] = {}
        # (connection, envelope, bytes) delivered and not yet handed out
        self._queue: collections.deque = collections.deque()
        self._event = asyncio.Event()
        self._last: _Connection | None = None  # the message handed out last, and its bytes
        self._last_bytes = 0
        self._handed: list = []  # (connection, bytes) of what recv_many handed out last
        self._to_ack: set[_Connection] = set()  # connections with handled messages
        # Handled messages whose outputs are not yet acknowledged downstream:
        # (connection, watermark, bytes) in order; see Bus.watermark.
        self._waiting: collections.deque = collections.deque()
        self._ack_batch = max(1, window // 4)
        self._ack_bytes = max(1, window_bytes // 4)
        self._ack_timer: asyncio.TimerHandle | None = None
        self._sweep_timer: asyncio.TimerHandle | None = None  # see _sweep_acks
        self._keepalive: asyncio.TimerHandle | None = None
        self.leaving = False

    def set_endpoints(self, endpoints: list[str]) -> None:
        for endpoint in endpoints:
            if endpoint not in self.connections:
                self.connections[endpoint] = _Connection(self, endpoint)
        for endpoint in list(self.connections):
            if endpoint not in endpoints:
                self.connections.pop(endpoint).close()
        self._ensure_keepalive()
        self._wake()

    def _ensure_keepalive(self) -> None:
        if self._keepalive is None and self.connections:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # wired outside a loop: recv() starts it
                return
            self._keepalive = loop.call_later(reliable.KEEPALIVE_S, self._keep_alive)

    def _keep_alive(self) -> None:
        """Tell every publisher we are still here (see MEMBER_TIMEOUT_S): a member may hold
        credit or messages for long while its node is busy or its input idle."""
        self._keepalive = None
        for conn in self.connections.values():
            if not conn.left and not conn.sock.closed:
                conn.send_control(Credit(self.topic, 0))
        self._ensure_keepalive()

    def _wake(self) -> None:
        self._event.set()

    def _ack_previous(self, threshold: int | None = None) -> None:
        """Return credit in batches of a quarter window, in messages or in bytes (one Credit
        message per message would cost the publisher as much as the data). Whatever stays
        below that is sent by :meth:`_flush_acks` if we go idle, like TCP's delayed ACK, so a
        publisher waiting for its last acknowledgements is never stuck."""
        conn = self._last
        if conn is not None:
            self._last = None
            # (a node without reliable outputs has no watermark: skip asking for it)
            watermark = self._watermark() if self._outputs else ()
            if watermark or self._waiting:
                # End to end: what this node published while handling the message must be
                # acknowledged downstream before the message is, or a crash here would lose it.
                self._waiting.append((conn, watermark, self._last_bytes))
                conn = self._release()
            else:
                conn.handled += 1
                conn.handled_bytes += self._last_bytes
                self._to_ack.add(conn)
                if self._sweep_timer is None:  # checked here: this runs once per message
                    self._arm_sweep()
        if threshold is None:  # only the last connection's count moved
            if conn is not None and (conn.handled >= self._ack_batch
                                     or conn.handled_bytes >= self._ack_bytes):
                self._to_ack.discard(conn)
                conn.ack_handled()
            return
        for conn in [c for c in self._to_ack
                     if c.handled >= threshold or c.handled_bytes >= self._ack_bytes]:
            self._to_ack.discard(conn)
            conn.ack_handled()

    def _release(self):
        """Count the waiting messages whose outputs are now acknowledged; return the last
        connection that got one (for the batch check), or None."""
        waiting, conn = self._waiting, None
        while waiting and all(pub.completed_through >= seq for pub, seq in waiting[0][1]):
            conn, _, nbytes = waiting.popleft()
            conn.handled += 1
            conn.handled_bytes += nbytes
            self._to_ack.add(conn)
        if conn is not None:
            self._arm_sweep()
        return conn

    def _arm_sweep(self) -> None:
        if self._sweep_timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # closing outside a loop: close() acknowledges everything
                return
            self._sweep_timer = loop.call_later(reliable.ACK_SWEEP_S, self._sweep_acks)

    def on_output_acknowledged(self) -> None:
        if self._waiting and self._release() is not None:
            self._ack_previous(threshold=self._ack_batch)
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self._to_ack and self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(reliable.ACK_DELAY_S,
                                                                    self._flush_acks)

    def _flush_acks(self) -> None:
        self._ack_timer = None
        self._ack_previous(threshold=1)

    def _sweep_acks(self) -> None:
        """Acknowledge what every connection has handled below the batch size. The idle flush
        above never runs while other publishers keep the queue full (a replay store held back
        by its rate limiter, fed by a new actor), so a publisher that sent its last messages
        (a swapped node flushing before it exits) would wait for their acknowledgement until
        it was killed. Only handled messages: what the consumer holds now is not."""
        self._sweep_timer = None
        for conn in list(self._to_ack):
            self._to_ack.discard(conn)
            conn.ack_handled()

    async def _arrived(self) -> bool:
        """Wait until a message is queued; False once leaving and every publisher confirmed
        that nothing more is coming (everything delivered was handed out)."""
        queue = self._queue
        while not queue:
            if self._keepalive is None:
                self._ensure_keepalive()
            if self.leaving:
                self._ack_previous(threshold=1)
                if all(c.left for c in self.connections.values()):
                    return False
            self._schedule_flush()
            self._event.clear()
            await self._event.wait()
        return True

    async def recv(self) -> codec.Envelope | None:
        self._ack_handed_out()
        if not self._queue and not await self._arrived():
            return None
        self._last, envelope, self._last_bytes = self._queue.popleft()
        stats = self.stats
        stats.received += 1
        stats.depth = len(self._queue)
        return envelope

    async def recv_many(self, limit: int = 4096) -> list[codec.Envelope]:
        """Every message already delivered, in order (at least one, at most ``limit``): the
        items of a batch published with ``send_many`` come out as one list. Asking again (by
        either call) acknowledges them all, as ``recv`` does one. ``[]`` once left and drained.

        Why: handing out small messages one call at a time costs a coroutine step and the
        acknowledgement bookkeeping per message; here that is paid per call, the bookkeeping
        per wire message."""
        self._ack_handed_out()
        queue = self._queue
        if not queue and not await self._arrived():
            return []
        count = min(limit, len(queue))
        out, handed, pop = [None] * count, self._handed, queue.popleft
        for i in range(count):
            conn, out[i], nbytes = pop()
            if conn is not None:  # the last item of a wire message: acknowledged as one
                handed.append((conn, nbytes))
        stats = self.stats
        stats.received += count
        stats.depth = len(queue)
        return out

    async def recv_message(self) -> list[codec.Envelope]:
        """The next message as it went on the wire, whole: a list of one, or the items of a
        :class:`~pipeline.messages.Batch` (coalesced, or published with ``send_many``), which
        share its sender and sequence number. Asking again (by any call) acknowledges it.
        ``[]`` once left and drained.

        Why: a consumer that stores each message exactly once by its sequence number (the
        replay store) must store a batch's items together under that one number."""
        self._ack_handed_out()
        queue = self._queue
        if not queue and not await self._arrived():
            return []
        out, pop = [], queue.popleft
        while True:  # a wire message's items are queued together, its connection on the last
            conn, envelope, nbytes = pop()
            out.append(envelope)
            if conn is not None:
                self._handed.append((conn, nbytes))
                break
        stats = self.stats
        stats.received += len(out)
        stats.depth = len(queue)
        return out

    def _ack_handed_out(self) -> None:
        """Asking again acknowledges what the last call handed out: ``recv``'s message, or
        each wire message of what ``recv_many`` or ``recv_message`` returned."""
        if self._last is not None:
            self._ack_previous()
        if self._handed:
            handed, self._handed = self._handed, []
            for conn, nbytes in handed:
                self._last, self._last_bytes = conn, nbytes
                self._ack_previous()

    def __aiter__(self):
        return self

    async def __anext__(self) -> codec.Envelope:
        # recv()'s path for a message that is already here, without a second coroutine.
        self._ack_handed_out()
        queue = self._queue
        if queue:
            self._last, envelope, self._last_bytes = queue.popleft()
            stats = self.stats
            stats.received += 1
            stats.depth = len(queue)
            return envelope
        envelope = await self.recv()
        if envelope is None:
            raise StopAsyncIteration
        return envelope

    def leave(self) -> None:
        """Ask every publisher to stop sending to us; ``recv`` ends once drained."""
        if self.leaving:
            return
        self.leaving = True
        for conn in self.connections.values():
            conn.send_control(Leave(self.topic))
        self._wake()

    def close(self) -> None:
        self._ack_handed_out()
        self._ack_previous(threshold=1)
        if self._ack_timer is not None:
            self._ack_timer.cancel()
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
        if self._keepalive is not None:
            self._keepalive.cancel()
        for conn in self.connections.values():
            conn.close()
        self.connections.clear()
