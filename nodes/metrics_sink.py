"""metrics_sink: every metric to ``metrics.jsonl`` and TensorBoard event files.

One JSON object per message: wall time, source, env steps and the values; TensorBoard scalars
use env steps as the step axis. ``run.py plot`` reads the JSON lines.

A run directory that stops taking writes (read-only, full, gone) must not end metrics silently
(issue 11): records that cannot be written are kept, in order (up to ``pending_max``; beyond
that the oldest go, and the count says so), the node's status ``warning`` says why (the
supervisor prints it on the terminal), and the write is retried every ``retry_s`` and on every
new record, so once the directory takes writes again the file holds everything, in order.
The file is opened for each write: a replaced or remounted directory is noticed at once.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import time
from dataclasses import dataclass, field

from nodes.messages import Metrics
from pipeline.ports import Port, Ports

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Config:
    filename: str = field(default="metrics.jsonl", metadata={"doc": "in the run directory"})
    tensorboard: bool = field(default=True, metadata={"doc": "also write event files"})
    retry_s: float = field(default=5.0, metadata={
        "doc": "retry period while the file cannot be written", "minimum": 0.01})
    pending_max: int = field(default=100_000, metadata={
        "doc": "records kept while the file cannot be written", "minimum": 1})


PORTS = Ports(subscribes={"metrics": Port(Metrics)})


class JsonLines:
    """Appends records to a file; while it cannot, keeps them and says so in the status."""

    def __init__(self, path: str, status: dict, pending_max: int):
        self.path, self.status = path, status
        self.pending: collections.deque = collections.deque(maxlen=pending_max)
        self.dropped = 0  # oldest records given up while the file could not be written
        self.written = 0

    def add(self, record: dict) -> None:
        if len(self.pending) == self.pending.maxlen:
            self.dropped += 1
        self.pending.append(record)
        self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        text = "".join(json.dumps(r) + "\n" for r in self.pending)
        try:
            with open(self.path, "a") as f:
                start = f.tell()
                try:
                    f.write(text)
                    f.flush()
                except OSError:
                    f.truncate(start)  # no half record left for the retry to follow
                    raise
        except OSError as exc:
            lost = f"; {self.dropped} oldest given up" if self.dropped else ""
            warning = (f"metrics not written to {self.path}: {type(exc).__name__}: "
                       f"{exc.strerror or exc}; {len(self.pending)} kept{lost}, retrying")
            if self.status.get("warning", "").split(";")[0] != warning.split(";")[0]:
                log.error("%s", warning)
            self.status["warning"] = warning
            return
        self.written += len(self.pending)
        self.pending.clear()
        if self.status.pop("warning", None):
            log.warning("metrics are written to %s again", self.path)
        self.status["written"] = self.written


async def run(config: Config, node, ready) -> dict:
    bus = node.bus
    metrics = bus.subscriber("metrics")
    path = os.path.join(node.info.run_dir, config.filename)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lines = JsonLines(path, node.status, config.pending_max)
    writer = None
    if config.tensorboard:
        # TensorBoard's own writer, not torch's: this process then never imports torch.
        from tensorboard.summary import Writer

        writer = Writer(os.path.join(node.info.run_dir, "tensorboard"))
    ready()

    async def retry():
        while True:
            await asyncio.sleep(config.retry_s)  # a retry period, not a synchronization
            lines.flush()

    retrying = asyncio.ensure_future(retry())
    try:
        async for envelope in metrics:
            msg = envelope.message
            lines.add({"time": time.time(), "source": msg.source, "env_steps": msg.env_steps,
                       **msg.values})
            if writer is not None:
                try:
                    for name, value in msg.values.items():
                        if isinstance(value, int | float):
                            writer.add_scalar(name, value, msg.env_steps)
                except OSError as exc:  # the JSON lines are the record; say why these stop
                    log.error("tensorboard events not written: %s", exc)
    finally:
        retrying.cancel()
        lines.flush()
        if writer is not None:
            try:
                writer.close()
            except OSError as exc:
                log.error("tensorboard events not closed: %s", exc)
    if lines.pending:
        raise RuntimeError(f"{len(lines.pending)} metrics records could not be written to "
                           f"{path}: {node.status.get('warning')}")
    return {"written": lines.written, "given_up": lines.dropped}
