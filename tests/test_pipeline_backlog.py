"""``ReliablePublisher.wait_for_backlog``: a producer that waits until what it sent was taken
(real sockets, a real subscriber with a window of one)."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from pipeline.bus import Bus, TopicSpec
from pipeline.messages import Record
from pipeline.sockets import SocketFactory

TOPICS = {"numbers": TopicSpec("reliable", 4)}


async def _backlog(tmp_path) -> None:
    ctx = zmq.asyncio.Context()
    pub_bus = Bus("source.0~0", "source", TOPICS, {"numbers": f"ipc://{tmp_path}/numbers"},
                  {"numbers": ["sink"]}, sockets=SocketFactory(ctx))
    sub_bus = Bus("sink.1~0", "sink", TOPICS, {}, {}, sockets=SocketFactory(ctx))
    try:
        pub = pub_bus.publisher("numbers")
        sub_bus.set_peers({"numbers": [pub.endpoint]}, {})
        sub = sub_bus.subscriber("numbers", window=1)
        await pub.send(Record(1, None))
        first = await asyncio.wait_for(sub.recv(), 5)  # message 1 taken, not acknowledged
        assert first.message.origin == 1
        await pub.send(Record(2, None))  # no credit left: it waits in the backlog
        assert pub.stats.depth == 1
        await asyncio.wait_for(pub.wait_for_backlog(1), 5)  # at most one: already true

        async def depth_when_released() -> int:
            await pub.wait_for_backlog(0)
            return pub.stats.depth  # read the moment the wait ends

        # Message 2 can leave the backlog only after the subscriber acknowledges message 1,
        # which its next recv does: a wait that ended before would read a depth of 1.
        waiter = asyncio.ensure_future(depth_when_released())
        second = await asyncio.wait_for(sub.recv(), 5)  # acknowledges 1: 2 is delivered
        assert second.message.origin == 2
        assert await asyncio.wait_for(waiter, 5) == 0
    finally:
        pub_bus.close()
        sub_bus.close()
        ctx.term()


@pytest.mark.timeout(60)
def test_a_producer_waits_until_its_queued_message_is_taken(tmp_path):
    asyncio.run(asyncio.wait_for(_backlog(tmp_path), 30))
