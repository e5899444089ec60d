"""Topics and services over ``zmq.asyncio``: the three delivery classes and request/reply.

Delivery classes (declared per topic in the graph):

``reliable``
    The publisher binds a ROUTER; each subscriber connects a DEALER per publisher and joins a
    *consumer group* (its node name). Every group gets every message; inside a group each message
    goes to one member that has credit (replicas share the work). Subscribers grant credit and
    acknowledge a message when they ask for the next one, so the publisher holds every message
    until it was handled: when a member disconnects (ROUTER_NOTIFY) its unacknowledged messages go
    back to the front of the group's queue. A group's queue is bounded by the topic's ``hwm``;
    when it is full ``send`` waits: a slow consumer slows the producer, nothing is dropped.
    The publisher buffers for groups the graph says will subscribe even before they connect, so
    there is no slow-joiner loss and no sleep. Each delivery carries a per-connection counter that
    the subscriber checks: ``gaps`` must stay zero. Messages queued for a member with credit go
    as one batch delivery (counted, credited and acknowledged per message, as before).
``latest``
    XPUB/SUB with a small high-water mark. The publisher re-sends its newest message to every new
    subscription (XPUB_VERBOSE), so a late joiner still gets the current value; subscribers keep
    only messages newer than the last they saw from that sender.
``lossy``
    XPUB/SUB, non-blocking send; drops when a subscriber is slow. Monitors attach here.

Reliable publishers also bind a lossy *tap* that mirrors every message, but only while a
monitor is subscribed to it, so watching a topic costs nothing when nobody watches.

Request/reply: a server binds a ROUTER, clients connect a DEALER per server and match replies to
requests by id, with timeouts.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import struct
import time
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from pipeline import codec
from pipeline.channel import Channel
from pipeline.messages import Credit, Join, Leave, LeaveAck
from pipeline.sockets import SocketFactory, bind, recv_now, send_now, tap_endpoint

log = logging.getLogger(__name__)

RELIABLE, LATEST, LOSSY = "reliable", "latest", "lossy"
DELIVERY_CLASSES = (RELIABLE, LATEST, LOSSY)

_U64 = struct.Struct("<Q")
# A delivery is [routing id, b"D" + u64 per-connection counter + envelope, *array frames]: the
# header rides in the envelope's frame because every frame costs a send and a receive.
_HEAD = struct.Struct("<cQ")
# Several messages for one member go as one batch delivery: [routing id, b"B" + u64 counter of
# the first message + u32 count + count u32 envelope lengths + count u32 array-frame counts +
# the envelopes back to back, *every message's array frames in order]. Counters, credits and
# acknowledgements stay per message; a batch only saves the sends, receives and wake-ups.
_BATCH_HEAD = struct.Struct("<cQI")
BATCH_MAX = 64  # messages per batch
BATCH_BYTES = 4 << 20  # a batch stops growing once its messages reach this many bytes
# Bytes in flight per subscriber connection (besides the message window): bounds the memory a
# slow consumer of large messages pins on both sides, and keeps it small enough to stay cached.
WINDOW_BYTES = 32 << 20
_LEAVE_ACK = b"A"
ACK_DELAY_S = 0.002  # how long an idle subscriber may sit on credit below the batch size
_DATA = b"D"
_BATCH = b"B"
_CTRL = b"C"
# A batch head at least this big is sent in place; a smaller one is copied. Zero-copy hands a
# Python reference to pyzmq's garbage-collector thread and takes a GIL round trip on release,
# which costs more than copying a few hundred KiB: a batch of 64 4-KiB messages (260 KiB) takes
# ~15 µs to send copied and ~22 µs in place, plus the collector's work. Array frames keep
# pyzmq's threshold (in place from 64 KiB): measured faster between two processes at 64 KiB.
ZERO_COPY_MIN = 512 << 10


def _nbytes(frame) -> int:
    return frame.nbytes if type(frame) is not bytes else len(frame)


@dataclass
class TopicStats:
    """Counters a node reports in its heartbeat, per topic and direction."""

    sent: int = 0
    received: int = 0
    gaps: int = 0
    malformed: int = 0
    redelivered: int = 0
    dropped: int = 0
    depth: int = 0  # messages waiting (publisher backlog or subscriber queue)
    wait_s: float = 0.0  # time a publisher spent blocked by backpressure

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v}


# --- reliable ----------------------------------------------------------------------------------


class _Msg:
    """One published message: its frames, and how many groups still have to acknowledge it."""

    __slots__ = ("seq", "frames", "remaining", "nbytes")

    def __init__(self, seq: int, frames: list, remaining: int):
        self.seq, self.frames, self.remaining = seq, frames, remaining
        self.nbytes = len(frames[0]) if len(frames) == 1 else sum(map(_nbytes, frames))


@dataclass
class _Member:
    routing_id: bytes
    instance: str
    credit: int  # messages it may still be sent
    credit_bytes: int  # bytes it may still be sent (a larger message goes alone: below zero)
    delivered: int = 0
    inflight: collections.deque = field(default_factory=collections.deque)
    leaving: bool = False


@dataclass
class _Group:
    name: str
    backlog: collections.deque = field(default_factory=collections.deque)
    members: dict = field(default_factory=dict)  # routing id -> _Member
    rotation: itertools.count = field(default_factory=itertools.count)

    def pending(self) -> int:
        return len(self.backlog) + sum(len(m.inflight) for m in self.members.values())


def _with_credit(group: _Group) -> list:
    return [m for m in group.members.values()
            if m.credit > 0 and m.credit_bytes > 0 and not m.leaving]


class ReliablePublisher:
    """Publishes ``topic`` to every consumer group with credit-based flow control."""

    def __init__(self, bus: Bus, topic: str, endpoint: str, hwm: int, groups: list[str]):
        self.topic, self.hwm, self.bus = topic, hwm, bus
        self.stats = TopicStats()
        self.seq = 0
        self.groups = {g: _Group(g) for g in groups}
        # (backlog, group) of every group, for the per-message loop; stats.depth is the longest.
        self._backlogs = [(g.backlog, g) for g in self.groups.values()]
        self._by_id: dict[bytes, tuple[_Group, _Member]] = {}
        self.sock = bus.sockets.make(zmq.ROUTER, hwm=0, router_mandatory=1)
        self.endpoint = bind(self.sock, endpoint)
        # Every send and receive on sock: credits are handled as the loop sees them.
        self._channel = Channel(self.sock, self._on_message)
        self._space = asyncio.Event()
        self._drained = asyncio.Event()
        # Messages not yet acknowledged by every group, in order; everything up to
        # ``completed_through`` was. Subscribers of this node wait on it (see Bus.watermark).
        self._unfinished: collections.deque = collections.deque()
        self.completed_through = 0
        self.tap = _Tap(bus, tap_endpoint(endpoint))

    async def send(self, msg) -> None:
        """Queue ``msg`` for every group; wait while any group's queue is at its bound."""
        stats = self.stats
        if stats.depth >= self.hwm:
            await self._wait_for_space()
        self.seq = seq = self.seq + 1
        frames = codec.encode(msg, self.bus.instance, seq)
        record = _Msg(seq, frames, len(self._backlogs))
        if self._backlogs:
            self._unfinished.append(record)
        else:
            self.completed_through = seq
        depth = 0
        for backlog, group in self._backlogs:
            backlog.append(record)
            # Pumps run on every change of credit or membership and stop only when the backlog
            # is empty or no member has credit: a backlog that was not empty has nobody to go to.
            if len(backlog) == 1:
                self._pump(group)
            if len(backlog) > depth:
                depth = len(backlog)
        stats.depth = depth
        stats.sent += 1
        if self.tap.subscribers:
            self.tap.mirror(self.topic, frames)

    async def _wait_for_space(self) -> None:
        started = time.perf_counter()
        while self.stats.depth >= self.hwm:
            self._space.clear()
            await self._space.wait()
        self.stats.wait_s += time.perf_counter() - started

    def _full(self) -> bool:
        return self.stats.depth >= self.hwm

    def _update_depth(self) -> None:
        self.stats.depth = max([len(backlog) for backlog, _ in self._backlogs], default=0)

    def pending(self) -> int:
        return sum(g.pending() for g in self.groups.values())

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until every group has acknowledged everything; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.pending():
            self._drained.clear()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._drained.wait(), remaining)
            except TimeoutError:
                return False
        return True

    def _pump(self, group: _Group) -> None:
        backlog = group.backlog
        if not backlog:
            return
        members = _with_credit(group)
        while backlog and members:
            member = members[next(group.rotation) % len(members)] if len(members) > 1 \
                else members[0]
            # An even share of the backlog per member with credit, so replicas still split work.
            if backlog[0].nbytes > member.credit_bytes and member.inflight:
                members.remove(member)  # its acknowledgements will make room
                continue
            take = min(member.credit, BATCH_MAX, -(-len(backlog) // len(members)))
            room = min(member.credit_bytes, BATCH_BYTES)
            record = backlog.popleft()
            records, nbytes = [record], record.nbytes
            while len(records) < take and backlog and nbytes + backlog[0].nbytes <= room:
                record = backlog.popleft()
                records.append(record)
                nbytes += record.nbytes
            try:
                self._deliver(member, records)
            except zmq.ZMQError:  # peer vanished between notify and send: treat as gone
                backlog.extendleft(reversed(records))
                self._drop_member(member.routing_id)
                members = _with_credit(group)
                continue
            member.inflight.extend(records)
            member.credit -= len(records)
            member.credit_bytes -= nbytes
            if member.credit <= 0 or member.credit_bytes <= 0:
                members.remove(member)
        self._update_depth()

    def _deliver(self, member: _Member, records: list) -> None:
        """Send ``records`` to ``member`` as one delivery (a batch when there are several)."""
        first = member.delivered + 1
        member.delivered += len(records)
        if len(records) == 1:
            frames = records[0].frames
            head = _HEAD.pack(_DATA, first) + frames[0]
            self._channel.send([member.routing_id, head, *frames[1:]] if len(frames) > 1
                               else [member.routing_id, head])
            return
        count = len(records)
        envelopes = [r.frames[0] for r in records]
        buffers = [f for r in records if len(r.frames) > 1 for f in r.frames[1:]]
        table = struct.pack(f"<{2 * count}I", *map(len, envelopes),
                            *[len(r.frames) - 1 for r in records])
        head = b"".join([_BATCH_HEAD.pack(_BATCH, first, count), table, *envelopes])
        # bytes are copied on send; a large head goes in place (it is immutable).
        self._channel.send([member.routing_id,
                            memoryview(head) if len(head) >= ZERO_COPY_MIN else head, *buffers])

    def _on_message(self, frames: list) -> None:
        try:
            msg = codec.decode(frames[1:]).message
        except codec.ProtocolError as exc:
            self.stats.malformed += 1
            log.warning("%s: malformed control message on %s: %s",
                        self.bus.instance, self.topic, exc)
            return
        self._on_control(frames[0].bytes, msg)

    def drop_instances(self, gone: set[str]) -> None:
        """The supervisor saw these instances exit: give their unacknowledged messages to
        the rest of their group (a crashed consumer never says goodbye)."""
        for routing_id, (_, member) in list(self._by_id.items()):
            if member is not None and member.instance in gone:
                self._drop_member(routing_id)

    def _send_ctrl(self, routing_id: bytes, tag: bytes, msg=None) -> None:
        frames = [routing_id, _CTRL + tag] + (codec.encode(msg) if msg else [])
        try:
            self._channel.send(frames)
        except zmq.ZMQError:
            self._drop_member(routing_id)

    def _on_control(self, routing_id: bytes, msg) -> None:
        group, member = self._by_id.get(routing_id, (None, None))
        if isinstance(msg, Join):
            if member is not None:  # a re-join on the same connection replaces the member
                self._drop_member(routing_id)
            group = self.groups.get(msg.group)
            if group is None:  # a group the graph did not declare
                group = self.groups[msg.group] = _Group(msg.group)
                self._backlogs.append((group.backlog, group))
            member = _Member(routing_id, msg.instance, msg.credit, msg.credit_bytes)
            group.members[routing_id] = member
            self._by_id[routing_id] = (group, member)
            log.info("%s: %s joined %s as group %s", self.bus.instance, msg.instance,
                     self.topic, msg.group)
            self._pump(group)
        elif member is None:
            log.warning("%s: control %s from unknown peer on %s", self.bus.instance,
                        type(msg).__name__, self.topic)
        elif isinstance(msg, Credit):
            inflight, freed = member.inflight, 0
            acked = min(msg.acked, len(inflight))  # credit + in flight stays the window
            for _ in range(acked):
                record = inflight.popleft()
                record.remaining -= 1
                freed += record.nbytes
            member.credit += acked
            member.credit_bytes += freed
            self._advance()
            self._pump(group)
            self._notify_progress()
        elif isinstance(msg, Leave):
            member.leaving = True
            self._send_ctrl(routing_id, _LEAVE_ACK, LeaveAck(self.topic))
            self._pump(group)

    def _drop_member(self, routing_id: bytes) -> None:
        group, member = self._by_id.pop(routing_id, (None, None))
        if member is None:
            return
        del group.members[routing_id]
        if member.inflight:
            # Back to the front, in order: the next member handles them before newer ones.
            self.stats.redelivered += len(member.inflight)
            group.backlog.extendleft(reversed(member.inflight))
            log.warning("%s: %s left %s with %d unacknowledged messages; redelivering",
                        self.bus.instance, member.instance, self.topic, len(member.inflight))
        self._pump(group)
        self._notify_progress()

    def _advance(self) -> None:
        unfinished = self._unfinished
        if unfinished and unfinished[0].remaining <= 0:
            while unfinished and unfinished[0].remaining <= 0:
                self.completed_through = unfinished.popleft().seq
            self.bus.on_output_acknowledged()

    def _notify_progress(self) -> None:
        if not self._full():
            self._space.set()
        if not self.pending():
            self._drained.set()

    def close(self) -> None:
        # Tell members nothing more is coming, so a draining subscriber need not wait for us.
        for routing_id in list(self._by_id):
            self._send_ctrl(routing_id, _LEAVE_ACK, LeaveAck(self.topic))
        self._channel.close()
        self.tap.close()
        self.bus.sockets.close(self.sock)


class _Connection:
    """One DEALER from a reliable subscriber to one publisher endpoint."""

    def __init__(self, sub: ReliableSubscriber, endpoint: str):
        self.sub, self.endpoint = sub, endpoint
        self.sock = sub.bus.sockets.make(zmq.DEALER, hwm=0)
        self.sock.connect(endpoint)
        self._channel = Channel(self.sock, self._on_message)  # every send and receive on sock
        self.expected = 1
        self.unacked = 0  # delivered and not yet acknowledged
        self.handled = 0  # of those, handed out by recv() and then asked past
        self.handled_bytes = 0  # their envelopes and array frames
        self.left = False
        # The DEALER queues this until the connection is up: no handshake, no sleep.
        self.send_control(Join(sub.topic, sub.group, sub.bus.instance, sub.window,
                               sub.window_bytes))
        if sub.leaving:
            self.send_control(Leave(sub.topic))

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
            if head[1:] == _LEAVE_ACK:
                self.left = True
            return
        if head[:1] == _BATCH:
            self._on_batch(head, frames)
            return
        if head[:1] != _DATA or len(head) < _HEAD.size:
            sub.stats.malformed += 1
            log.warning("%s: dropped badly framed message on %s", sub.bus.instance, sub.topic)
            self.ack(1)  # it took a credit: give it back so the publisher is not starved
            return
        delivery = _U64.unpack_from(head, 1)[0]
        if delivery != self.expected:
            sub.stats.gaps += abs(delivery - self.expected)
            log.error("%s: gap on %s from %s: expected %d, got %d", sub.bus.instance,
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
        except codec.ProtocolError as exc:
            sub.stats.malformed += 1
            log.warning("%s: dropped malformed message on %s: %s", sub.bus.instance,
                        sub.topic, exc)
            self.ack(1)
            return
        sub._queue.append((self, envelope, nbytes))

    def _on_batch(self, head: bytes, frames) -> None:
        """Unpack a batch delivery (layout at ``_BATCH_HEAD``) into the queue, in order."""
        sub = self.sub
        if len(head) < _BATCH_HEAD.size:
            sub.stats.malformed += 1
            log.warning("%s: dropped badly framed batch on %s", sub.bus.instance, sub.topic)
            self.ack(1)
            return
        _, first, count = _BATCH_HEAD.unpack_from(head)
        # More messages than the credit we ever grant is a lie: count the batch as one message.
        sane = 1 <= count <= sub.window
        messages = count if sane else 1
        if first != self.expected:
            sub.stats.gaps += abs(first - self.expected)
            log.error("%s: gap on %s from %s: expected %d, got %d", sub.bus.instance,
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
            log.warning("%s: dropped a badly framed batch of %d on %s", sub.bus.instance,
                        messages, sub.topic)
            self.ack(messages)
            return
        decode, append, alone = codec.decode, sub._queue.append, [head]
        start, frame, bad = table_end, 1, 0
        for length, buffers in zip(lengths, buffer_counts, strict=True):
            end = start + length
            try:
                if buffers:
                    arrays = frames[frame:frame + buffers]
                    frame += buffers
                    append((self, decode([head, *arrays], start, end),
                            length + sum(map(len, arrays))))
                else:
                    append((self, decode(alone, start, end), length))
            except codec.ProtocolError as exc:
                bad += 1
                log.warning("%s: dropped malformed message on %s: %s", sub.bus.instance,
                            sub.topic, exc)
            start = end
        if bad:
            sub.stats.malformed += bad
            self.ack(bad)

    def close(self) -> None:
        self._channel.close()
        self.sub.bus.sockets.close(self.sock)


class ReliableSubscriber:
    """Consumes a reliable topic from every publisher of it, as a member of ``group``.

    ``recv()`` returns the next :class:`codec.Envelope`; asking for the next message acknowledges
    the previous one, so a message counts as handled only once its consumer came back for more.
    After :meth:`leave`, ``recv()`` returns None once every publisher confirmed that nothing more
    is coming and everything already delivered was returned.
    """

    def __init__(self, bus: Bus, topic: str, window: int, window_bytes: int):
        self.bus, self.topic, self.group = bus, topic, bus.group
        self.window, self.window_bytes = window, window_bytes  # credit per publisher
        self.stats = TopicStats()
        self.connections: dict[str, _Connection] = {}
        # (connection, envelope, bytes) delivered and not yet handed out
        self._queue: collections.deque = collections.deque()
        self._event = asyncio.Event()
        self._last: _Connection | None = None  # the message handed out last, and its bytes
        self._last_bytes = 0
        self._to_ack: set[_Connection] = set()  # connections with handled messages
        # Handled messages whose outputs are not yet acknowledged downstream:
        # (connection, watermark, bytes) in order; see Bus.watermark.
        self._waiting: collections.deque = collections.deque()
        self._ack_batch = max(1, window // 4)
        self._ack_bytes = max(1, window_bytes // 4)
        self._ack_timer: asyncio.TimerHandle | None = None
        self.leaving = False

    def set_endpoints(self, endpoints: list[str]) -> None:
        for endpoint in endpoints:
            if endpoint not in self.connections:
                self.connections[endpoint] = _Connection(self, endpoint)
        for endpoint in list(self.connections):
            if endpoint not in endpoints:
                self.connections.pop(endpoint).close()
        self._wake()

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
            watermark = self.bus.watermark()
            if watermark or self._waiting:
                # End to end: what this node published while handling the message must be
                # acknowledged downstream before the message is, or a crash here would lose it.
                self._waiting.append((conn, watermark, self._last_bytes))
                conn = self._release()
            else:
                conn.handled += 1
                conn.handled_bytes += self._last_bytes
                self._to_ack.add(conn)
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
        return conn

    def on_output_acknowledged(self) -> None:
        if self._waiting and self._release() is not None:
            self._ack_previous(threshold=self._ack_batch)
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self._to_ack and self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(ACK_DELAY_S,
                                                                    self._flush_acks)

    def _flush_acks(self) -> None:
        self._ack_timer = None
        self._ack_previous(threshold=1)

    async def recv(self) -> codec.Envelope | None:
        if self._last is not None:
            self._ack_previous()
        queue = self._queue
        while not queue:
            if self.leaving:
                self._ack_previous(threshold=1)
                if all(c.left for c in self.connections.values()):
                    return None
            self._schedule_flush()
            self._event.clear()
            await self._event.wait()
        self._last, envelope, self._last_bytes = queue.popleft()
        stats = self.stats
        stats.received += 1
        stats.depth = len(queue)
        return envelope

    def __aiter__(self):
        return self

    async def __anext__(self) -> codec.Envelope:
        # recv()'s path for a message that is already here, without a second coroutine.
        if self._last is not None:
            self._ack_previous()
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
        self._ack_previous(threshold=1)
        if self._ack_timer is not None:
            self._ack_timer.cancel()
        for conn in self.connections.values():
            conn.close()
        self.connections.clear()


# --- latest / lossy ----------------------------------------------------------------------------


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


class _Tap(_XPubSide):
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


# --- request / reply ---------------------------------------------------------------------------


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

    def __init__(self, bus: Bus, service: str, endpoint: str):
        self.bus, self.service = bus, service
        self.stats = TopicStats()
        self.sock = bus.sockets.make(zmq.ROUTER, hwm=0)
        self.endpoint = bind(self.sock, endpoint)
        self._waiting: collections.deque[Request] = collections.deque()
        self._wakeup: asyncio.Future | None = None
        self._channel: Channel | None = None  # made on first use, inside the running loop

    def _ensure_channel(self) -> None:
        if self._channel is None:
            self._channel = Channel(self.sock, self._on_message)

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
        self._channel.send([request.routing_id, request.request_id,
                            *codec.encode(msg, self.bus.instance)])

    def _on_message(self, frames) -> None:
        request = self._parse(frames)
        if request is not None:
            self._waiting.append(request)
            if self._wakeup is not None and not self._wakeup.done():
                self._wakeup.set_result(None)

    def _parse(self, frames) -> Request | None:
        if len(frames) < 3:
            self.stats.malformed += 1
            return None
        try:
            envelope = codec.decode(frames[2:])
        except codec.ProtocolError as exc:
            self.stats.malformed += 1
            log.warning("%s: malformed request on %s: %s", self.bus.instance, self.service, exc)
            return None
        self.stats.received += 1
        return Request(self, frames[0].bytes, frames[1].bytes, envelope)

    def __aiter__(self):
        return self

    async def __anext__(self) -> Request:
        return await self.recv()

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self.bus.sockets.close(self.sock)


class ServerGone(TimeoutError):
    """The server a request went to exited before replying (a TimeoutError, so callers that
    retry on timeouts retry on this too, only sooner)."""


class ServiceClient:
    """Sends requests round-robin over every server of a service; replies matched by id.

    A pending request is a plain future with a timer, not a task: the env runner makes one per
    step of its environments, and tasks and ``wait_for`` cost more than the round trip."""

    def __init__(self, bus: Bus, service: str):
        self.bus, self.service = bus, service
        self.stats = TopicStats()
        self._conns: dict[str, tuple[zmq.asyncio.Socket, Channel]] = {}
        self._pending: dict[bytes, asyncio.Future] = {}
        self._sent_to: dict[bytes, str] = {}  # request id -> endpoint it went to
        self._ids = itertools.count(1)
        self._rotation = itertools.count()
        self._available = asyncio.Event()

    @property
    def connections(self) -> dict[str, zmq.asyncio.Socket]:
        return {endpoint: sock for endpoint, (sock, _) in self._conns.items()}

    def set_endpoints(self, endpoints: list[str]) -> None:
        for endpoint in endpoints:
            if endpoint not in self._conns:
                sock = self.bus.sockets.make(zmq.DEALER, hwm=0)
                sock.connect(endpoint)
                self._conns[endpoint] = (sock, Channel(sock, self._on_reply))
        for endpoint in list(self._conns):
            if endpoint not in endpoints:
                sock, channel = self._conns.pop(endpoint)
                channel.close()
                self.bus.sockets.close(sock)
                self._fail_requests_to(endpoint)
        if self._conns:
            self._available.set()
        else:
            self._available.clear()

    def _fail_requests_to(self, endpoint: str) -> None:
        """The server behind ``endpoint`` is gone: its pending requests fail now, not at their
        timeout, so callers can ask a replacement at once."""
        for request_id, sent_to in list(self._sent_to.items()):
            future = self._pending.get(request_id)
            if sent_to == endpoint and future is not None and not future.done():
                future.set_exception(ServerGone(
                    f"server of {self.service!r} at {endpoint} went away"))

    def _on_reply(self, frames) -> None:
        future = self._pending.get(frames[0].bytes)
        if future is None or future.done():
            return  # reply to a request that timed out
        try:
            future.set_result(codec.decode(frames[1:]))
        except codec.ProtocolError as exc:
            self.stats.malformed += 1
            future.set_exception(exc)

    async def request(self, msg, timeout: float = 30.0) -> codec.Envelope:
        """Send ``msg`` to one server and wait for its reply; TimeoutError after ``timeout``."""
        if not self._available.is_set():
            deadline = time.monotonic() + timeout
            await asyncio.wait_for(self._available.wait(), timeout)
            timeout = max(0.0, deadline - time.monotonic())
        return await self.submit(msg, timeout)

    def submit(self, msg, timeout: float = 30.0) -> asyncio.Future:
        """Send ``msg`` now (needs a connected server) and return a future of the reply; it
        fails with TimeoutError after ``timeout`` seconds, or ServerGone if the server exits.

        For prefetching: the request is on its way before the caller goes on to other work.
        """
        if not self._conns:
            raise TimeoutError(f"no server for service {self.service!r}")
        endpoints = list(self._conns)
        endpoint = endpoints[next(self._rotation) % len(endpoints)]
        request_id = _U64.pack(next(self._ids))
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending[request_id] = future
        self._sent_to[request_id] = endpoint
        timer = loop.call_later(timeout, self._time_out, future, timeout)
        future.add_done_callback(lambda _: self._forget(request_id, timer))
        self.stats.sent += 1
        self._conns[endpoint][1].send([request_id, *codec.encode(msg, self.bus.instance)])
        return future

    def _time_out(self, future: asyncio.Future, timeout: float) -> None:
        if not future.done():
            future.set_exception(TimeoutError(
                f"no reply from service {self.service!r} within {timeout:.0f}s"))

    def _forget(self, request_id: bytes, timer: asyncio.TimerHandle) -> None:
        timer.cancel()
        self._pending.pop(request_id, None)
        self._sent_to.pop(request_id, None)

    def close(self) -> None:
        for sock, channel in self._conns.values():
            channel.close()
            self.bus.sockets.close(sock)
        self._conns.clear()


# --- the bus -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopicSpec:
    delivery: str
    hwm: int = 1000


class Bus:
    """One node instance's view of the graph's topics and services.

    The runtime creates it with the endpoints this instance binds; :meth:`set_peers` (called at
    start and whenever the supervisor reports a change) connects subscriptions and clients to
    every live publisher and server.
    """

    def __init__(self, instance: str, group: str, topics: dict[str, TopicSpec],
                 bind_endpoints: dict[str, str], consumer_groups: dict[str, list[str]],
                 sockets: SocketFactory | None = None, subscriptions: tuple = ()):
        self.instance, self.group = instance, group
        self.topics = topics
        self.bind_endpoints = bind_endpoints
        self.consumer_groups = consumer_groups
        self.subscriptions = tuple(subscriptions)
        self.sockets = sockets or SocketFactory()
        self.publishers: dict[str, ReliablePublisher | BroadcastPublisher] = {}
        self._reliable: list[ReliablePublisher] = []  # the reliable ones, for watermark()
        self.subscribers: dict[str, ReliableSubscriber | BroadcastSubscriber] = {}
        self.servers: dict[str, ServiceServer] = {}
        self.clients: dict[str, ServiceClient] = {}
        self._peers: dict = {"topics": {}, "services": {}}
        # Set by the node runtime: where the node runs, when it should stop, what it reports.
        self.context = None
        self.stopping = asyncio.Event()
        self.status: dict = {}

    # factories used by node code ---------------------------------------------------------------

    def publisher(self, topic: str):
        if topic not in self.publishers:
            spec = self._spec(topic)
            endpoint = self._bind_endpoint(topic)
            if spec.delivery == RELIABLE:
                pub = ReliablePublisher(self, topic, endpoint, spec.hwm,
                                        self.consumer_groups.get(topic, []))
                self._reliable.append(pub)
            else:
                pub = BroadcastPublisher(self, topic, endpoint, spec.hwm, spec.delivery)
            self.publishers[topic] = pub
        return self.publishers[topic]

    def subscriber(self, topic: str, window: int | None = None,
                   window_bytes: int = WINDOW_BYTES):
        """The subscription to ``topic``; on a reliable topic each publisher may have
        ``window`` messages (default: the topic's hwm, at most 256) and ``window_bytes``
        bytes delivered and not yet acknowledged."""
        if topic not in self.subscribers:
            spec = self._spec(topic)
            if spec.delivery == RELIABLE:
                sub = ReliableSubscriber(self, topic, window or max(1, min(spec.hwm, 256)),
                                         window_bytes)
            else:
                sub = BroadcastSubscriber(self, topic, spec.delivery,
                                          hwm=2 if spec.delivery == LATEST else spec.hwm)
            sub.set_endpoints(self._peers["topics"].get(topic, []))
            self.subscribers[topic] = sub
        return self.subscribers[topic]

    def server(self, service: str) -> ServiceServer:
        if service not in self.servers:
            self.servers[service] = ServiceServer(self, service, self._bind_endpoint(service))
        return self.servers[service]

    def client(self, service: str) -> ServiceClient:
        if service not in self.clients:
            client = ServiceClient(self, service)
            client.set_endpoints(self._peers["services"].get(service, []))
            self.clients[service] = client
        return self.clients[service]

    def watermark(self) -> tuple:
        """``(publisher, seq)`` for every reliable publisher of this node with messages not
        yet acknowledged by all its consumers: an input handled now may be acknowledged only
        once each of those publishers completed through ``seq``."""
        if not self._reliable:
            return ()
        return tuple((pub, pub.seq) for pub in self._reliable if pub.completed_through < pub.seq)

    def on_output_acknowledged(self) -> None:
        for sub in self.subscribers.values():
            if isinstance(sub, ReliableSubscriber):
                sub.on_output_acknowledged()

    def publishes(self, name: str) -> bool:
        """Whether the graph has this node publish the topic (or serve the service) ``name``."""
        return name in self.bind_endpoints

    def subscribes(self, topic: str) -> bool:
        """Whether the graph has this node subscribe to ``topic``."""
        return topic in self.subscriptions

    def _spec(self, topic: str) -> TopicSpec:
        if topic not in self.topics:
            raise KeyError(f"{self.instance}: topic {topic!r} is not declared in the graph")
        return self.topics[topic]

    def _bind_endpoint(self, name: str) -> str:
        if name not in self.bind_endpoints:
            raise KeyError(f"{self.instance}: node does not publish or serve {name!r} "
                           f"in the graph (it declares {sorted(self.bind_endpoints)})")
        return self.bind_endpoints[name]

    # wiring ------------------------------------------------------------------------------------

    def bind_all(self) -> None:
        """Create every publisher and server this instance declares."""
        for name in self.bind_endpoints:
            if name in self.topics:
                self.publisher(name)
            else:
                self.server(name)

    def bound_endpoints(self) -> dict[str, str]:
        """Actual endpoints (tcp ports resolved), including reliable topics' monitor taps."""
        out = {name: part.endpoint for name, part in {**self.publishers, **self.servers}.items()}
        for name, pub in self.publishers.items():
            if isinstance(pub, ReliablePublisher):
                out[f"{name}.tap"] = pub.tap.endpoint
        return out

    def set_peers(self, topics: dict, services: dict, gone: list | tuple = ()) -> None:
        self._peers = {"topics": topics, "services": services}
        if gone:
            for pub in self.publishers.values():
                if isinstance(pub, ReliablePublisher):
                    pub.drop_instances(set(gone))
        for topic, sub in self.subscribers.items():
            sub.set_endpoints(topics.get(topic, []))
        for service, client in self.clients.items():
            client.set_endpoints(services.get(service, []))

    # lifecycle ---------------------------------------------------------------------------------

    def leave_all(self) -> None:
        for sub in self.subscribers.values():
            if isinstance(sub, ReliableSubscriber):
                sub.leave()

    async def flush(self, timeout: float) -> bool:
        """Wait until every reliable message this instance published was acknowledged."""
        deadline = time.monotonic() + timeout
        ok = True
        for pub in self.publishers.values():
            ok &= await pub.flush(max(0.0, deadline - time.monotonic()))
        return ok

    def stats(self) -> dict:
        out = {}
        for name, part in [*self.publishers.items(), *self.subscribers.items(),
                           *self.servers.items(), *self.clients.items()]:
            role = ("pub" if part in self.publishers.values() else
                    "sub" if part in self.subscribers.values() else
                    "srv" if part in self.servers.values() else "cli")
            out[f"{role}:{name}"] = part.stats.as_dict()
        return out

    def close(self) -> None:
        """Close in LIFO order: clients, servers, subscribers, publishers, then any leftover."""
        for group in (self.clients, self.servers, self.subscribers, self.publishers):
            for part in reversed(list(group.values())):
                part.close()
            group.clear()
        self._reliable.clear()
        self.sockets.close_all()
