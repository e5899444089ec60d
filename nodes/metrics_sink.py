"""metrics_sink: every metric to ``metrics.jsonl`` and TensorBoard event files.

One JSON object per message: wall time, source, env steps and the values; TensorBoard scalars
use env steps as the step axis. ``run.py plot`` reads the JSON lines.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from nodes.messages import Metrics
from pipeline.ports import Port, Ports


@dataclass(frozen=True)
class Config:
    filename: str = field(default="metrics.jsonl", metadata={"doc": "in the run directory"})
    tensorboard: bool = field(default=True, metadata={"doc": "also write event files"})


PORTS = Ports(subscribes={"metrics": Port(Metrics)})


async def run(config: Config, node, ready) -> dict:
    bus = node.bus
    metrics = bus.subscriber("metrics")
    path = os.path.join(node.info.run_dir, config.filename)
    writer = None
    if config.tensorboard:
        # TensorBoard's own writer, not torch's: this process then never imports torch.
        from tensorboard.summary import Writer

        writer = Writer(os.path.join(node.info.run_dir, "tensorboard"))
    ready()
    written = 0
    try:
        with open(path, "a") as f:
            async for envelope in metrics:
                msg = envelope.message
                record = {"time": time.time(), "source": msg.source,
                          "env_steps": msg.env_steps, **msg.values}
                f.write(json.dumps(record) + "\n")
                f.flush()
                if writer is not None:
                    for name, value in msg.values.items():
                        if isinstance(value, int | float):
                            writer.add_scalar(name, value, msg.env_steps)
                written += 1
                node.status["written"] = written
    finally:
        if writer is not None:
            writer.close()
    return {"written": written}
