"""A metrics directory that stops taking writes mid-run (issue 11, item 6): the metrics sink says
so on the terminal, keeps the records, retries, and once the directory is back the file holds
every record every node published, in order. Real run.py and processes.

Tests run as root, where permissions do not stop a write: the directory is swapped for a plain
file instead, so every open under it fails (NotADirectoryError), and swapped back."""

from __future__ import annotations

import json
import os

import pytest

from tests.pipeline_harness import ROOT, LiveRun
from tests.test_reliability_replay_restart import _wait


def _lines(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.mark.timeout(300)
def test_an_unwritable_metrics_directory_is_reported_retried_and_nothing_is_lost(tmp_path):
    run = LiveRun(str(tmp_path / "run"), os.path.join(ROOT, "graphs", "dqn_cartpole.yaml"),
                  "nodes.evaluator.config.stop_at_return=null",
                  "nodes.learner.config.num_env_steps=100000000",
                  "nodes.metrics_sink.config={filename: m/metrics.jsonl, retry_s: 0.5}",
                  "nodes.learner.config.metrics_interval_s=0.5")
    directory = os.path.join(run.run_dir, "m")
    try:
        run.wait_ready()
        _wait(run, lambda nodes: nodes["metrics_sink.0"].get("status", {}).get("written", 0) > 0,
              "the sink wrote nothing")
        os.rename(directory, directory + ".saved")
        with open(directory, "w"):
            pass  # a file where the directory was: every open under it fails
        broken = _wait(run, lambda nodes: "warning" in nodes["metrics_sink.0"]["status"],
                       "the sink did not report the unwritable directory")
        assert "NotADirectoryError" in broken["metrics_sink.0"]["status"]["warning"]
        written = broken["metrics_sink.0"]["status"]["written"]
        os.remove(directory)
        os.rename(directory + ".saved", directory)
        _wait(run, lambda nodes: "warning" not in nodes["metrics_sink.0"]["status"]
              and nodes["metrics_sink.0"]["status"]["written"] > written,
              "the sink did not write again")
        run.interrupt()
        assert run.finish() == 0, run.stderr
    finally:
        run.kill()
    assert "warning: metrics_sink.0: metrics not written" in run.stderr, run.stderr
    assert "metrics_sink.0: recovered" in run.stderr, run.stderr
    records = _lines(os.path.join(directory, "metrics.jsonl"))
    with open(os.path.join(run.run_dir, "summary.json")) as f:
        nodes = json.load(f)["nodes"]
    published = {name: node["topics"].get("pub:metrics", {}).get("sent", 0)
                 for name, node in nodes.items()}
    got = {name: sum(r["source"] == name for r in records) for name in published}
    assert got == published  # every record, none twice
    learner = [r["time"] for r in records if r["source"] == "learner.0"]
    assert learner == sorted(learner)  # in order
