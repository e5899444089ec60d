"""Demo sink: checks that every origin number arrives exactly once, and writes a verdict.

The verdict (``sink_result.json`` in the run directory) is what the integration tests read:
received, duplicates, missing, transport gaps, and how many records each transformer handled.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from pipeline.messages import Record
from pipeline.ports import Port, Ports


@dataclass(frozen=True)
class Config:
    expected: int = field(default=100_000, metadata={"doc": "records to wait for; 0 = forever",
                                                     "minimum": 0})
    input: str = field(default="doubled", metadata={"doc": "topic to consume"})


def ports(config: Config) -> Ports:
    return Ports(subscribes={config.input: Port(Record)})


PORTS = ports


async def run(config: Config, node, ready) -> dict:
    bus = node.bus
    sub = bus.subscriber(config.input)
    ready()
    seen = np.zeros(config.expected + 1, dtype=np.int32)
    wrong_values = 0
    by_instance: dict[str, int] = {}
    by_scale: dict[str, int] = {}
    received = 0
    async for envelope in sub:
        record = envelope.message
        origin = record.origin
        if origin >= len(seen):
            seen = np.concatenate([seen, np.zeros(origin + 1 - len(seen), np.int32)])
        seen[origin] += 1
        data = record.data
        wrong_values += int(np.any(data["values"] != origin * data["scale"]))
        by_instance[data["by"]] = by_instance.get(data["by"], 0) + 1
        by_scale[str(data["scale"])] = by_scale.get(str(data["scale"]), 0) + 1
        received += 1
        node.status["received"] = received
        if config.expected and received >= config.expected and np.all(seen[1:] >= 1):
            break
    stats = sub.stats
    verdict = {
        "received": received,
        "unique": int(np.count_nonzero(seen[1:])),
        "duplicates": int(np.sum(np.maximum(seen[1:] - 1, 0))),
        "missing": int(config.expected - np.count_nonzero(seen[1: config.expected + 1]))
        if config.expected else 0,
        "gaps": stats.gaps,
        "malformed": stats.malformed,
        "wrong_values": wrong_values,
        "by_instance": by_instance,
        "by_scale": by_scale,
    }
    path = os.path.join(node.info.run_dir, "sink_result.json")
    with open(path + ".tmp", "w") as f:
        json.dump(verdict, f)
    os.replace(path + ".tmp", path)
    return verdict
