"""Batch deliveries on a reliable topic: the wire layout, order and counters, redelivery of a
dropped member's batch, and badly formed batches on a live subscription.

A batch is ``[routing id, b"B" + u64 first delivery counter + u32 count + count u32 envelope
lengths + count u32 array-frame counts + the envelopes, *array frames]`` (see pipeline.bus)."""

from __future__ import annotations

import asyncio
import contextlib
import struct

import numpy as np
import pytest
import zmq
import zmq.asyncio

from pipeline import batch_codec, codec, reliable
from pipeline.bus import Bus, TopicSpec
from pipeline.messages import Batch, Credit, Join, Leave, Record
from pipeline.sockets import SocketFactory

TOPICS = {"numbers": TopicSpec("reliable", 100)}
BATCH_HEAD = struct.Struct("<cQI")


def _batch(routing_id: bytes, first: int, messages: list, *, count: int | None = None,
           lengths: list | None = None, buffer_counts: list | None = None) -> list:
    """A batch delivery of already encoded ``messages``; the keywords forge its header."""
    envelopes = [bytes(frames[0]) for frames in messages]
    lengths = [len(e) for e in envelopes] if lengths is None else lengths
    buffer_counts = [len(m) - 1 for m in messages] if buffer_counts is None else buffer_counts
    head = (BATCH_HEAD.pack(b"B", first, len(messages) if count is None else count)
            + struct.pack(f"<{len(lengths) + len(buffer_counts)}I", *lengths, *buffer_counts)
            + b"".join(envelopes))
    return [routing_id, head, *[f for frames in messages for f in frames[1:]]]


def _parse_batch(head: bytes) -> tuple[int, int, list, list]:
    _, first, count = BATCH_HEAD.unpack_from(head)
    table = struct.unpack_from(f"<{2 * count}I", head, BATCH_HEAD.size)
    return first, count, list(table[:count]), list(table[count:])


def _record(origin: int, data=None) -> list:
    return codec.encode(Record(origin, data), "source.0~0", origin)


@contextlib.asynccontextmanager
async def _publisher_and_member(tmp_path, topics=TOPICS):
    """A real reliable publisher of ``numbers`` for group ``sink`` and a raw DEALER socket that
    plays a member of that group; yields ``(context, publisher, raw)`` and closes all of it."""
    ctx = zmq.asyncio.Context()
    pub_bus = Bus("source.0~0", "source", topics, {"numbers": f"ipc://{tmp_path}/numbers"},
                  {"numbers": ["sink"]}, sockets=SocketFactory(ctx))
    raw = ctx.socket(zmq.DEALER)
    raw.linger = 0
    try:
        yield ctx, pub_bus.publisher("numbers"), raw
    finally:
        pub_bus.close()
        raw.close(linger=0)
        ctx.term()


async def _bad_batches(tmp_path) -> None:
    ctx = zmq.asyncio.Context()
    raw = ctx.socket(zmq.ROUTER)  # plays the publisher
    raw.linger = 0
    endpoint = f"ipc://{tmp_path}/numbers"
    raw.bind(endpoint)
    bus = Bus("sink.0~0", "sink", TOPICS, {}, {}, sockets=SocketFactory(ctx))
    try:
        bus.set_peers({"numbers": [endpoint]}, {})
        sub = bus.subscriber("numbers")  # window 100
        routing_id, *join = await raw.recv_multipart()
        assert isinstance(codec.decode(join).message, Join)

        big = np.arange(codec.INLINE_MAX)  # travels in an array frame of its own
        await raw.send_multipart([routing_id, b"B\x01\x02"])  # header cut short: 1 message
        await raw.send_multipart(_batch(routing_id, 1, [], count=0))  # empty: 1 message
        await raw.send_multipart(_batch(routing_id, 2, [_record(0)], count=1000))  # > window: 1
        await raw.send_multipart(  # envelope lengths do not add up: both messages
            _batch(routing_id, 3, [_record(0), _record(0)], lengths=[3, 4]))
        await raw.send_multipart(  # claims an array frame that is not there: both messages
            _batch(routing_id, 5, [_record(0), _record(0)], buffer_counts=[0, 1]))
        # One bad envelope among good ones: only it is dropped, the others arrive.
        await raw.send_multipart(_batch(routing_id, 7, [_record(1), [b"\xc1 junk"], _record(2)]))
        await raw.send_multipart(_batch(routing_id, 10, [
            _record(3), _record(4, big), _record(5), _record(6, np.ones(3)), _record(7, big)]))

        first = await asyncio.wait_for(sub.recv(), 5)
        assert first.message.origin == 1
        malformed = 1 + 1 + 1 + 2 + 2 + 1
        assert sub.stats.malformed == malformed and sub.stats.gaps == 0

        # Every message of a bad batch took a credit, and each one comes back.
        acked = 0
        while acked < malformed:
            _, *frames = await raw.recv_multipart()
            credit = codec.decode(frames).message
            assert isinstance(credit, Credit)
            acked += credit.acked
        assert acked == malformed

        origins = [first.message.origin]
        for _ in range(6):
            envelope = await asyncio.wait_for(sub.recv(), 5)
            origins.append(envelope.message.origin)
            if envelope.message.origin in (4, 7):
                np.testing.assert_array_equal(envelope.message.data, big)
        assert origins == [1, 2, 3, 4, 5, 6, 7]
        assert sub.stats.malformed == malformed and sub.stats.gaps == 0
        assert sub.stats.received == 7

        # ... and a single delivery after the batches still fits the counters.
        await raw.send_multipart([routing_id, b"D" + struct.pack("<Q", 15) + _record(8)[0]])
        assert (await asyncio.wait_for(sub.recv(), 5)).message.origin == 8
        assert sub.stats.gaps == 0
    finally:
        bus.close()
        raw.close(linger=0)
        ctx.term()  # hangs (and times out) if any socket was left open


