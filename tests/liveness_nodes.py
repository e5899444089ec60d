"""Node kinds for the progress-watchdog tests (``tests.liveness_nodes:<function>``): a graph
whose nodes are all healthy while nothing moves."""

from __future__ import annotations

import asyncio
import os

from pipeline.messages import Record


async def stalling_transformer(config, node, ready):
    """The demo transformer, except that its first incarnation stops taking input after
    ``stall_after`` records and waits, alive and beating, until it is stopped (as a consumer
    that lost its membership without knowing it did). Later incarnations work."""
    bus = node.bus
    sub, pub = bus.subscriber("numbers"), bus.publisher("doubled")
    marker = os.path.join(node.info.run_dir, "stalled_once")
    first = not os.path.exists(marker)
    ready()
    handled = 0
    async for envelope in sub:
        record = envelope.message
        await pub.send(Record(origin=record.origin, data={
            "values": record.data * 2, "by": node.info.instance, "scale": 2}))
        handled += 1
        if first and handled == int(config.get("stall_after", 1000)):
            with open(marker, "w"):
                pass
            await node.stopping.wait()
            break
    return {"handled": handled}


async def asker(config, node, ready):
    """Asks the ``answer`` service once and waits (a long timeout) for a reply."""
    client = node.bus.client("answer")
    ready()
    await client.request(Record(1, None), timeout=3600)
    return {}


async def silent_server(config, node, ready):
    """Serves ``answer`` and never replies (an unsatisfiable request)."""
    server = node.bus.server("answer")
    ready()
    async for _ in server:
        pass
    return {}


async def wait_forever(config, node, ready):
    ready()
    await asyncio.Event().wait()


async def memory_sink(config, node, ready):
    """Counts every origin of ``doubled`` in memory (no files while it runs: the disk-trouble
    test fills the disk under the run) and writes ``memory_sink.json`` at the end, retrying
    until the disk takes it."""
    import json

    expected = int(config.get("expected", 1000))
    seen = bytearray(expected + 1)
    duplicates = 0
    sub = node.bus.subscriber("doubled")
    ready()
    received = 0
    async for envelope in sub:
        origin = envelope.message.origin
        if seen[origin]:
            duplicates += 1
        seen[origin] = 1
        received += 1
        node.status["received"] = received
        if received - duplicates >= expected:
            break
    result = {"unique": sum(seen), "duplicates": duplicates}
    path = os.path.join(node.info.run_dir, "memory_sink.json")
    while True:
        try:
            with open(path, "w") as f:
                json.dump(result, f)
            return result
        except OSError:
            await asyncio.sleep(0.1)  # a retry period while the disk is full
