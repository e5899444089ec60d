"""The run directory: owned by one run at a time, checked at start, and checkpoints that are
verified before use and share no file with each other."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from nodes.checkpointer import write_checkpoint
from pipeline.wiring import latest_checkpoint
from tests.pipeline_harness import ROOT, LiveRun, idle_demo_graph

DEMO = os.path.join(ROOT, "graphs", "demo_counter.yaml")
IDLE = ("nodes.source.config.count=0", "nodes.sink.config.expected=0")

WITH_CHECKPOINTER = idle_demo_graph("checkpoints", """
  checkpointer:
    kind: checkpointer
    config: {services: [], interval_s: 0.2, final: false}
""")


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _run_py(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(ROOT, "run.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(120)
def test_a_second_run_py_on_a_live_run_directory_refuses_and_touches_nothing(tmp_path):
    run = LiveRun(str(tmp_path / "run"), DEMO, *IDLE)
    try:
        run.wait_ready()
        endpoints = _read(os.path.join(run.run_dir, "endpoints.json"))
        for args in (["run", "--resume", run.run_dir],
                     ["run", DEMO, "--run-dir", run.run_dir, "--set", IDLE[0]]):
            second = _run_py(*args)
            assert second.returncode == 2, second.stderr
            assert second.stderr.count("\n") == 1, second.stderr
            assert f"run directory {run.run_dir} is in use by another run.py (pid " \
                   f"{run.proc.pid})" in second.stderr
        assert _read(os.path.join(run.run_dir, "endpoints.json")) == endpoints
        assert run.cli("status", run.run_dir).returncode == 0  # its control socket still works
        assert run.cli("stop", run.run_dir).returncode == 0
        assert run.finish(60) == 0, run.stderr
    finally:
        run.kill()


def test_an_unusable_run_directory_is_one_line_and_exit_1(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = _run_py("run", DEMO, "--run-dir", str(blocker / "run"), "--quiet")
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"error: cannot use run directory {blocker / 'run'}")


def test_a_damaged_newest_checkpoint_is_skipped_and_no_two_share_a_file(tmp_path):
    root = str(tmp_path / "checkpoints")
    first = write_checkpoint(root, {"learner": {"w": torch.ones(3)},
                                    "replay_store": {"x": torch.arange(1000)}}, 100, 1)
    second = write_checkpoint(root, {"learner": {"w": torch.zeros(3)}}, 200, 2,
                              previous=first)
    carried = os.path.join(second, "replay_store.pt")
    assert os.stat(carried).st_ino != os.stat(os.path.join(first, "replay_store.pt")).st_ino
    assert latest_checkpoint(str(tmp_path)) == second
    with open(carried, "r+b") as f:  # truncated, e.g. by a full disk or a stray process
        f.truncate(100)
    lines = []
    assert latest_checkpoint(str(tmp_path), lines.append) == first
    assert lines == [f"skipping checkpoint {second}: replay_store.pt does not match its "
                     "content hash; using an older one"]
    # The older checkpoint was not damaged with it, and is what a new one carries over.
    state = torch.load(os.path.join(first, "replay_store.pt"), weights_only=True)
    assert torch.equal(state["x"], torch.arange(1000))
    with open(os.path.join(first, "COMPLETE"), "w") as f:
        f.write('{"files": {"learner.pt": "0')  # a marker cut short
    assert latest_checkpoint(str(tmp_path), lines.append) is None
    assert lines[-1] == f"skipping checkpoint {first}: its COMPLETE marker is unreadable " \
                        "(JSONDecodeError); using an older one"


def test_a_carried_component_that_changed_is_not_carried(tmp_path):
    root = str(tmp_path / "checkpoints")
    first = write_checkpoint(root, {"learner": {"w": torch.ones(3)},
                                    "replay_store": {"n": 5}}, 100, 1)
    with open(os.path.join(first, "replay_store.pt"), "r+b") as f:
        f.truncate(10)
    second = write_checkpoint(root, {"learner": {"w": torch.zeros(3)}}, 200, 2,
                              previous=first)
    assert sorted(os.listdir(second)) == ["COMPLETE", "learner.pt"]
    assert latest_checkpoint(str(tmp_path)) == second


@pytest.mark.timeout(180)
def test_resume_skips_a_damaged_newest_checkpoint_naming_it(tmp_path):
    graph = tmp_path / "graph.yaml"
    graph.write_text(WITH_CHECKPOINTER)
    run = LiveRun(str(tmp_path / "run"), str(graph))
    try:
        run.wait_ready()
        first = run.cli("checkpoint", run.run_dir).stdout.strip()
        newest = run.cli("checkpoint", run.run_dir).stdout.strip()
        run.interrupt()
        assert run.finish(60) == 0, run.stderr
        root = os.path.dirname(newest)
        newest = os.path.join(root, max(os.listdir(root)))
        os.truncate(os.path.join(newest, "COMPLETE"), 5)
        resumed = LiveRun(run.run_dir, None, resume=True)
        try:
            assert f"warning: skipping checkpoint {newest}: its COMPLETE marker is " \
                   "unreadable" in resumed.stderr
            assert f"resuming from {os.path.join(root, sorted(os.listdir(root))[-2])}" in \
                resumed.stderr
            assert first != newest
            resumed.interrupt()
            assert resumed.finish(60) == 0, resumed.stderr
        finally:
            resumed.kill()
    finally:
        run.kill()


@pytest.mark.timeout(180)
def test_a_checkpointer_that_cannot_write_says_so_on_the_terminal_and_retries(tmp_path):
    graph = tmp_path / "graph.yaml"
    graph.write_text(WITH_CHECKPOINTER)
    run = LiveRun(str(tmp_path / "run"), str(graph))
    try:
        run.wait_ready()
        assert run.cli("checkpoint", run.run_dir).returncode == 0
        checkpoints = os.path.join(run.run_dir, "checkpoints")
        os.rename(checkpoints, checkpoints + ".away")
        with open(checkpoints, "w") as f:  # writes fail (as root, chmod would not stop them)
            f.write("in the way")
        line = _next_line(run, "warning: checkpointer.0: checkpoint not written")
        assert "retrying every" in line
        os.unlink(checkpoints)
        os.rename(checkpoints + ".away", checkpoints)
        _next_line(run, "warning: checkpointer.0: recovered")
        run.interrupt()
        assert run.finish(60) == 0, run.stderr
    finally:
        run.kill()


def _next_line(run: LiveRun, start: str) -> str:
    for line in run.proc.stderr:  # blocks until the supervisor prints it
        run.stderr_lines.append(line)
        if line.startswith(start):
            return line
    raise AssertionError(f"no line starting with {start!r}:\n{run.stderr}")
