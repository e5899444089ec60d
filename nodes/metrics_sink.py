"""metrics_sink: every metric to ``metrics.jsonl``, TensorBoard event files and optionally W&B.

One JSON object per message: wall time, source, env steps and the values; ``run.py plot`` reads
the JSON lines. TensorBoard gets every number as a scalar (a plain ``simple_value``, which
every reader shows, ``EventAccumulator.Scalars`` included) with env steps as the step axis,
``charts/env_steps_per_s`` (the largest env-step count the messages carry, over their send
times), and the run's ``graph.yaml``: whole as the text ``config/graph.yaml``, its ``agent:``
section as hyperparameters (the HParams tab). With ``wandb: {project: ...}`` (the ``[wandb]``
extra) the same series and the graph go to Weights & Biases (``WANDB_MODE=offline`` keeps
them in ``RUN_DIR/wandb/``); a W&B that cannot start is a status ``warning``, not a failure.

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
import hashlib
import importlib.util
import json
import logging
import os
import time
from dataclasses import dataclass, field

import yaml

from nodes.messages import Metrics
from pipeline.ports import Port, Ports
from typedconfig import ConfigError

log = logging.getLogger(__name__)

RATE_TAG = "charts/env_steps_per_s"
INSTALL_WANDB = "pip install -e '.[wandb]'"


@dataclass(frozen=True)
class WandbConfig:
    project: str = field(metadata={"doc": "the W&B project"})
    entity: str | None = field(default=None, metadata={"doc": "team or user (default: yours)"})
    name: str | None = field(default=None, metadata={
        "doc": "the run's name (default: <graph name>/<run directory's name>)"})
    group: str | None = field(default=None, metadata={"doc": "a W&B group for related runs"})


@dataclass(frozen=True)
class Config:
    filename: str = field(default="metrics.jsonl", metadata={"doc": "in the run directory"})
    tensorboard: bool = field(default=True, metadata={"doc": "also write event files"})
    retry_s: float = field(default=5.0, metadata={
        "doc": "retry period while the file cannot be written", "minimum": 0.01})
    pending_max: int = field(default=100_000, metadata={
        "doc": "records kept while the file cannot be written", "minimum": 1})
    rate_interval_s: float = field(default=5.0, metadata={
        "doc": "env steps/s is charted once per this many seconds", "minimum": 0.001})
    wandb: WandbConfig | None = field(default=None, metadata={
        "doc": "also log to Weights & Biases: {project: ...} (the [wandb] extra)"})


def validate(config: Config) -> None:
    """Checked at graph load: W&B logging needs the wandb package."""
    if config.wandb is not None and importlib.util.find_spec("wandb") is None:
        raise ConfigError("wandb", f"needs the wandb package: {INSTALL_WANDB}")


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


class EnvStepRate:
    """Env steps/s: the largest env-step count the messages carried, over their send times,
    one figure per ``interval_s`` (a message's sender stamps it, so a backlog delivered at
    once still gives the rate at which the steps were made)."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self.steps = 0
        self.mark: tuple[float, int] | None = None  # (send time, env steps) of the last figure

    def update(self, env_steps: int, sent_at: float) -> float | None:
        self.steps = max(self.steps, env_steps)
        if self.mark is None:
            self.mark = (sent_at, self.steps)
            return None
        t0, s0 = self.mark
        if sent_at - t0 < self.interval_s:
            return None
        self.mark = (sent_at, self.steps)
        return (self.steps - s0) / (sent_at - t0)


class EventFile:
    """TensorBoard event files through TensorBoard's own writer (not torch's: this process
    never imports torch). Numbers go as scalars (``simple_value``), not as the tensors
    ``tensorboard.summary.Writer`` writes, which ``EventAccumulator.Scalars`` does not show."""

    def __init__(self, logdir: str):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.file = EventFileWriter(logdir, flush_secs=10)  # seen live within 10 s

    def scalars(self, values: dict, step: int, wall_time: float) -> None:
        from tensorboard.compat.proto import summary_pb2

        self._add(summary_pb2.Summary(value=[
            summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
            for tag, value in values.items()]), step, wall_time)

    def graph(self, graph: dict, text: str) -> None:
        """The run's graph.yaml as text, its agent section as hyperparameters."""
        from tensorboard.plugins.hparams import summary_v2 as hparams
        from tensorboard.plugins.text import summary_v2 as texts

        code = "".join(f"    {line}\n" for line in text.splitlines())  # markdown: verbatim
        self._add(texts.text_pb("config/graph.yaml", code), 0, time.time())
        agent = graph.get("agent")
        if isinstance(agent, dict):
            self._add(hparams.hparams_pb(flat_hparams(agent)), 0, time.time())

    def _add(self, summary, step: int, wall_time: float) -> None:
        from tensorboard.compat.proto import event_pb2

        self.file.add_event(event_pb2.Event(wall_time=wall_time, step=step, summary=summary))

    def close(self) -> None:
        self.file.close()


