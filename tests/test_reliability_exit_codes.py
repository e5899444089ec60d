"""Exit codes tell the truth: 0 only for the stop condition or a stop asked for; a run that
ends at ``duration_s`` without it, or lost a node for good, exits 1 with one line saying why."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.pipeline_harness import ROOT, LiveRun, alive, node_pids

DEMO = os.path.join(ROOT, "graphs", "demo_counter.yaml")


def _last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


@pytest.mark.timeout(120)
def test_duration_without_the_stop_condition_exits_1(tmp_path):
    run = LiveRun(str(tmp_path / "run"), DEMO, "nodes.source.config.count=0",
                  "nodes.sink.config.expected=0", "run.duration_s=3")
    try:
        assert run.finish(100) == 1, run.stderr
        assert _last_line(run.stderr) == (
            "error: the run reached duration_s=3 before its stop condition (sink finished)")
        assert "Traceback" not in run.stderr
    finally:
        run.kill()


@pytest.mark.timeout(120)
def test_a_node_whose_restart_cannot_start_ends_the_run_with_1(tmp_path):
    run = LiveRun(str(tmp_path / "run"), DEMO, "nodes.source.config.count=0",
                  "nodes.sink.config.expected=0", "run.duration_s=100")
    try:
        run.wait_ready()
        pid = run.command("status")["nodes"]["transformer.0"]["pid"]
        launch = os.path.join(run.run_dir, "launch")
        shutil.rmtree(launch)
        with open(launch, "w") as f:  # a restart cannot write its launch spec any more
            f.write("not a directory")
        os.kill(pid, signal.SIGKILL)
        assert run.finish(100) == 1, run.stderr
        last = _last_line(run.stderr)
        assert last.startswith("error: node transformer.0 could not be restarted: "
                               "NotADirectoryError"), last
        assert not [p for p in node_pids(run.run_dir) if alive(p)]
    finally:
        run.kill()


CRASH_LOOP = """
name: crash_loop
topics:
  numbers: {delivery: reliable}
nodes:
  source:
    kind: demo_source
    config: {count: 0}
    publishes: [numbers]
  broken:
    kind: "tests.crashing_node:run"
    subscribes: [numbers]
    restart: {policy: always, max_failures: 3, window_s: 60, backoff_s: 0.1}
run:
  grace_s: 15
"""


@pytest.mark.timeout(120)
def test_a_crash_loop_ends_the_run_promptly(tmp_path):
    graph = tmp_path / "crash.yaml"
    graph.write_text(CRASH_LOOP)
    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, "run.py", "run", str(graph), "--run-dir",
                             str(run_dir), "--quiet"], cwd=ROOT, capture_output=True,
                            text=True, timeout=100)
    ended = time.time()
    assert result.returncode == 1, result.stderr
    assert _last_line(result.stderr).startswith("error: node broken.0 failed 3 times")
    with open(run_dir / "events.jsonl") as f:
        events = [json.loads(line) for line in f]
    detected = max(e["t"] for e in events if e["topic"] == "supervisor.broken.exited")
    # The producer cannot drain into a group that is gone: it is not given grace_s (15 s).
    assert ended - detected < 6, ended - detected


@pytest.mark.timeout(120)
def test_restarts_back_off_exponentially(tmp_path):
    """Each restart of a failing node waits backoff_s, doubling per failure in the window: a
    node that fails at once is not relaunched in a tight loop."""
    graph = tmp_path / "crash.yaml"
    graph.write_text(CRASH_LOOP.replace("max_failures: 3, window_s: 60, backoff_s: 0.1",
                                        "max_failures: 4, window_s: 60, backoff_s: 0.4"))
    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, "run.py", "run", str(graph), "--run-dir",
                             str(run_dir), "--quiet"], cwd=ROOT, capture_output=True,
                            text=True, timeout=100)
    assert result.returncode == 1, result.stderr
    with open(run_dir / "events.jsonl") as f:
        events = [json.loads(line) for line in f]
    exits = [e["t"] for e in events if e["topic"] == "supervisor.broken.exited"]
    restarts = [e["t"] for e in events if e["topic"] == "supervisor.broken.restarted"]
    assert len(exits) == 4 and len(restarts) == 3, events
    waits = [r - e for e, r in zip(exits, restarts, strict=False)]
    for n, wait in enumerate(waits):
        assert wait >= 0.4 * 2 ** n * 0.95, waits  # 0.4, 0.8, 1.6 s
