"""Multi-process integration: real ``run.py``, real node processes, real sockets."""

from __future__ import annotations

import functools
import os
import select
import signal
import subprocess
import sys

import pytest
import zmq

from pipeline import gcpolicy
from tests.pipeline_harness import ROOT, alive, node_pids, probe_run

GRAPH = os.path.join(ROOT, "graphs", "demo_counter.yaml")


def _counts(n: int) -> tuple[str, str]:
    return f"nodes.source.config.count={n}", f"nodes.sink.config.expected={n}"


@pytest.fixture
def live(live_runs):
    return functools.partial(live_runs, GRAPH)


def _assert_complete(result: dict, n: int, duplicates_allowed: bool = False) -> None:
    assert result["missing"] == 0, result
    assert result["unique"] == n, result
    assert result["gaps"] == 0, result
    assert result["malformed"] == 0, result
    assert result["wrong_values"] == 0, result
    if not duplicates_allowed:
        assert result["duplicates"] == 0, result


@pytest.mark.timeout(300)
def test_100k_messages_on_a_reliable_topic_arrive_complete(live):
    run = live(*_counts(100_000))
    assert run.finish() == 0, run.stderr
    _assert_complete(run.result(), 100_000)


@pytest.mark.timeout(300)
def test_kill_9_of_the_transformer_is_restarted_and_the_run_completes(live):
    n = 150_000
    run = live(*_counts(n))
    run.wait_ready()
    before = run.command("status")["nodes"]["transformer.0"]
    run.wait_for_origin("doubled", 20_000)
    os.kill(before["pid"], signal.SIGKILL)
    assert run.finish() == 0, run.stderr
    result = run.result()
    # The killed transformer's unacknowledged input is redelivered: at least once, none lost.
    _assert_complete(result, n, duplicates_allowed=True)
    assert len(result["by_instance"]) == 1  # same replica name across the restart
    with open(os.path.join(run.run_dir, "events.jsonl")) as f:
        assert "supervisor.transformer.restarted" in f.read()


@pytest.mark.timeout(300)
def test_swap_the_transformer_loses_and_duplicates_nothing(live):
    n = 150_000
    run = live(*_counts(n))
    run.wait_ready()
    run.wait_for_origin("doubled", 20_000)
    swap = run.cli("swap", run.run_dir, "transformer", "--set", "scale=3")
    assert swap.returncode == 0, swap.stderr
    assert run.finish() == 0, run.stderr
    result = run.result()
    _assert_complete(result, n)
    assert set(result["by_scale"]) == {"2", "3"}, result  # both handled part of the stream


