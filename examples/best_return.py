"""A node kind of your own (docs/custom.md): the best evaluation return of a run, in a file.

It subscribes to ``metrics`` and, each time a metric (``eval/return`` unless configured)
beats the best seen so far, rewrites ``best_return.json`` in the run directory:
``{"best": 1.0, "env_steps": 2004, "source": "evaluator.0"}``. A graph uses it with no
registration, by module path::

    nodes:
      best_return:
        kind: examples.best_return      # this module's run(); or examples.best_return:run
        critical: false                 # if it crash-loops, the run goes on without it
        config: {metric: eval/return}   # checked against Config below, like a built-in kind

What the runtime looks for here: ``run`` (the node), ``Config`` (its options, checked at
load: an unknown key is one line naming it), ``PORTS`` (what it publishes and subscribes,
checked against the graph; a graph entry that leaves ``subscribes`` out gets ``metrics``).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

from nodes.messages import Metrics
from pipeline.ports import Port, Ports


@dataclass(frozen=True)
class Config:
    metric: str = field(default="eval/return", metadata={"doc": "the metric to keep the best of"})
    filename: str = field(default="best_return.json", metadata={"doc": "in the run directory"})


PORTS = Ports(subscribes={"metrics": Port(Metrics)})


def write_atomically(path: str, record: dict) -> None:
    """Readers see the old file or the new one, never half of one."""
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


async def run(config: Config, node, ready) -> dict:
    metrics = node.bus.subscriber("metrics")
    path = os.path.join(node.info.run_dir, config.filename)
    best = -math.inf
    if os.path.exists(path):  # a restarted incarnation goes on from what the last one wrote
        with open(path) as f:
            best = json.load(f)["best"]
    ready()
    async for envelope in metrics:  # ends when the run stops this node
        msg = envelope.message
        value = msg.values.get(config.metric)
        if isinstance(value, int | float) and value > best:
            best = float(value)
            write_atomically(path, {"best": best, "env_steps": msg.env_steps,
                                    "source": msg.source})
            node.status["best"] = best  # shown by run.py status
    return {"best": best if best > -math.inf else None}
