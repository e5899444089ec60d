"""Demo transformer: multiplies each record and forwards it, tagging who handled it.

An output's identity is its input's (``origin`` is carried over), never this incarnation's
sequence: an input redelivered after a kill -9 (its output was sent, its acknowledgement was
not) is re-published by the next incarnation as the same record, and the sink recognises it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.messages import Record
from pipeline.ports import Port, Ports
from typedconfig import ConfigError


@dataclass(frozen=True)
class Config:
    scale: int = field(default=2, metadata={"doc": "factor applied to every value"})
    input: str = field(default="numbers", metadata={"doc": "topic to consume"})
    output: str = field(default="doubled", metadata={"doc": "topic to publish on"})


def ports(config: Config) -> Ports:
    return Ports(subscribes={config.input: Port(Record)},
                 publishes={config.output: Port(Record)})


PORTS = ports


def validate(config: Config) -> None:
    """Checked at graph load: a node cannot feed itself."""
    if config.output == config.input:
        raise ConfigError("output", f"must differ from input ({config.input!r})")


async def run(config: Config, node, ready) -> dict:
    bus = node.bus
    sub = bus.subscriber(config.input)
    pub = bus.publisher(config.output)
    ready()
    handled = 0
    async for envelope in sub:  # ends once a stop was requested and the input is drained
        record = envelope.message
        values = record.data * config.scale
        await pub.send(Record(origin=record.origin,
                              data={"values": values, "by": node.info.instance,
                                    "scale": config.scale}))
        handled += 1
        node.status["handled"] = handled
    return {"handled": handled}