@pytest.mark.timeout(60)
def test_badly_formed_batches_are_counted_and_the_subscriber_keeps_working(tmp_path):
    asyncio.run(asyncio.wait_for(_bad_batches(tmp_path), 30))


async def _batch_in_order(tmp_path) -> None:
    topics = {"numbers": TopicSpec("reliable", 1000)}
    async with _publisher_and_member(tmp_path, topics) as (ctx, pub, raw):
        sub_bus = Bus("sink.1~0", "sink", topics, {}, {}, sockets=SocketFactory(ctx))
        try:
            big = np.arange(codec.INLINE_MAX)
            count = 300  # more than one batch, queued before anyone joins
            for i in range(1, count + 1):
                await pub.send(Record(i, big if i % 7 == 0 else np.full(3, i)))

            raw.connect(pub.endpoint)
            await raw.send_multipart(codec.encode(Join("numbers", "sink", "sink.0~0", 40, 1 << 30)))
            routing_frames = await asyncio.wait_for(raw.recv_multipart(copy=False), 5)
            head, arrays = routing_frames[0].bytes, routing_frames[1:]
            assert head[:1] == b"B"  # 40 credits, 300 waiting: one delivery of 40 messages
            first, n, lengths, buffer_counts = _parse_batch(head)
            assert (first, n) == (1, 40) and len(arrays) == sum(buffer_counts) == 40 // 7
            assert sum(lengths) == len(head) - BATCH_HEAD.size - 8 * n

            # The member vanishes with the batch unacknowledged: every message goes back, in order.
            pub.drop_instances({"sink.0~0"})
            assert pub.stats.redelivered == 40

            sub_bus.set_peers({"numbers": [pub.endpoint]}, {})
            sub = sub_bus.subscriber("numbers")
            for i in range(1, count + 1):
                envelope = await asyncio.wait_for(sub.recv(), 5)
                assert envelope.message.origin == i
                expected = big if i % 7 == 0 else np.full(3, i)
                np.testing.assert_array_equal(envelope.message.data, expected)
            assert sub.stats.gaps == 0 and sub.stats.malformed == 0

            # An idle topic: a single message goes out at once, as a plain delivery.
            leftover = sub.connections[pub.endpoint]
            await pub.send(Record(count + 1, None))
            envelope = await asyncio.wait_for(sub.recv(), 5)
            assert envelope.message.origin == count + 1 and leftover.expected == count + 2
        finally:
            sub_bus.close()


@pytest.mark.timeout(60)
def test_a_batch_arrives_in_order_without_gaps_and_is_redelivered_whole(tmp_path):
    asyncio.run(asyncio.wait_for(_batch_in_order(tmp_path), 30))


async def _single_when_idle(tmp_path) -> None:
    async with _publisher_and_member(tmp_path) as (_, pub, raw):
        raw.connect(pub.endpoint)
        await raw.send_multipart(codec.encode(Join("numbers", "sink", "sink.0~0", 10, 1 << 30)))
        # No timer, no waiting for company: one message is one plain delivery, sent as soon as
        # the member has joined (at once if it already had, else when the Join is read).
        await pub.send(Record(1, None))
        frames = await asyncio.wait_for(raw.recv_multipart(), 5)
        assert frames[0][:1] == b"D" and struct.unpack_from("<Q", frames[0], 1)[0] == 1
        assert codec.decode(frames, 9).message.origin == 1


