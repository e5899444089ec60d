"""The metrics sink's TensorBoard files read back with TensorBoard's own reader: every number a
scalar at its env steps, an env-steps/s chart, the run's graph.yaml as text and its agent
section as hyperparameters; with ``wandb: {project: ...}`` the same series in an offline W&B
run (skipped without the ``[wandb]`` extra). Real processes: ``run.py`` runs a graph of an
emitter and the sink."""

from __future__ import annotations

import asyncio
import glob
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from tests.pipeline_harness import ROOT

COUNT, STEPS, EVERY_S = 20, 1000, 0.05

GRAPH = """
name: sink_test
agent:
  env_id: CartPole-v1
  algorithm: {name: dqn, learning_rate: 0.0023, fc_layer_params: [64, 64]}
topics:
  metrics: {delivery: reliable, hwm: 1000}
nodes:
  emitter:
    kind: "tests.test_metrics_sink:emit"
    publishes: [metrics]
  metrics_sink:
    kind: metrics_sink
    config: {rate_interval_s: 0.2%s}
run:
  stop_when: [emitter]
  duration_s: 120
"""


@dataclass(frozen=True)
class _EmitConfig:
    count: int = COUNT
    steps: int = STEPS  # env steps between two messages
    every_s: float = EVERY_S  # the emitter's pace: at most steps / every_s env steps/s


async def emit(config: _EmitConfig, node, ready):
    """Metrics as a learner sends them: numbers at growing env steps, and a flag and a text
    that are not numbers to chart."""
    from nodes.messages import Metrics

    out = node.bus.publisher("metrics")
    ready()
    for i in range(1, config.count + 1):
        await out.send(Metrics(node.info.instance, config.steps * i, {
            "test/value": float(i), "test/count": i, "test/flag": True, "test/text": "x"}))
        await asyncio.sleep(config.every_s)  # the pace of a producer, not a synchronization
    return {"sent": config.count}


emit.Config = _EmitConfig


def _run(tmp_path, sink_config: str = "", env: dict | None = None) -> str:
    graph = tmp_path / "graph.yaml"
    graph.write_text(GRAPH % sink_config)
    run_dir = str(tmp_path / "run")
    result = subprocess.run([sys.executable, "run.py", "run", str(graph), "--run-dir", run_dir,
                             "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=150,
                            env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stderr
    return run_dir


@pytest.mark.timeout(180)
def test_tensorboard_scalars_rate_and_hyperparameters(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    from nodes.metrics_sink import RATE_TAG

    run_dir = _run(tmp_path)
    events = EventAccumulator(os.path.join(run_dir, "tensorboard"))
    events.Reload()
    values = events.Scalars("test/value")
    assert [(e.step, e.value) for e in values] == [(STEPS * i, float(i))
                                                    for i in range(1, COUNT + 1)]
    assert [e.value for e in events.Scalars("test/count")] == [float(i)
                                                               for i in range(1, COUNT + 1)]
    assert "test/flag" not in events.Tags()["scalars"]
    assert "test/text" not in events.Tags()["scalars"]

    # The emitter sends at most STEPS env steps per EVERY_S: the rate is positive and no more.
    rates = events.Scalars(RATE_TAG)
    assert rates, events.Tags()
    assert all(0 < e.value <= STEPS / EVERY_S * 1.01 for e in rates), rates

    text = events.Tensors("config/graph.yaml")[0].tensor_proto.string_val[0].decode()
    assert "learning_rate: 0.0023" in text and "name: sink_test" in text
    start = plugin_data_pb2.HParamsPluginData.FromString(
        events.SummaryMetadata("_hparams_/session_start_info").plugin_data.content)
    hparams = start.session_start_info.hparams
    assert hparams["env_id"].string_value == "CartPole-v1"
    assert hparams["algorithm.name"].string_value == "dqn"
    assert hparams["algorithm.learning_rate"].number_value == pytest.approx(0.0023)
    assert hparams["algorithm.fc_layer_params"].string_value == "[64, 64]"


@pytest.mark.timeout(180)
@pytest.mark.skipif(importlib.util.find_spec("wandb") is None,
                    reason="needs the [wandb] extra (pip install -e '.[wandb]')")
def test_wandb_offline_gets_the_same_series(tmp_path):
    run_dir = _run(tmp_path, ", wandb: {project: conduit-test}",
                   env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    runs = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*"))
    assert len(runs) == 1, os.listdir(run_dir)
    history, config = _wandb_history(runs[0])
    assert config["agent"]["algorithm"]["learning_rate"] == 0.0023  # the graph, as W&B config
    values = [(row["env_steps"], row["test/value"]) for row in history if "test/value" in row]
    assert values == [(STEPS * i, float(i)) for i in range(1, COUNT + 1)]
    assert any("charts/env_steps_per_s" in row for row in history)
    assert not any("test/flag" in row or "test/text" in row for row in history)


def _wandb_history(run: str) -> tuple[list[dict], dict]:
    """The rows an offline W&B run logged and its config, read from its transaction log."""
    from wandb.proto import wandb_internal_pb2

    (path,) = glob.glob(os.path.join(run, "run-*.wandb"))
    rows, config = [], {}
    for data in _log_records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
        elif kind == "run":
            config.update({item.key: json.loads(item.value_json)
                           for item in record.run.config.update})
    return rows, config


def _log_records(path: str):
    """The records of W&B's transaction log: LevelDB's log format (32 KiB blocks; each record
    a 7-byte head, crc32 u32, length u16 and type u8: full, first, middle, last) after a
    7-byte file head (":W&B", magic u16, version u8)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", data[:7]
    block, pos, parts = 32 * 1024, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a head is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        payload, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            yield payload
        elif kind in (2, 3):
            parts = (parts if kind == 3 else b"") + payload
        elif kind == 4:
            yield parts + payload
        elif kind == 0 and length == 0:  # zero padding to the block's end
            pos += block - pos % block if pos % block else 0


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None,
                    reason="wandb is installed: nothing to refuse")
def test_wandb_without_the_extra_is_one_line_at_load(tmp_path):
    graph = tmp_path / "graph.yaml"
    graph.write_text(GRAPH % ", wandb: {project: p}")
    result = subprocess.run([sys.executable, "run.py", "check", str(graph)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {graph}:14: nodes.metrics_sink.config.wandb: needs the wandb package: "
        "pip install -e '.[wandb]'"]
