"""Partitioned reliable topics (issue 12, sharded replay): each replica of a consuming node is a
consumer group of its own, a keyed message reaches replica ``key % replicas`` only, and other
consuming nodes still get every message. Real sockets between buses."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import zmq
import zmq.asyncio

from pipeline.bus import Bus
from pipeline.graph import parse
from pipeline.messages import Record
from pipeline.sockets import SocketFactory
from pipeline.topics import TopicSpec, partition_group

TOPICS = {"numbers": TopicSpec("reliable", 100, partitioned=True)}


async def _partitioned(tmp_path) -> None:
    ctx = zmq.asyncio.Context()
    groups = [partition_group("shard", 0), partition_group("shard", 1), partition_group("monitor", 0)]
    pub_bus = Bus("source.0~0", "source", TOPICS, {"numbers": f"ipc://{tmp_path}/numbers"},
                  {"numbers": groups}, sockets=SocketFactory(ctx))
    subs = {name: Bus(f"{name}~0", name.split(".")[0], TOPICS, {}, {},
                      sockets=SocketFactory(ctx), replica=int(name.split(".")[1]))
            for name in ("shard.0", "shard.1", "monitor.0")}
    try:
        pub = pub_bus.publisher("numbers")
        for bus in subs.values():
            bus.set_peers({"numbers": [pub.endpoint]}, {})
        for bus in subs.values():
            bus.subscriber("numbers")
        count = 300

        async def produce():
            for i in range(count):
                await pub.send(Record(i, np.zeros(4, np.uint8)), key=i % 5)
            for i in range(10):
                await pub.send(Record(count + i, np.zeros(4, np.uint8)))

        async def drain(bus, n):
            sub = bus.subscriber("numbers")
            return [(await asyncio.wait_for(sub.recv(), 10)).message.origin for _ in range(n)]

        shard0 = [i for i in range(count) if (i % 5) % 2 == 0]
        shard1 = [i for i in range(count) if (i % 5) % 2 == 1]
        _, got0, got1, everything = await asyncio.gather(
            produce(), drain(subs["shard.0"], len(shard0) + 5),
            drain(subs["shard.1"], len(shard1) + 5), drain(subs["monitor.0"], count + 10))
        assert got0[:len(shard0)] == shard0 and got1[:len(shard1)] == shard1
        # Unkeyed messages are dealt round-robin: five each, none twice, none lost.
        assert sorted(got0[len(shard0):] + got1[len(shard1):]) == list(range(count, count + 10))
        assert everything == list(range(count + 10))
        waiting = [asyncio.ensure_future(bus.subscriber("numbers").recv())
                   for bus in subs.values()]  # asking for more acknowledges the last
        assert await pub.flush(5)  # every group acknowledged what it was given: none pending
        for task in waiting:
            task.cancel()
        assert all(bus.subscriber("numbers").stats.gaps == 0 for bus in subs.values())
    finally:
        pub_bus.close()
        for bus in subs.values():
            bus.close()
        ctx.term()


@pytest.mark.timeout(60)
def test_keyed_messages_reach_one_replica_and_every_other_node(tmp_path):
    asyncio.run(asyncio.wait_for(_partitioned(tmp_path), 30))


GRAPH = """
name: g
topics:
  numbers: {{delivery: {delivery}, hwm: 10, partitioned: true}}
  out: {{delivery: reliable, hwm: 10}}
nodes:
  source: {{kind: demo_source, publishes: [numbers], config: {{count: 10}}}}
  sink: {{kind: demo_transformer, replicas: 2, subscribes: [numbers], publishes: [out],
          config: {{input: numbers, output: out}}}}
"""


def test_a_partitioned_topic_has_a_group_per_consumer_replica():
    graph = parse(GRAPH.format(delivery="reliable"), "g.yaml")
    assert graph.consumer_groups("numbers") == ["sink/0", "sink/1"]


def test_only_reliable_topics_can_be_partitioned():
    from pipeline.graphyaml import GraphError

    with pytest.raises(GraphError, match=r"g.yaml:4.*partitioned.*only reliable"):
        parse(GRAPH.format(delivery="lossy"), "g.yaml")
