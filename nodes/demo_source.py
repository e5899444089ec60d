"""Demo source: publishes numbered arrays on a reliable topic (the toy graph's producer)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.messages import Record
from pipeline.ports import Port, Ports


@dataclass(frozen=True)
class Config:
    count: int = field(default=100_000, metadata={"doc": "records to send; 0 = until stopped",
                                                  "minimum": 0})
    size: int = field(default=16, metadata={"doc": "int64 elements per record", "minimum": 1})
    output: str = field(default="numbers", metadata={"doc": "topic to publish on"})


def ports(config: Config) -> Ports:
    """The output topic's name is configurable, so the ports are a function of the config."""
    return Ports(publishes={config.output: Port(Record)})


PORTS = ports


async def run(config: Config, node, ready) -> dict:
    bus = node.bus
    pub = bus.publisher(config.output)
    ready()
    sent = 0
    while not node.stopping.is_set() and (config.count == 0 or sent < config.count):
        sent += 1
        await pub.send(Record(origin=sent, data=np.full(config.size, sent, dtype=np.int64)))
        node.status["sent"] = sent
    return {"sent": sent}