def flat_hparams(section: dict, prefix: str = "") -> dict:
    """``{algorithm: {name: dqn, lr: 0.1}}`` -> ``{"algorithm.name": "dqn", "algorithm.lr":
    0.1}``; values HParams cannot hold (lists, null) as their YAML text."""
    out = {}
    for key, value in section.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_hparams(value, f"{name}."))
        elif isinstance(value, bool | int | float | str):
            out[name] = value
        else:
            out[name] = yaml.safe_dump(value, default_flow_style=True).strip()
    return out


class WandbLog:
    """The same series to Weights & Biases, env steps as their x axis. A resumed or restarted
    sink continues the same W&B run (its id comes from the run directory)."""

    def __init__(self, config: WandbConfig, run_dir: str, graph: dict):
        import wandb

        run_dir = os.path.abspath(run_dir)
        self.run = wandb.init(
            project=config.project, entity=config.entity, group=config.group,
            name=config.name or f"{graph.get('name', 'run')}/{os.path.basename(run_dir)}",
            id=hashlib.sha1(run_dir.encode()).hexdigest()[:16], resume="allow",
            dir=run_dir, config=graph)
        self.run.define_metric("env_steps")
        self.run.define_metric("*", step_metric="env_steps")

    def log(self, values: dict, env_steps: int) -> None:
        self.run.log({**values, "env_steps": env_steps})

    def close(self) -> None:
        self.run.finish()


def _read_graph(run_dir: str) -> tuple[dict, str]:
    """The run's graph.yaml (what run.py resolved and wrote), as data and as text."""
    try:
        with open(os.path.join(run_dir, "graph.yaml")) as f:
            text = f.read()
        return yaml.safe_load(text) or {}, text
    except (OSError, yaml.YAMLError) as exc:
        log.warning("no graph.yaml for the hyperparameters: %s", exc)
        return {}, ""


async def run(config: Config, node, ready) -> dict:
    bus = node.bus
    metrics = bus.subscriber("metrics")
    run_dir = node.info.run_dir
    path = os.path.join(run_dir, config.filename)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lines = JsonLines(path, node.status, config.pending_max)
    graph, graph_text = _read_graph(run_dir)
    writer = None
    if config.tensorboard:
        writer = EventFile(os.path.join(run_dir, "tensorboard"))
        if graph_text:
            writer.graph(graph, graph_text)
    wandb = None
    if config.wandb is not None:
        try:  # in a thread: it takes seconds, and the node answers heartbeats meanwhile
            wandb = await asyncio.to_thread(WandbLog, config.wandb, run_dir, graph)
        except Exception as exc:  # noqa: BLE001 - metrics go on to the files; say why not W&B
            node.status["warning"] = f"not logging to W&B: {type(exc).__name__}: {exc}"
            log.error("%s", node.status["warning"])
    rate = EnvStepRate(config.rate_interval_s)
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
            values = {k: v for k, v in msg.values.items()
                      if isinstance(v, int | float) and not isinstance(v, bool)}
            per_s = rate.update(msg.env_steps, envelope.sent_at)
            if per_s is not None:
                values[RATE_TAG] = per_s
            if writer is not None:
                try:
                    writer.scalars(values, msg.env_steps, envelope.sent_at)
                except OSError as exc:  # the JSON lines are the record; say why these stop
                    log.error("tensorboard events not written: %s", exc)
            if wandb is not None:
                wandb.log(values, msg.env_steps)
    finally:
        retrying.cancel()
        lines.flush()
        if writer is not None:
            try:
                writer.close()
            except OSError as exc:
                log.error("tensorboard events not closed: %s", exc)
        if wandb is not None:
            await asyncio.to_thread(wandb.close)
    if lines.pending:
        raise RuntimeError(f"{len(lines.pending)} metrics records could not be written to "
                           f"{path}: {node.status.get('warning')}")
    return {"written": lines.written, "given_up": lines.dropped}
