"""The control plane: every run.py command has a supervisor handler, every request gets a
reply (errors as data, with a code) within the client's timeout, checkpoints on demand."""

from __future__ import annotations

import os
import time

import pytest

from pipeline import cli
from pipeline.commands import control_commands
from tests.pipeline_harness import ROOT, LiveRun, idle_demo_graph, probe_run

DEMO = os.path.join(ROOT, "graphs", "demo_counter.yaml")

WITH_EXTRAS = idle_demo_graph("control_plane", """
  idle:
    kind: "tests.pipeline_harness:idle_node"
  checkpointer:
    kind: checkpointer
    config: {services: [], interval_s: 3600, final: false}
run:
  ready_timeout_s: 600
""")


def test_every_cli_command_has_a_supervisor_handler():
    choices = set(cli._parser()._subparsers._group_actions[0].choices)
    # Commands a package above pipeline/ registers (nodes: play, export) run in run.py itself.
    assert set(cli.COMMANDS) | set(cli._EXTRA) == choices | {"node"}
    remote = set(cli.COMMANDS) - cli.LOCAL_COMMANDS
    assert remote <= control_commands(), remote - control_commands()
    assert "wait_ready" in control_commands()  # used by scripts and tests


@pytest.fixture
def extras(tmp_path):
    graph = tmp_path / "graph.yaml"
    graph.write_text(WITH_EXTRAS)
    run = LiveRun(str(tmp_path / "run"), str(graph))
    yield run
    run.kill()


@pytest.mark.timeout(120)
def test_every_request_gets_a_reply_with_a_code_in_time(extras):
    run = extras
    run.wait_ready("sink")
    # A handler that times out (the idle node is never ready): answered before the client's
    # own timeout, as data.
    started = time.monotonic()
    with pytest.raises(cli.CommandFailed, match=r"\(timeout\)") as err:
        run.command("wait_ready", node="idle", timeout=3)
    assert time.monotonic() - started < 3
    assert "did not answer" not in str(err.value)
    # A handler that raises something unexpected still answers, with its reason.
    with pytest.raises(cli.CommandFailed, match=r"AttributeError.*\(internal\)"):
        run.command("swap", node="sink", set=[5], timeout=10)
    with pytest.raises(cli.UsageError, match="unknown command 'nope'"):
        run.command("nope", timeout=10)
    with pytest.raises(cli.UsageError, match="unexpected keyword"):
        run.command("status", verbose=True, timeout=10)
    with pytest.raises(cli.UsageError, match="unknown node 'ghost'"):
        run.command("restart", node="ghost", timeout=10)
    # The command-line tool turns these into one line and the exit code.
    timed_out = run.cli("restart", run.run_dir, "ghost")
    assert timed_out.returncode == 2 and timed_out.stderr.count("\n") == 1, timed_out.stderr
    assert run.command("status")["nodes"]["sink.0"]["state"] == "running"
    run.interrupt()
    assert run.finish(60) == 0, run.stderr
    ended = run.cli("status", run.run_dir)  # an ended run: its summary.json
    assert ended.returncode == 0, ended.stderr
    assert ended.stdout.startswith("run stopped: Ctrl-C (SIGINT)\n"), ended.stdout
    os.remove(os.path.join(run.run_dir, "summary.json"))  # as a run killed with SIGKILL leaves it
    started = time.monotonic()
    gone = run.cli("status", run.run_dir)  # at once, not after the client's timeout
    assert gone.returncode == 2 and "no live run" in gone.stderr, gone.stderr
    assert time.monotonic() - started < 5


@pytest.mark.timeout(120)
def test_run_py_checkpoint_writes_one_now_and_prints_its_path(extras):
    run = extras
    run.wait_ready("checkpointer")
    first = run.cli("checkpoint", run.run_dir)
    assert first.returncode == 0, first.stderr
    path = first.stdout.strip()
    assert os.path.dirname(path) == os.path.join(run.run_dir, "checkpoints"), path
    assert os.path.exists(os.path.join(path, "COMPLETE"))
    second = run.cli("checkpoint", run.run_dir).stdout.strip()
    assert second != path and os.path.exists(os.path.join(second, "COMPLETE"))
    assert sorted([path, second]) == [path, second]  # names sort in the order written
    run.interrupt()
    assert run.finish(60) == 0, run.stderr


@pytest.mark.timeout(120)
def test_checkpoint_without_a_checkpointer_is_one_line(tmp_path):
    run = LiveRun(str(tmp_path / "run"), DEMO, "nodes.source.config.count=0",
                  "nodes.sink.config.expected=0")
    try:
        run.wait_ready()
        result = run.cli("checkpoint", run.run_dir)
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and "no running node writes checkpoints" in \
            result.stderr, result.stderr
        run.interrupt()
        assert run.finish(60) == 0, run.stderr
    finally:
        run.kill()


@pytest.mark.timeout(120)
def test_a_swap_whose_replacement_fails_is_refused_and_the_run_goes_on(tmp_path):
    run = LiveRun(str(tmp_path / "run"), DEMO, "nodes.source.config.count=0",
                  "nodes.sink.config.expected=0")
    try:
        run.wait_ready()
        before = run.command("status")["nodes"]["transformer.0"]["pid"]
        swap = run.cli("swap", run.run_dir, "transformer", "--kind", "tests.crashing_node:run")
        assert swap.returncode == 1, swap.stderr
        assert swap.stderr.count("\n") == 1, swap.stderr
        assert "swap of transformer.0 refused, it keeps running: node transformer.0 exited " \
               "with code 1 before it was ready: RuntimeError: deliberate failure" in swap.stderr
        nodes = run.command("status")["nodes"]
        assert nodes["transformer.0"]["pid"] == before
        assert nodes["transformer.0"]["state"] == "running"
        run.wait_for_origin("doubled", 1000)  # data still flows through the old one
        run.interrupt()
        assert run.finish(60) == 0, run.stderr
    finally:
        run.kill()


@pytest.mark.timeout(120)
def test_a_node_stopped_for_its_swap_hears_why_and_no_signal_races_the_reason(tmp_path):
    """A store or learner stopped for its replacement leaves its state for it only if it
    knows that is why it stops (``node.replaced``). The reason comes in the Stop message; a
    SIGTERM carries none, and one sent with the message won that race under load (a swapped
    replay store handed nothing over). A connected node is signalled only if the message did
    not stop it."""
    run = probe_run(tmp_path, "stop_probe")
    try:
        run.wait_ready()
        old = run.command("status")["nodes"]["probe.0"]["pid"]
        swap = run.cli("swap", run.run_dir, "probe")
        assert swap.returncode == 0, swap.stderr
        with open(os.path.join(run.run_dir, f"stopped.{old}")) as f:
            assert f.read() == "swapped"
        assert not os.path.exists(os.path.join(run.run_dir, f"signalled.{old}"))
        run.interrupt()
        assert run.finish(60) == 0, run.stderr
    finally:
        run.kill()
