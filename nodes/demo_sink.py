"""Demo sink: checks that every origin number arrives exactly once, and writes a verdict.

The verdict (``sink_result.json`` in the run directory) is what the integration tests read:
received, duplicates, missing, transport gaps, and how many records each transformer handled.

Exactly-once through restarts: a record's identity is its ``origin`` (the source's number,
which the transformer carries over from its input), so a record that comes again -- its
transformer was killed before its input was acknowledged and a new incarnation re-published
it -- is recognised and counted as ``redelivered``, without effect. What the sink has seen
lives in a small state file (``state/<instance>.npz``), written atomically, and the sink
acknowledges a record only once the state that counts it is on disk (``Bus.hold_acks``): a
kill -9 loses nothing it had acknowledged, and its restart goes on counting from the file.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field

import numpy as np

from pipeline.messages import Record
from pipeline.ports import Port, Ports
from typedconfig import ConfigError

FLUSH_EVERY = 256  # records counted but not yet on disk before the state is written
FLUSH_DELAY_S = 0.01  # and at most this long after the first of them (an idle input)


@dataclass(frozen=True)
class Config:
    expected: int = field(default=100_000, metadata={"doc": "records to wait for; 0 = forever",
                                                     "minimum": 0})
    input: str = field(default="doubled", metadata={"doc": "topic to consume"})


def ports(config: Config) -> Ports:
    return Ports(subscribes={config.input: Port(Record)})


PORTS = ports


def validate(config: Config) -> None:
    """Checked at graph load (the config builder checks the minimum too; this says why)."""
    if config.expected < 0:
        raise ConfigError("expected", "must be >= 0 (0 waits forever)")


class SinkState:
    """What the sink has counted, with the durability gate ``Bus.hold_acks`` waits on:
    ``seq`` counts records handled, ``completed_through`` those whose effect is on disk."""

    def __init__(self, path: str, expected: int):
        self.path = path
        self.seen = np.zeros(expected + 1, dtype=np.uint8)
        self.counts = {"received": 0, "redelivered": 0, "wrong_values": 0, "incarnations": 0}
        self.by_instance: dict[str, int] = {}
        self.by_scale: dict[str, int] = {}
        self.seq = 0
        self.completed_through = 0

    def load(self) -> bool:
        """Restore a previous incarnation's state; False if there was none."""
        if not os.path.exists(self.path):
            return False
        with np.load(self.path) as data:
            seen = data["seen"]
            meta = json.loads(bytes(data["meta"]).decode())
        if len(seen) > len(self.seen):
            self.seen = np.zeros(len(seen), dtype=np.uint8)
        self.seen[: len(seen)] = seen
        self.counts.update(meta["counts"])
        self.by_instance, self.by_scale = meta["by_instance"], meta["by_scale"]
        return True

    def count(self, origin: int, data) -> None:
        """Apply one record's effect, once per origin."""
        if origin >= len(self.seen):
            self.seen = np.concatenate([self.seen, np.zeros(origin + 1 - len(self.seen),
                                                            np.uint8)])
        self.seq += 1
        if self.seen[origin]:
            self.counts["redelivered"] += 1
            return
        self.seen[origin] = 1
        self.counts["received"] += 1
        self.counts["wrong_values"] += int(np.any(data["values"] != origin * data["scale"]))
        self.by_instance[data["by"]] = self.by_instance.get(data["by"], 0) + 1
        key = str(data["scale"])
        self.by_scale[key] = self.by_scale.get(key, 0) + 1

    def write(self) -> None:
        """Atomically: a temporary file, fsync, rename; then the gate moves."""
        meta = json.dumps({"counts": self.counts, "by_instance": self.by_instance,
                           "by_scale": self.by_scale}).encode()
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            np.savez(f, seen=self.seen, meta=np.frombuffer(meta, dtype=np.uint8))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self.completed_through = self.seq


async def run(config: Config, node, ready) -> dict:
    bus = node.bus
    directory = os.path.join(node.info.run_dir, "state")
    os.makedirs(directory, exist_ok=True)
    state = SinkState(os.path.join(directory, f"{node.info.instance}.npz"), config.expected)
    restored = state.load()
    state.counts["incarnations"] += 1
    bus.hold_acks(state)
    sub = bus.subscriber(config.input)
    loop = asyncio.get_running_loop()
    timer: asyncio.TimerHandle | None = None

    def flush() -> None:
        nonlocal timer
        if timer is not None:
            timer.cancel()
            timer = None
        if state.completed_through < state.seq:
            state.write()
            bus.on_output_acknowledged()

    def complete() -> bool:
        return bool(config.expected and state.counts["received"] >= config.expected
                    and np.all(state.seen[1: config.expected + 1]))

    ready()
    node.status["restored"] = restored
    if not complete():
        async for envelope in sub:
            record = envelope.message
            state.count(record.origin, record.data)
            node.status["received"] = state.counts["received"]
            if state.seq - state.completed_through >= FLUSH_EVERY:
                flush()
            elif timer is None:
                timer = loop.call_later(FLUSH_DELAY_S, flush)
            if complete():
                break
    flush()
    stats = sub.stats
    seen = state.seen
    verdict = {
        **state.counts,
        "unique": int(np.count_nonzero(seen[1:])),
        # One effect per origin by construction; a second would be a bug of this node.
        "duplicates": int(state.counts["received"] - np.count_nonzero(seen[1:])),
        "missing": int(config.expected - np.count_nonzero(seen[1: config.expected + 1]))
        if config.expected else 0,
        "gaps": stats.gaps,
        "malformed": stats.malformed,
        "by_instance": state.by_instance,
        "by_scale": state.by_scale,
    }
    path = os.path.join(node.info.run_dir, "sink_result.json")
    with open(path + ".tmp", "w") as f:
        json.dump(verdict, f)
    os.replace(path + ".tmp", path)
    return verdict
