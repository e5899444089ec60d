"""Reliable topics: consumer groups, credit-based flow control, acknowledgement and redelivery.

The publisher binds a ROUTER; each subscriber connects a DEALER per publisher and joins a
*consumer group* (its node name). Every group gets every message; inside a group each message
goes to one member that has credit (replicas share the work). Subscribers grant credit and
acknowledge a message when they ask for the next one, so the publisher holds every message
until it was handled: when a member disconnects its unacknowledged messages go back to the front
of the group's queue. A group's queue is bounded by the topic's ``hwm`` (messages) and the
publisher's unacknowledged bytes by ``hwm_bytes``; when either is full ``send`` waits: a slow
consumer slows the producer, nothing is dropped. The publisher buffers for groups the graph says
will subscribe even before they connect, so there is no slow-joiner loss and no sleep. Each
delivery carries a per-connection counter that the subscriber checks: ``gaps`` must stay zero.
Messages queued for a member with credit go as one batch delivery (counted, credited and
acknowledged per message). Every reliable publisher also binds a lossy *tap*
(:class:`pipeline.broadcast.Tap`) that mirrors its messages while a monitor watches.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import itertools
import logging
import os
import struct
import time
from dataclasses import dataclass, field

import zmq

from pipeline import batch_codec, codec
from pipeline.broadcast import Tap
from pipeline.channel import Channel
from pipeline.endpoint_context import EndpointContext
from pipeline.membership import Evictions, member_timeout
from pipeline.messages import Batch, Credit, Join, Leave, LeaveAck
from pipeline.sockets import ZERO_COPY_MIN, bind, tap_endpoint
from pipeline.topics import HWM_BYTES, TopicStats, partition_of

log = logging.getLogger(__name__)

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
COALESCE_MAX = 64  # messages a coalescing publisher holds at most before it batches them
BATCH_BYTES = 4 << 20  # a batch stops growing once its messages reach this many bytes
# Bytes in flight per subscriber connection (besides the message window): bounds the memory a
# slow consumer of large messages pins on both sides, and keeps it small enough to stay cached.
WINDOW_BYTES = 32 << 20
_LEAVE_ACK = b"A"
# Publisher -> a peer it does not know (an evicted member): join again. The peer answers with a
# Join carrying how many messages it still holds; the publisher answers that Join with _WELCOME.
_REJOIN = b"R"
_WELCOME = b"W"
# A member (or an undeclared group without members) silent this long is dropped: its credit and
# unacknowledged messages go back to its group, so a peer that joins and goes away cannot stall a
# topic. Above the supervisor's default heartbeat timeout (30 s), so a live but blocked node is
# killed and restarted before its messages are taken from it. Subscribers send a keepalive
# (``Credit(acked=0)``) every KEEPALIVE_S.
MEMBER_TIMEOUT_S = 60.0
KEEPALIVE_S = 10.0
# An evicted member that was alive rejoins: pipeline.membership.
SECRET_ENV = "CONDUIT_RUN_SECRET"  # set by the supervisor for every node: Join must carry it
ACK_DELAY_S = 0.002  # how long an idle subscriber may sit on credit below the batch size
# How long a busy subscriber may sit on a connection's acknowledgements below the batch size: a
# publisher that stopped sending (a swapped or stopping node flushing its last messages) is
# acknowledged although the subscriber never goes idle while other publishers keep it busy.
ACK_SWEEP_S = 0.05
_DATA = b"D"
_BATCH = b"B"
_CTRL = b"C"
# A batch head at least ZERO_COPY_MIN (sockets.py) is sent in place; a smaller one is copied.
# Array frames keep pyzmq's threshold (in place from 64 KiB): measured faster between two
# processes at 64 KiB.


def set_member_timeout(seconds: float) -> None:
    """This process's membership timeout (``run.membership_timeout_s``, or the test override
    in MEMBER_TIMEOUT_ENV), and a keepalive period well inside it."""
    global MEMBER_TIMEOUT_S, KEEPALIVE_S
    MEMBER_TIMEOUT_S = member_timeout(seconds)
    KEEPALIVE_S = min(10.0, MEMBER_TIMEOUT_S / 6)


def _nbytes(frame) -> int:
    return frame.nbytes if type(frame) is not bytes else len(frame)


class _Msg:
    """One published message: its frames, and how many groups still have to acknowledge it."""

    __slots__ = ("seq", "frames", "remaining", "nbytes")

    def __init__(self, seq: int, frames: list, remaining: int):
        self.seq, self.frames, self.remaining = seq, frames, remaining
        self.nbytes = sum(map(_nbytes, frames)) if len(frames) > 1 else len(frames[0])


# What a rejoining member holds of a message another member took (pipeline.membership).
_PLACEHOLDER = _Msg(0, [b""], 0)


@dataclass
class _Member:
    routing_id: bytes
    instance: str
    credit: int  # messages it may still be sent
    credit_bytes: int  # bytes it may still be sent (a larger message goes alone: below zero)
    delivered: int = 0
    inflight: collections.deque = field(default_factory=collections.deque)
    leaving: bool = False
    last_seen: float = 0.0  # time.monotonic() of its last control message


@dataclass
class _Group:
    name: str
    backlog: collections.deque = field(default_factory=collections.deque)
    members: dict = field(default_factory=dict)  # routing id -> _Member
    rotation: itertools.count = field(default_factory=itertools.count)
    declared: bool = True  # the graph says this group consumes the topic
    empty_since: float | None = None  # an undeclared group without members, since when
    # A member has joined once: a group without members now has left (a learner at its
    # budget), not yet come (a consumer still starting, which must get what was held for it).
    joined: bool = False
    # Its last member said Leave before it went (a consumer done for good). One that went
    # without a word crashed or was evicted: its replacement is coming for what it held.
    left: bool = False

    def awaited(self, present_only: bool) -> bool:
        """Whether a final flush waits for this group (see ``ReliablePublisher.flush``)."""
        return (not present_only or bool(self.members)
                or (self.declared and not (self.joined and self.left)))

    def pending(self) -> int:
        return len(self.backlog) + sum(len(m.inflight) for m in self.members.values())


def _with_credit(group: _Group) -> list:
    return [m for m in group.members.values()
            if m.credit > 0 and m.credit_bytes > 0 and not m.leaving]


class ReliablePublisher:
    """Publishes ``topic`` to every consumer group with credit-based flow control."""

    def __init__(self, context: EndpointContext, topic: str, endpoint: str, hwm: int,
                 groups: list[str], hwm_bytes: int = HWM_BYTES, coalesce: bool = False):
        self.topic, self.hwm, self.hwm_bytes, self.context = topic, hwm, hwm_bytes, context
        self._sender = context.instance
        self._on_output_acknowledged = context.on_output_acknowledged  # bound once
        # coalesce: small unkeyed messages sent in one turn of the loop go as one batch (see
        # send); _held are those not yet released to the groups.
        self.coalesce = coalesce
        self._held: list = []  # batch items (batch_codec.small_item)
        self._held_first = None  # the first of them, as the message
        self._release_due = False
        self.stats = TopicStats()
        self.seq = 0
        self.groups = {g: _Group(g) for g in groups}
        # (backlog, group) of every group; stats.depth is the longest.
        self._backlogs = [(g.backlog, g) for g in self.groups.values()]
        # Groups that get every message, for the per-message loop, and the partitioned
        # topic's families (one per consuming node, its replicas' groups in replica order),
        # of which a message goes to one group each (see send).
        families: dict[str, list] = {}
        for g in self.groups.values():
            part = partition_of(g.name)
            if part is not None:
                families.setdefault(part[0], []).append((part[1], (g.backlog, g)))
        self._families = [[pair for _, pair in sorted(f)] for f in families.values()]
        self._plain = [(b, g) for b, g in self._backlogs if partition_of(g.name) is None]
        self._by_id: dict[bytes, tuple[_Group, _Member]] = {}
        # handover: a member's tcp connection that came back takes its routing id over.
        self.sock = context.sockets.make(zmq.ROUTER, hwm=0, router_mandatory=1,
                                         router_handover=1)
        self.endpoint = bind(self.sock, endpoint)
        # Every send and receive on sock: credits are handled as the loop sees them.
        self._channel = Channel(self.sock, self._on_message)
        self._space = asyncio.Event()
        self._progress = asyncio.Event()  # set at every acknowledgement or member change
        # Messages not yet acknowledged by every group, in order; everything up to
        # ``completed_through`` was. Subscribers of this node wait on it (see Bus.watermark).
        self._unfinished: collections.deque = collections.deque()
        self.queued_bytes = 0  # of the messages in _unfinished: bounded by hwm_bytes
        self.completed_through = 0
        self.tap = Tap(context, tap_endpoint(endpoint))
        self._secret = os.environ.get(SECRET_ENV) or None
        self._reaper: asyncio.TimerHandle | None = None
        self._reap_due = 0.0  # loop time the reaper should run at (see _reap)
        self._evicted = Evictions(_PLACEHOLDER)  # members that may come back
        # Unknown peers told to rejoin (logged once each; their Join is welcomed), oldest first.
        self._told: dict[bytes, None] = {}

    async def send(self, msg, key: int | None = None) -> None:
        """Queue ``msg`` for every group; wait while any group's queue is at its bound.

        On a partitioned topic each consuming node's replicas split the messages: replica
        ``key % replicas`` gets this one (unkeyed messages are dealt round-robin).

        On a coalescing topic a small unkeyed message is held until the loop's turn ends (or
        :data:`COALESCE_MAX` are held), then the held ones go as one batch, as ``send_many``
        sends them: one encode, counter, credit and acknowledgement for all. Anything that
        reads how far this publisher got (the watermark, ``flush``, ``pending``, a keyed or
        large message after them) releases them first, so order and the end-to-end
        acknowledgement are as without coalescing."""
        if self.coalesce:
            item = None if key is not None or type(msg) is Batch else batch_codec.small_item(msg)
            if item is not None:
                held = self._held
                if not held:
                    self._held_first = msg  # a run of one goes as the message itself
                held.append(item)
                if len(held) >= COALESCE_MAX:
                    await self._wait_while_full()
                    self.release_held()
                elif not self._release_due:
                    self._release_due = True
                    asyncio.get_running_loop().call_soon(self.release_held)
                return
            self.release_held()
        await self._wait_while_full()
        self._enqueue(msg, key)

    def release_held(self) -> None:
        """Queue the messages a coalescing publisher holds, as one batch."""
        self._release_due = False
        if self._held:
            held, self._held = self._held, []
            first, self._held_first = self._held_first, None
            self._enqueue(Batch(held) if len(held) > 1 else first, None)

    async def _wait_while_full(self) -> None:
        if self.stats.depth >= self.hwm or self.queued_bytes >= self.hwm_bytes:
            await self._wait_for_space()

    def _enqueue(self, msg, key: int | None) -> None:
        stats = self.stats
        self.seq = seq = self.seq + 1
        frames = codec.encode(msg, self._sender, seq)
        targets = self._plain
        if self._families:
            pick = seq if key is None else key
            targets = targets + [family[pick % len(family)] for family in self._families]
        record = _Msg(seq, frames, len(targets))
        if targets:
            self._unfinished.append(record)
            self.queued_bytes += record.nbytes
        else:
            self.completed_through = seq
        depth = 0
        for backlog, group in targets:
            backlog.append(record)
            # Pumps run on every change of credit or membership and stop only when the backlog
            # is empty or no member has credit: a backlog that was not empty has nobody to go to.
            length = len(backlog)
            if length == 1:
                self._pump(group)
                length = len(backlog)
            if length > depth:
                depth = length
        if self._families:
            self._update_depth()  # groups that did not get this message count too
        else:
            stats.depth = depth
        stats.sent += 1
        if self.tap.subscribers:
            self.tap.mirror(self.topic, frames)

    async def send_many(self, msgs, key: int | None = None) -> None:
        """Queue ``msgs`` in order, each run of small ones as one
        :class:`~pipeline.messages.Batch`: delivered, acknowledged and redelivered whole,
        handed out one by one by a :class:`ReliableSubscriber`. A message with a large array
        goes on its own (:func:`~pipeline.batch_codec.wire_messages`). Nothing is sent for an
        empty list."""
        self.release_held()
        for msg in batch_codec.wire_messages(msgs):
            await self._wait_while_full()
            self._enqueue(msg, key)

    async def _wait_for_space(self) -> None:
        started = time.perf_counter()
        while self._full():
            self._space.clear()
            await self._space.wait()
        self.stats.wait_s += time.perf_counter() - started

    async def wait_for_backlog(self, most: int = 0) -> None:
        """Wait until no group has more than ``most`` messages queued that no member has
        taken yet. Why: a producer whose messages age while they wait (an unroll collected by
        parameters the consumer has since replaced) starts the next one only when the last
        was taken, so it is made as late, and as fresh, as the consumer can use it."""
        self.release_held()
        started = time.perf_counter()
        while self.stats.depth > most:
            self._progress.clear()
            await self._progress.wait()
        self.stats.wait_s += time.perf_counter() - started

    def _full(self) -> bool:
        """A group's queue is at ``hwm`` messages, or the messages not yet acknowledged by
        every group reach ``hwm_bytes`` (one message may go past it, so any size can go)."""
        return self.stats.depth >= self.hwm or self.queued_bytes >= self.hwm_bytes

    def _update_depth(self) -> None:
        self.stats.depth = max([len(backlog) for backlog, _ in self._backlogs], default=0)

    def pending(self, present_only: bool = False) -> int:
        """Messages some group has not acknowledged; ``present_only``: not those of groups
        whose consumers all left for good (a declared group that has not joined yet, or
        whose last consumer crashed and is being replaced, still counts)."""
        self.release_held()
        return sum(g.pending() for g in self.groups.values() if g.awaited(present_only))

    async def flush(self, timeout: float | None = None, present_only: bool = False) -> bool:
        """Wait until every group has acknowledged everything; False on timeout.

        ``present_only``: wait only for the groups that have a consumer connected, are
        declared and still to join, or lost their last consumer without a Leave (killed:
        its replacement takes what it held), also as consumers leave. The unroller's final
        flush: a learner that finished its budget has left for good, and what it did not take
        would otherwise hold the final checkpoint until the supervisor kills the
        checkpointer; a producer that sent everything before its consumer was killed must
        wait for the replacement, or what the dead one held is lost."""
        self.release_held()
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.pending(present_only):
            self._progress.clear()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._progress.wait(), remaining)
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
        if all(len(r.frames) == 1 for r in records):  # small messages: no array frames
            buffers = []
            table = struct.pack(f"<{count}I{count}x{3 * count}x", *map(len, envelopes))
        else:
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
                        self.context.instance, self.topic, exc)
            return
        self._on_control(frames[0].bytes, msg)

    def drop_instances(self, gone: set[str]) -> None:
        """The supervisor saw these instances exit: give their unacknowledged messages to
        the rest of their group (a crashed consumer never says goodbye)."""
        for routing_id, (_, member) in list(self._by_id.items()):
            if member is not None and member.instance in gone:
                self._drop_member(routing_id)
        self._evicted.forget_instances(gone)

    def _send_ctrl(self, routing_id: bytes, tag: bytes, msg=None) -> None:
        frames = [routing_id, _CTRL + tag] + (codec.encode(msg) if msg else [])
        try:
            self._channel.send(frames)
        except zmq.ZMQError:
            self._drop_member(routing_id)

    def _on_control(self, routing_id: bytes, msg) -> None:
        group, member = self._by_id.get(routing_id, (None, None))
        if member is not None:
            member.last_seen = time.monotonic()
        if isinstance(msg, Join):
            if self._secret is not None and not hmac.compare_digest(
                    msg.token.encode(), self._secret.encode()):
                self.stats.refused += 1
                log.warning("%s: refused a join of %s to %s as group %s: wrong run secret",
                            self.context.instance, msg.instance, self.topic, msg.group)
                return
            if member is not None:  # a re-join on the same connection replaces the member
                self._drop_member(routing_id)
            rejoin = routing_id in self._told
            self._told.pop(routing_id, None)
            group = self.groups.get(msg.group)
            if group is None:  # a group the graph did not declare
                group = self.groups[msg.group] = _Group(msg.group, declared=False)
                self._backlogs.append((group.backlog, group))
                self._plain.append((group.backlog, group))
            member = _Member(routing_id, msg.instance, msg.credit, msg.credit_bytes,
                             last_seen=time.monotonic())
            group.members[routing_id] = member
            group.joined = True
            group.empty_since = None
            self._by_id[routing_id] = (group, member)
            if msg.holding:
                self._evicted.reattach(group, member, msg.holding)
                self.stats.rejoined += 1
                self._update_depth()
            log.info("%s: %s joined %s as group %s%s", self.context.instance, msg.instance,
                     self.topic, msg.group, f" holding {msg.holding}" if msg.holding else "")
            if rejoin:
                self._send_ctrl(routing_id, _WELCOME)
            self._start_reaper()
            self._pump(group)
            self._notify_progress()  # the backlog it took may wake a waiting sender
        elif member is None:
            # An evicted member that was not gone (stopped, or cut off, past the timeout): what
            # it acknowledges since counts, and it is asked to join again with what it holds.
            if isinstance(msg, Credit) and msg.acked and \
                    self._evicted.late_acks(routing_id, msg.acked):
                self._advance()
                self._update_depth()
                self._notify_progress()
            if routing_id not in self._told:
                if len(self._told) >= 4096:  # strangers that never join: the oldest forgotten
                    del self._told[next(iter(self._told))]
                self._told[routing_id] = None
                log.warning("%s: control %s from a peer that is not a member of %s; asking it "
                            "to rejoin", self.context.instance, type(msg).__name__, self.topic)
            self._send_ctrl(routing_id, _REJOIN)
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

    def _start_reaper(self) -> None:
        if self._reaper is None:
            loop = asyncio.get_running_loop()
            self._reap_due = loop.time() + MEMBER_TIMEOUT_S / 4
            self._reaper = loop.call_at(self._reap_due, self._reap)

    def _reap(self) -> None:
        """Drop members silent for MEMBER_TIMEOUT_S, and undeclared groups left empty as long
        (nobody would ever acknowledge what they hold).

        Silence counts only while this process could listen: a reaper that runs late (the
        process was stopped, a container paused, the loop blocked) gives every member the
        time it was late, and what is queued is read first. Else a publisher woken after a
        long stop would drop healthy members whose keepalives wait unread in its socket."""
        self._reaper = None
        late = asyncio.get_running_loop().time() - self._reap_due
        if late > 0:
            for _, member in self._by_id.values():
                member.last_seen += late
        self._channel.drain()
        now = time.monotonic()
        for routing_id, (_, member) in list(self._by_id.items()):
            if now - member.last_seen > MEMBER_TIMEOUT_S:
                self.stats.evicted += 1
                log.warning("%s: %s silent on %s for %.0fs; dropping it", self.context.instance,
                            member.instance, self.topic, now - member.last_seen)
                self._drop_member(routing_id, remember=True)
        for group in list(self.groups.values()):
            if not group.declared and not group.members and group.empty_since is not None \
                    and now - group.empty_since > MEMBER_TIMEOUT_S:
                self._forget_group(group)
        if self._by_id or any(not g.declared for g in self.groups.values()):
            self._start_reaper()

    def _forget_group(self, group: _Group) -> None:
        log.warning("%s: group %s left %s for good; releasing its %d messages",
                    self.context.instance, group.name, self.topic, len(group.backlog))
        del self.groups[group.name]
        self._backlogs = [(b, g) for b, g in self._backlogs if g is not group]
        self._plain = [(b, g) for b, g in self._plain if g is not group]
        for record in group.backlog:
            record.remaining -= 1
        group.backlog.clear()
        self._advance()
        self._update_depth()
        self._notify_progress()

    def _drop_member(self, routing_id: bytes, remember: bool = False) -> None:
        """``remember``: the member may come back (evicted for silence), see _reattach."""
        group, member = self._by_id.pop(routing_id, (None, None))
        if member is None:
            return
        del group.members[routing_id]
        if not group.members:
            group.left = member.leaving
        if remember:
            self._evicted.remember(routing_id, group, member)
        if not group.members and not group.declared:
            group.empty_since = time.monotonic()
        if member.inflight:
            # Back to the front, in order: the next member handles them before newer ones
            # (not placeholders: another member has those).
            back = [r for r in member.inflight if r is not _PLACEHOLDER]
            self.stats.redelivered += len(back)
            group.backlog.extendleft(reversed(back))
            log.warning("%s: %s left %s with %d unacknowledged messages; redelivering",
                        self.context.instance, member.instance, self.topic, len(member.inflight))
        self._pump(group)
        self._notify_progress()

    def _advance(self) -> None:
        unfinished = self._unfinished
        if unfinished and unfinished[0].remaining <= 0:
            while unfinished and unfinished[0].remaining <= 0:
                record = unfinished.popleft()
                self.completed_through = record.seq
                self.queued_bytes -= record.nbytes
            self._on_output_acknowledged()

    def _notify_progress(self) -> None:
        if not self._full():
            self._space.set()
        self._progress.set()

    def close(self) -> None:
        self.release_held()
        if self._reaper is not None:
            self._reaper.cancel()
        # Tell members nothing more is coming, so a draining subscriber need not wait for us.
        for routing_id in list(self._by_id):
            self._send_ctrl(routing_id, _LEAVE_ACK, LeaveAck(self.topic))
        self._channel.close()
        self.tap.close()
        self.context.sockets.close(self.sock)
