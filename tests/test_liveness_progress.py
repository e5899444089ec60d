"""The progress watchdog (issue 37, item 2): a graph in which nothing moves for
``run.stall_timeout_s`` is reported with the nodes that wait and on what, the waiting nodes
are restarted, and a stall again after that ends the run with exit 1 and that line.

Real run.py and processes with node kinds from tests/liveness_nodes.py: a consumer that stops
taking input while it stays alive (as an evicted consumer that never rejoined did), and a
request nobody will ever answer (as a learner's batch the replay store cannot fill).
"""

from __future__ import annotations

import asyncio
import json
import os
import types

import pytest

from pipeline import graph as graphlib
from pipeline.liveness import ProgressWatch
from tests.pipeline_harness import ROOT, LiveRun

DEMO = os.path.join(ROOT, "graphs", "demo_counter.yaml")
SERVICE_GRAPH = """\
name: stall_service
nodes:
  server: {kind: "tests.liveness_nodes:silent_server", serves: [answer]}
  asker:
    kind: "tests.liveness_nodes:asker"
    calls: [answer]
    restart: {policy: always, max_failures: 5, window_s: 60}
run:
  stop_when: [asker]
  stall_timeout_s: 2
  duration_s: 120
"""


def _events(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "events.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.timeout(180)
def test_a_consumer_that_stops_taking_input_is_restarted_and_the_run_completes(tmp_path):
    n = 20_000
    run = LiveRun(str(tmp_path / "run"), DEMO, f"nodes.source.config.count={n}",
                  f"nodes.sink.config.expected={n}",
                  "nodes.transformer.kind=tests.liveness_nodes:stalling_transformer",
                  "nodes.transformer.config={stall_after: 3000}",
                  "nodes.transformer.subscribes=[numbers]", "nodes.transformer.publishes=[doubled]",
                  "run.stall_timeout_s=3",
                  "run.duration_s=150")
    try:
        assert run.finish(170) == 0, run.stderr
        assert "nothing moved for 3s (run.stall_timeout_s): " in run.stderr, run.stderr
        assert "transformer.0 waits on topic 'numbers' from source" in run.stderr, run.stderr
        result = run.result()
        assert result["missing"] == 0 and result["duplicates"] == 0, result
        assert result["unique"] == n, result
        stalled = [e for e in _events(run.run_dir) if e["topic"].endswith(".stalled")]
        assert any(e["topic"] == "supervisor.transformer.stalled" for e in stalled), stalled
    finally:
        run.kill()


@pytest.mark.timeout(120)
def test_an_unsatisfiable_request_stops_the_run_with_the_waiting_node_named(tmp_path):
    graph = tmp_path / "stall.yaml"
    graph.write_text(SERVICE_GRAPH)
    run = LiveRun(str(tmp_path / "run"), str(graph))
    try:
        assert run.finish(100) == 1, run.stderr
        # Restarted once (the stall after the restart ends the run), named with its wait.
        assert "the graph stalled again: nothing moved for 2s (run.stall_timeout_s): asker.0 " \
               "waits on service 'answer' of server" in run.stderr, run.stderr
        topics = [e["topic"] for e in _events(run.run_dir)]
        assert topics.count("supervisor.asker.stalled") == 1, topics
        assert "supervisor.asker.restarted" in topics, topics
    finally:
        run.kill()


def _watcher(name: str, heartbeat: dict, kind: str = "demo_sink"):
    done = asyncio.Event()
    ready = asyncio.Event()
    ready.set()
    inc = types.SimpleNamespace(exited=done, ready=ready, finished=False, heartbeat=heartbeat,
                                launch=types.SimpleNamespace(incarnation=f"{name}.0~1"))
    return types.SimpleNamespace(current=inc, kind=kind, node=name, instance=f"{name}.0")


def test_progress_is_reliable_messages_and_declared_status_not_lossy_traffic_or_restarts():
    graph = graphlib.load(DEMO)
    watch = ProgressWatch(graph, stall_timeout_s=2.0)
    sink = _watcher("sink", {"topics": {"sub:doubled": {"received": 10}}})
    assert watch.observe([sink], 1.0) is None  # first sight: a baseline, 1 s still
    sink.current.heartbeat = {"topics": {"sub:doubled": {"received": 10},
                                         "pub:metrics": {"sent": 99}}}
    waiting = watch.observe([sink], 1.0)  # 2 s still: lossy traffic is not progress
    assert waiting is not None and watch.stalls == 1
    assert [(w.instance, what) for w, what in waiting] == [
        ("sink.0", ["topic 'doubled' from transformer"])]  # and who should feed it
    # A restart (a new incarnation that restored 500) is not movement either ...
    sink.current.launch.incarnation = "sink.0~2"
    sink.current.heartbeat = {"topics": {"sub:doubled": {"received": 500}}}
    assert watch.observe([sink], 1.0) is None
    assert watch.observe([sink], 1.0) is not None and watch.stalls == 2
    # ... a message consumed is, and it forgives the stalls.
    sink.current.heartbeat = {"topics": {"sub:doubled": {"received": 501}}}
    assert watch.observe([sink], 1.0) is None and watch.stalls == 0