@pytest.mark.timeout(60)
def test_a_single_message_on_an_idle_topic_goes_out_at_once(tmp_path):
    asyncio.run(asyncio.wait_for(_single_when_idle(tmp_path), 30))


async def _byte_window(tmp_path) -> None:
    async with _publisher_and_member(tmp_path) as (_, pub, raw):
        size = len(_record(1, np.zeros(1000, np.uint8))[0])  # every message has this many bytes
        for i in range(1, 11):
            await pub.send(Record(i, np.zeros(1000, np.uint8)))
        raw.connect(pub.endpoint)
        # Credit for 100 messages but only for 3.5 messages' bytes: 3 go out, in one batch.
        await raw.send_multipart(codec.encode(Join("numbers", "sink", "sink.0~0", 100,
                                                   size * 7 // 2)))
        head = (await asyncio.wait_for(raw.recv_multipart(), 5))[0]
        assert _parse_batch(head)[:2] == (1, 3)
        assert not await raw.poll(50)  # nothing more until some bytes come back
        await raw.send_multipart(codec.encode(Credit("numbers", 2)))
        head = (await asyncio.wait_for(raw.recv_multipart(), 5))[0]
        assert _parse_batch(head)[:2] == (4, 2)
        # Bytes come back with acknowledgements: 3 fit again, then 2 (11 is too large).
        await pub.send(Record(11, np.zeros(10 * 1000, np.uint8)))
        for acked, first, count in ((3, 6, 3), (3, 9, 2)):
            await raw.send_multipart(codec.encode(Credit("numbers", acked)))
            head = (await asyncio.wait_for(raw.recv_multipart(), 5))[0]
            assert _parse_batch(head)[:2] == (first, count)
        assert not await raw.poll(50)
        # A message larger than the whole byte window still goes, alone, once nothing else is
        # in flight: the window bounds what is in flight, it never blocks a message forever.
        await raw.send_multipart(codec.encode(Credit("numbers", 2)))
        head = (await asyncio.wait_for(raw.recv_multipart(), 5))[0]
        assert head[:1] == b"D" and struct.unpack_from("<Q", head, 1)[0] == 11
        assert pub.pending() == 1


@pytest.mark.timeout(60)
def test_the_publisher_keeps_bytes_in_flight_within_the_byte_window(tmp_path):
    asyncio.run(asyncio.wait_for(_byte_window(tmp_path), 30))


async def _large_messages_small_window(tmp_path) -> None:
    ctx = zmq.asyncio.Context()
    endpoint = f"ipc://{tmp_path}/numbers"
    pub_bus = Bus("source.0~0", "source", TOPICS, {"numbers": endpoint}, {"numbers": ["sink"]},
                  sockets=SocketFactory(ctx))
    sub_bus = Bus("sink.0~0", "sink", TOPICS, {}, {}, sockets=SocketFactory(ctx))
    try:
        pub = pub_bus.publisher("numbers")
        sub_bus.set_peers({"numbers": [pub.endpoint]}, {})
        # Room for two and a half messages in flight: acknowledgements must go back by bytes
        # (a quarter of the window), long before a quarter of the 100-message window.
        sub = sub_bus.subscriber("numbers", window_bytes=5 * codec.INLINE_MAX // 2)
        count = 200

        async def produce():
            for i in range(1, count + 1):
                await pub.send(Record(i, np.full(codec.INLINE_MAX, i % 256, np.uint8)))

        producer = asyncio.ensure_future(produce())
        for i in range(1, count + 1):
            envelope = await asyncio.wait_for(sub.recv(), 5)
            assert envelope.message.origin == i and envelope.message.data[0] == i % 256
        await producer
        waiting = asyncio.ensure_future(sub.recv())  # asking for more acknowledges the last
        assert await pub.flush(5)
        waiting.cancel()
        assert sub.stats.gaps == 0 and sub.stats.malformed == 0
        member = next(iter(pub.groups["sink"].members.values()))
        assert member.credit_bytes == 5 * codec.INLINE_MAX // 2  # all of it came back
    finally:
        pub_bus.close()
        sub_bus.close()
        ctx.term()


@pytest.mark.timeout(60)
def test_large_messages_flow_through_a_small_byte_window(tmp_path, monkeypatch):
    # No delayed acknowledgements: only those sent for bytes handled can keep this moving.
    monkeypatch.setattr(reliable, "ACK_DELAY_S", 60.0)
    asyncio.run(asyncio.wait_for(_large_messages_small_window(tmp_path), 30))


async def _hwm_bytes(tmp_path) -> None:
    size = len(_record(1, np.zeros(1000, np.uint8))[0])
    topics = {"numbers": TopicSpec("reliable", 100, hwm_bytes=3 * size)}
    async with _publisher_and_member(tmp_path, topics) as (_, pub, raw):
        for i in range(1, 4):  # three messages reach the byte bound; none is acknowledged yet
            await pub.send(Record(i, np.zeros(1000, np.uint8)))
        assert pub.queued_bytes == 3 * size and pub.stats.depth == 3 < pub.hwm
        fourth = asyncio.ensure_future(pub.send(Record(4, np.zeros(1000, np.uint8))))
        for _ in range(10):  # let the loop run: the send must stay blocked on bytes alone
            await asyncio.sleep(0)
        assert not fourth.done() and pub.seq == 3
        raw.connect(pub.endpoint)
        await raw.send_multipart(codec.encode(Join("numbers", "sink", "sink.0~0", 10, 1 << 30)))
        head = (await asyncio.wait_for(raw.recv_multipart(), 5))[0]
        assert _parse_batch(head)[:2] == (1, 3)
        assert not fourth.done()  # delivered is not acknowledged: the bytes are still held
        await raw.send_multipart(codec.encode(Credit("numbers", 1)))
        await asyncio.wait_for(fourth, 5)
        assert pub.queued_bytes == 3 * size and pub.seq == 4


@pytest.mark.timeout(60)
def test_a_reliable_publisher_waits_when_unacknowledged_bytes_reach_hwm_bytes(tmp_path):
    asyncio.run(asyncio.wait_for(_hwm_bytes(tmp_path), 30))


# --- hardening: silent members, undeclared groups, the run secret, credit and framing checks ---


@contextlib.asynccontextmanager
async def _publisher_and_sink(tmp_path, topics=TOPICS, groups=("sink",)):
    """A real publisher of ``numbers`` and a real subscriber in group ``sink``, plus a factory
    of raw DEALER sockets connected to the publisher; yields ``(publisher, subscriber, raw)``."""
    ctx = zmq.asyncio.Context()
    pub_bus = Bus("source.0~0", "source", topics, {"numbers": f"ipc://{tmp_path}/numbers"},
                  {"numbers": list(groups)}, sockets=SocketFactory(ctx))
    sub_bus = Bus("sink.1~0", "sink", topics, {}, {}, sockets=SocketFactory(ctx))
    raws = []

    def raw():
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(pub.endpoint)
        raws.append(sock)
        return sock

    try:
        pub = pub_bus.publisher("numbers")
        yield pub, lambda: _subscribe(sub_bus, pub), raw
    finally:
        pub_bus.close()
        sub_bus.close()
        for sock in raws:
            sock.close(linger=0)
        ctx.term()


def _subscribe(sub_bus, pub):
    sub_bus.set_peers({"numbers": [pub.endpoint]}, {})
    return sub_bus.subscriber("numbers")


async def _silent_member(tmp_path) -> None:
    async with _publisher_and_sink(tmp_path) as (pub, subscribe, raw):
        silent = raw()
        await silent.send_multipart(codec.encode(Join("numbers", "sink", "intruder.0", 1, 1 << 30)))
        await pub.send(Record(1, None))
        frames = await asyncio.wait_for(silent.recv_multipart(), 5)  # it holds message 1 ...
        assert codec.decode(frames, 9).message.origin == 1
        sub = subscribe()  # ... and never acknowledges it; a real member joins
        for i in (2, 3):
            await pub.send(Record(i, None))
        origins = [(await asyncio.wait_for(sub.recv(), 5)).message.origin for _ in range(3)]
        assert sorted(origins) == [1, 2, 3]  # 1 was taken back from the silent member
        assert pub.stats.evicted == 1 and pub.stats.redelivered == 1
        assert len(pub.groups["sink"].members) == 1


@pytest.mark.timeout(60)
def test_a_member_that_goes_silent_loses_its_messages_to_the_group(tmp_path, monkeypatch):
    monkeypatch.setattr(reliable, "MEMBER_TIMEOUT_S", 0.3)
    monkeypatch.setattr(reliable, "KEEPALIVE_S", 0.05)
    asyncio.run(asyncio.wait_for(_silent_member(tmp_path), 30))


async def _undeclared_group(tmp_path) -> None:
    topics = {"numbers": TopicSpec("reliable", 4)}
    async with _publisher_and_sink(tmp_path, topics) as (pub, subscribe, raw):
        sub = subscribe()
        intruder = raw()  # joins a group the graph does not have, with credit 1, and goes away
        await intruder.send_multipart(codec.encode(Join("numbers", "intruder", "x.0", 1, 1 << 30)))

        async def joined():  # the publisher runs in this loop: wait for it to see the join
            while "intruder" not in pub.groups:
                await asyncio.sleep(0.005)

        await asyncio.wait_for(joined(), 5)

        async def produce():
            for i in range(1, 41):  # ten times the hwm: the intruder's queue must not hold it
                await pub.send(Record(i, None))

        producer = asyncio.ensure_future(produce())
        # It joined before the messages: it got the first one, and keeps it.
        await asyncio.wait_for(intruder.recv_multipart(), 5)
        intruder.close(linger=0)
        origins = [(await asyncio.wait_for(sub.recv(), 5)).message.origin for _ in range(40)]
        await asyncio.wait_for(producer, 5)
        assert origins == list(range(1, 41))
        assert "intruder" not in pub.groups and pub.stats.evicted == 1


@pytest.mark.timeout(60)
def test_a_join_to_an_undeclared_group_cannot_stall_the_topic(tmp_path, monkeypatch):
    monkeypatch.setattr(reliable, "MEMBER_TIMEOUT_S", 0.3)
    monkeypatch.setattr(reliable, "KEEPALIVE_S", 0.05)
    asyncio.run(asyncio.wait_for(_undeclared_group(tmp_path), 30))


async def _run_secret(tmp_path) -> None:
    async with _publisher_and_sink(tmp_path) as (pub, subscribe, raw):
        await pub.send(Record(1, None))
        stranger = raw()
        await stranger.send_multipart(codec.encode(Join("numbers", "sink", "x.0", 10, 1 << 30,
                                                        "guess")))
        # The same connection joins again with the secret: once it gets message 1, the first
        # join was seen, and refused.
        await stranger.send_multipart(codec.encode(Join("numbers", "sink", "x.0", 10, 1 << 30,
                                                        "s3cret")))
        frames = await asyncio.wait_for(stranger.recv_multipart(), 5)
        assert codec.decode(frames, 9).message.origin == 1
        assert pub.stats.refused == 1 and len(pub.groups["sink"].members) == 1
        stranger.close(linger=0)
        pub.drop_instances({"x.0"})
        sub = subscribe()  # a real subscriber carries the secret from its environment
        assert (await asyncio.wait_for(sub.recv(), 5)).message.origin == 1
        assert pub.stats.refused == 1


@pytest.mark.timeout(60)
def test_joins_must_carry_the_run_secret(tmp_path, monkeypatch):
    monkeypatch.setenv(reliable.SECRET_ENV, "s3cret")
    asyncio.run(asyncio.wait_for(_run_secret(tmp_path), 30))


async def _no_overrun(tmp_path) -> None:
    async with _publisher_and_member(tmp_path) as (_, pub, raw):
        for i in range(1, 6):
            await pub.send(Record(i, None))
        raw.connect(pub.endpoint)
        await raw.send_multipart(codec.encode(Join("numbers", "sink", "sink.0~0", 2, 1 << 30)))
        head = (await asyncio.wait_for(raw.recv_multipart(), 5))[0]
        assert _parse_batch(head)[:2] == (1, 2)  # the whole window, and no more
        # A keepalive makes the publisher pump again: with no credit left, nothing may go.
        await raw.send_multipart(codec.encode(Credit("numbers", 0)))
        assert not await raw.poll(100)
        member = next(iter(pub.groups["sink"].members.values()))
        assert member.credit == 0 and len(member.inflight) == 2
        await raw.send_multipart(codec.encode(Credit("numbers", 1)))
        head = (await asyncio.wait_for(raw.recv_multipart(), 5))[0]
        assert head[:1] == b"D" and struct.unpack_from("<Q", head, 1)[0] == 3
        assert not await raw.poll(100)
        assert member.credit == 0 and len(member.inflight) == 2


@pytest.mark.timeout(60)
def test_a_member_never_gets_more_than_its_credit(tmp_path):
    asyncio.run(asyncio.wait_for(_no_overrun(tmp_path), 30))


async def _trailing_junk(tmp_path) -> None:
    ctx = zmq.asyncio.Context()
    raw = ctx.socket(zmq.ROUTER)  # plays the publisher
    raw.linger = 0
    endpoint = f"ipc://{tmp_path}/numbers"
    raw.bind(endpoint)
    bus = Bus("sink.0~0", "sink", TOPICS, {}, {}, sockets=SocketFactory(ctx))
    try:
        bus.set_peers({"numbers": [endpoint]}, {})
        sub = bus.subscriber("numbers")
        routing_id, *join = await raw.recv_multipart()
        assert isinstance(codec.decode(join).message, Join)
        # Two good messages whose length table sums to less than the head: junk follows them.
        routing, head = _batch(routing_id, 1, [_record(1), _record(2)])
        await raw.send_multipart([routing, head + b"junk"])
        await raw.send_multipart([routing_id, b"D" + struct.pack("<Q", 3) + _record(3)[0]])
        envelope = await asyncio.wait_for(sub.recv(), 5)
        assert envelope.message.origin == 3  # the batch was refused whole
        assert sub.stats.malformed == 2 and sub.stats.received == 1 and sub.stats.gaps == 0
    finally:
        bus.close()
        raw.close(linger=0)
        ctx.term()


@pytest.mark.timeout(60)
def test_a_batch_with_trailing_junk_is_refused(tmp_path):
    asyncio.run(asyncio.wait_for(_trailing_junk(tmp_path), 30))


async def _send_many(tmp_path) -> None:
    """``send_many``: one message on the wire (one counter, one credit), handed out one by one
    in order, acknowledged once the subscriber asked past its last item, and redelivered whole
    when the member that had it goes away."""
    topics = {"numbers": TopicSpec("reliable", 1000)}
    async with _publisher_and_member(tmp_path, topics) as (ctx, pub, raw):
        sub_bus = Bus("sink.1~0", "sink", topics, {}, {}, sockets=SocketFactory(ctx))
        try:
            big = np.arange(codec.INLINE_MAX // 16)  # inline, as every array of a batch
            batches = [[Record(10 * b + i, big if i == 2 else np.full(3, 10 * b + i))
                        for i in range(5)] for b in range(3)]
            for msgs in batches:
                await pub.send_many(msgs)
            await pub.send_many([])  # nothing
            assert pub.stats.sent == 3

            raw.connect(pub.endpoint)
            await raw.send_multipart(codec.encode(Join("numbers", "sink", "sink.0~0", 1, 1 << 30)))
            frames = await asyncio.wait_for(raw.recv_multipart(copy=False), 5)
            head = frames[0].bytes
            assert head[:1] == b"D" and struct.unpack_from("<Q", head, 1)[0] == 1  # 1 credit
            # The member vanishes: the first batch goes back whole.
            pub.drop_instances({"sink.0~0"})
            assert pub.stats.redelivered == 1

            sub_bus.set_peers({"numbers": [pub.endpoint]}, {})
            sub = sub_bus.subscriber("numbers")
            for b, msgs in enumerate(batches):
                for msg in msgs:
                    envelope = await asyncio.wait_for(sub.recv(), 5)
                    assert envelope.kind == "record" and envelope.message.origin == msg.origin
                    np.testing.assert_array_equal(envelope.message.data, msg.data)
                    # A batch counts as handled (acknowledged, or due to be) only once the
                    # subscriber asked past its last item: b batches so far, whatever the item.
                    conn = sub.connections[pub.endpoint]
                    assert (conn.expected - 1 - conn.unacked) + conn.handled == b
            assert sub.stats.received == 15 and sub.stats.gaps == 0 and sub.stats.malformed == 0
            assert pub.pending() >= 1  # the last batch: its last item not asked past yet
            sub._ack_previous(threshold=1)  # what asking for more, then going idle, does
            assert await pub.flush(5) and pub.pending() == 0
        finally:
            sub_bus.close()


@pytest.mark.timeout(60)
def test_send_many_is_one_message_on_the_wire_and_many_for_the_subscriber(tmp_path):
    asyncio.run(asyncio.wait_for(_send_many(tmp_path), 30))


async def _send_many_large(tmp_path) -> None:
    async with _publisher_and_sink(tmp_path) as (pub, subscribe, raw):
        sub = subscribe()
        large = np.arange(codec.INLINE_MAX, dtype=np.uint8)  # its own frame
        msgs = [Record(1, None), Record(2, np.zeros(3)), Record(3, large), Record(4, None),
                Record(5, large), Record(6, None), Record(7, np.ones(2))]
        await pub.send_many(msgs)
        # [1, 2] as a batch, 3 alone, 4 alone, 5 alone, [6, 7] as a batch
        assert pub.stats.sent == 5
        got = []
        while len(got) < len(msgs):
            got += await asyncio.wait_for(sub.recv_many(), 5)
        assert [e.message.origin for e in got] == [1, 2, 3, 4, 5, 6, 7]
        np.testing.assert_array_equal(got[4].message.data, large)
        assert sub.stats.gaps == 0 and sub.stats.malformed == 0


@pytest.mark.timeout(60)
def test_send_many_sends_a_message_with_a_large_array_on_its_own_in_order(tmp_path):
    asyncio.run(asyncio.wait_for(_send_many_large(tmp_path), 30))


async def _recv_many(tmp_path) -> None:
    """``recv_many``: every message already here, in order (the items of a batch and single
    messages alike), at most ``limit``; what it handed out counts as handled only once the
    subscriber asks again, by either call; ``[]`` once left and drained."""
    async with _publisher_and_sink(tmp_path) as (pub, subscribe, raw):
        sub = subscribe()
        await pub.send(Record(1, None))
        for b in range(2):
            await pub.send_many([Record(10 * b + i, np.full(3, 10 * b + i)) for i in range(4)])
        await pub.send(Record(99, np.arange(codec.INLINE_MAX)))  # framed
        while len(sub._queue) < 10:  # all four wire messages delivered
            sub._event.clear()
            await asyncio.wait_for(sub._event.wait(), 5)
        conn = sub.connections[pub.endpoint]

        def handled() -> int:  # wire messages acknowledged or due to be
            return (conn.expected - 1 - conn.unacked) + conn.handled

        first = await sub.recv_many(limit=3)
        assert [e.message.origin for e in first] == [1, 0, 1] and handled() == 0
        rest = await sub.recv_many()
        assert [e.message.origin for e in rest] == [2, 3, 10, 11, 12, 13, 99]
        np.testing.assert_array_equal(rest[1].message.data, np.full(3, 3))
        np.testing.assert_array_equal(rest[-1].message.data, np.arange(codec.INLINE_MAX))
        assert handled() == 1  # the single message; the first batch's last item came after
        assert sub.stats.received == 10 and len(sub._queue) == 0
        sub.leave()
        # Asking again (recv, with nothing left) acknowledges what recv_many handed out.
        assert await asyncio.wait_for(sub.recv(), 5) is None
        assert handled() == 4
        assert await sub.recv_many() == []
        assert await pub.flush(5) and pub.pending() == 0
        assert sub.stats.gaps == 0 and sub.stats.malformed == 0


@pytest.mark.timeout(60)
def test_recv_many_hands_out_what_is_here_and_acknowledges_on_the_next_call(tmp_path):
    asyncio.run(asyncio.wait_for(_recv_many(tmp_path), 30))


async def _coalesce(tmp_path) -> None:
    """A coalescing topic: the small unkeyed messages of one loop turn go as one batch (at
    most COALESCE_MAX), in order with keyed and large ones, and the watermark, ``pending`` and
    ``flush`` see them as sent."""
    topics = {"numbers": TopicSpec("reliable", 1000, coalesce=True)}
    async with _publisher_and_sink(tmp_path, topics) as (pub, subscribe, raw):
        sub = subscribe()
        large = np.arange(codec.INLINE_MAX, dtype=np.uint8)
        for origin in range(1, 101):
            await pub.send(Record(origin, np.full(2, origin)))
        assert pub.seq == 1  # the first 64 as one batch; 36 held
        assert pub.context.watermark() == ((pub, 2),)  # releases the 36 as a second batch
        await pub.send(Record(101, None))  # held
        await pub.send(Record(102, large))  # large: the held one goes first, then this
        await pub.send(Record(103, None), key=0)  # keyed: alone
        await pub.send(Record(104, None))
        await pub.send(Record(105, None))
        assert pub.seq == 5 and pub.stats.sent == 5
        got = []
        while len(got) < 105:  # 104 and 105 go once this turn of the loop ends
            got += await asyncio.wait_for(sub.recv_many(), 5)
        assert pub.seq == 6 and pub.stats.sent == 6
        assert [e.message.origin for e in got] == list(range(1, 106))
        np.testing.assert_array_equal(got[101].message.data, large)
        np.testing.assert_array_equal(got[63].message.data, np.full(2, 64))
        await pub.send(Record(106, None))
        assert pub.pending() >= 1  # counts the held one (released)
        sub.leave()
        assert [e.message.origin for e in await asyncio.wait_for(sub.recv_many(), 5)] == [106]
        assert await asyncio.wait_for(sub.recv_many(), 5) == []
        assert await pub.flush(5)
        assert sub.stats.gaps == 0 and sub.stats.malformed == 0


@pytest.mark.timeout(60)
def test_a_coalescing_topic_batches_one_turns_small_messages_in_order(tmp_path):
    asyncio.run(asyncio.wait_for(_coalesce(tmp_path), 30))


async def _bad_batch_item(tmp_path) -> None:
    async with _publisher_and_sink(tmp_path) as (pub, subscribe, raw):
        sub = subscribe()
        [good] = batch_codec.wire_messages([Record(1, np.zeros(2)), Record(2, None)])
        bad = Batch([["record", "not an int", None]])
        await pub.send(bad)
        await pub.send(good)
        for origin in (1, 2):
            envelope = await asyncio.wait_for(sub.recv(), 5)
            assert envelope.message.origin == origin
        assert sub.stats.malformed == 1 and sub.stats.gaps == 0


@pytest.mark.timeout(60)
def test_a_batch_with_a_bad_item_is_refused_whole(tmp_path):
    asyncio.run(asyncio.wait_for(_bad_batch_item(tmp_path), 30))


async def _flush_present_only(tmp_path, leave: bool) -> None:
    async with _publisher_and_member(tmp_path) as (ctx, pub, raw):
        raw.connect(pub.endpoint)
        await raw.send_multipart(codec.encode(Join("numbers", "sink", "sink.0~0", 5, 1 << 30)))
        for i in range(1, 4):
            await pub.send(Record(i, None))
        await asyncio.wait_for(raw.recv_multipart(), 5)  # delivered, never acknowledged
        assert not await pub.flush(0.2) and not await pub.flush(0.2, present_only=True)
        waiting = asyncio.ensure_future(pub.flush(30, present_only=True))
        done, _ = await asyncio.wait([waiting], timeout=0.2)
        assert not done  # the member is there, with the messages unacknowledged
        if leave:  # a consumer done for good (a learner at its budget) says so, then exits
            await raw.send_multipart(codec.encode(Leave("numbers")))
            await asyncio.wait_for(raw.recv_multipart(), 5)  # the LeaveAck
        pub.drop_instances({"sink.0~0"})  # the supervisor saw it exit
        if leave:
            # Nobody of that group will take them: a present-only flush returns at once; a
            # full one still waits for the group.
            assert await asyncio.wait_for(waiting, 5)
            assert pub.pending() == 3 and not await pub.flush(0.2)
            return
        # Killed without a word: its replacement takes what it held, and the flush waits
        # for that (the producer that sent everything used to exit, and the records the dead
        # consumer held were lost).
        done, _ = await asyncio.wait([waiting], timeout=0.2)
        assert not done
        again = ctx.socket(zmq.DEALER)
        again.linger = 0
        try:
            again.connect(pub.endpoint)
            await again.send_multipart(
                codec.encode(Join("numbers", "sink", "sink.0~1", 5, 1 << 30)))
            await asyncio.wait_for(again.recv_multipart(), 5)  # the three, redelivered
            await again.send_multipart(codec.encode(Credit("numbers", 3)))
            assert await asyncio.wait_for(waiting, 5)
            assert pub.pending() == 0
        finally:
            again.close(linger=0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("leave", [True, False], ids=["left-for-good", "killed"])
def test_a_present_only_flush_waits_only_for_groups_that_will_take_their_messages(tmp_path,
                                                                                   leave):
    asyncio.run(asyncio.wait_for(_flush_present_only(tmp_path, leave), 30))


async def _busy_subscriber_acknowledges(tmp_path) -> None:
    """A publisher that stopped sending below the acknowledgement batch is acknowledged
    although the subscriber never goes idle (the idle flush is pushed out of reach here, as
    other publishers keeping its queue full push it in a run)."""
    async with _publisher_and_sink(tmp_path) as (pub, subscribe, raw):
        sub = subscribe()
        for i in range(3):  # a quarter window is 25: three stay below the batch
            await pub.send(Record(i, None))
        for i in range(3):
            assert (await asyncio.wait_for(sub.recv(), 5)).message.origin == i
        asking = asyncio.ensure_future(sub.recv())  # handled all three; waits for more
        assert await pub.flush(5) and pub.pending() == 0
        asking.cancel()


@pytest.mark.timeout(60)
def test_a_busy_subscriber_acknowledges_a_publisher_that_stopped_sending(tmp_path, monkeypatch):
    monkeypatch.setattr(reliable, "ACK_DELAY_S", 60.0)
    asyncio.run(asyncio.wait_for(_busy_subscriber_acknowledges(tmp_path), 30))