@pytest.mark.timeout(300)
def test_monitors_never_block_the_graph(live):
    """A monitor printing a reliable topic, and a tap subscriber that never reads at all:
    the run still moves every message, because taps drop instead of blocking."""
    n = 100_000
    run = live(*_counts(n))
    run.wait_ready()
    taps = run.command("status")["topics"]["numbers"]["taps"]
    stalled = zmq.Context.instance().socket(zmq.SUB)
    stalled.setsockopt(zmq.LINGER, 0)
    stalled.setsockopt(zmq.RCVHWM, 1)
    for ep in taps:
        stalled.connect(ep)
    stalled.setsockopt(zmq.SUBSCRIBE, b"")
    monitor = subprocess.Popen([sys.executable, "run.py", "monitor", run.run_dir, "--topic",
                                "numbers", "--count", "20"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert run.finish() == 0, run.stderr
        out, err = monitor.communicate(timeout=60)
    finally:
        stalled.close(linger=0)
        monitor.kill()
    _assert_complete(run.result(), n)
    assert monitor.returncode == 0, err
    assert out.count("numbers ") >= 1, out[:500]


@pytest.mark.timeout(120)
def test_sigint_stops_every_node_and_exits_0(live):
    run = live("nodes.source.config.count=0", "nodes.sink.config.expected=0")
    run.wait_ready()
    pids = [info["pid"] for info in run.command("status")["nodes"].values()]
    assert all(alive(pid) for pid in pids)
    server = run.command("status")["forkserver"]["pid"]
    run.interrupt()
    assert run.finish(60) == 0, run.stderr
    assert not [pid for pid in node_pids(run.run_dir) if alive(pid)]
    assert not alive(server)


@pytest.mark.timeout(120)
def test_a_node_runs_at_its_nice_level(live):
    run = live("nodes.source.config.count=0", "nodes.sink.config.expected=0", "nodes.sink.nice=7")
    run.wait_ready()
    nodes = run.command("status")["nodes"]
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert os.getpriority(os.PRIO_PROCESS, nodes["sink.0"]["pid"]) == min(base + 7, 19)
    assert os.getpriority(os.PRIO_PROCESS, nodes["source.0"]["pid"]) == base


@pytest.mark.timeout(120)
def test_status_scale_and_bad_commands(live):
    run = live("nodes.source.config.count=0", "nodes.sink.config.expected=0")
    run.wait_ready()
    status = run.cli("status", run.run_dir)
    assert status.returncode == 0 and "transformer.0" in status.stdout
    scaled = run.cli("scale", run.run_dir, "transformer", "2")
    assert scaled.returncode == 0, scaled.stderr
    assert "transformer.1" in run.command("status")["nodes"]
    bad = run.cli("swap", run.run_dir, "transformer", "--set", "nope=1")
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "nope" in bad.stderr, bad.stderr
    unknown = run.cli("scale", run.run_dir, "nosuchnode", "2")
    assert unknown.returncode == 2 and "unknown node 'nosuchnode'" in unknown.stderr
    assert run.cli("stop", run.run_dir).returncode == 0
    assert run.finish(60) == 0, run.stderr


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
"""


@pytest.mark.timeout(120)
def test_a_crash_loop_stops_the_run_naming_the_node_and_its_log(tmp_path):
    graph = tmp_path / "crash.yaml"
    graph.write_text(CRASH_LOOP)
    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, "run.py", "run", str(graph), "--run-dir",
                             str(run_dir), "--quiet"], cwd=ROOT, capture_output=True,
                            text=True, timeout=100)
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: node broken.0 failed 3 times"), last
    assert "deliberate failure in broken.0" in last
    assert str(run_dir / "logs" / "broken.0.log") in last
    assert "Traceback" not in result.stderr
    assert not [pid for pid in node_pids(str(run_dir)) if alive(pid)]


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _wait_for_exit(pid: int, timeout_s: float = 60) -> None:
    """Block until a process that is not our child has exited (a pidfd turns readable)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        assert select.select([fd], [], [], timeout_s)[0], f"pid {pid} still alive"
    finally:
        os.close(fd)


@pytest.mark.timeout(180)
def test_nodes_are_forks_of_the_fork_server_and_outlive_its_death(live):
    run = live("nodes.source.config.count=0", "nodes.sink.config.expected=0")
    run.wait_ready()
    status = run.command("status")
    server = status["forkserver"]["pid"]
    before = {name: info["pid"] for name, info in status["nodes"].items()}
    assert {name: _parent(pid) for name, pid in before.items()} == dict.fromkeys(before, server)

    os.kill(server, signal.SIGKILL)
    for pid in before.values():  # nobody could reap them any more: the supervisor kills them
        _wait_for_exit(pid)
    run.wait_ready()  # the watchers restarted them, as fresh interpreters
    status = run.command("status")
    assert status["forkserver"]["alive"] is False
    for name, info in status["nodes"].items():
        assert info["pid"] != before[name] and info["restarts"] >= 1, (name, info)
        assert _parent(info["pid"]) == run.proc.pid, name
    run.interrupt()
    assert run.finish(60) == 0, run.stderr
    assert not [pid for pid in node_pids(run.run_dir) if alive(pid)]
    assert not alive(server)


@pytest.mark.timeout(120)
def test_a_node_process_collects_garbage_rarely_and_freezes_what_it_set_up(tmp_path):
    """pipeline.gcpolicy in a real node process: the young threshold raised at start, and
    everything made before ``ready()`` frozen out of the collector's scans."""
    run = probe_run(tmp_path, "gc_probe")
    try:
        run.wait_ready()
        assert run.cli("stop", run.run_dir).returncode == 0
        assert run.finish(60) == 0, run.stderr
        seen = run.summary()["nodes"]["probe.0"]["status"]  # the probe's summary
        assert seen["gc_threshold"] == [gcpolicy.YOUNG_THRESHOLD, *gcpolicy.OLDER_THRESHOLDS]
        assert seen["gc_frozen"] > 10_000  # the modules, the bus, the node's own state
    finally:
        run.kill()
