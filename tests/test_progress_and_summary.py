"""What a user reads of a run at a glance: the progress line (env steps of the budget, env
steps/s, ETA, the latest and best eval return, in 80 columns; a new line every 10 s when stderr
is not a terminal) and the end-of-run block (why it ended, best return and where its policy
is, env steps, wall time), also shown by ``status`` and ``monitor`` of a finished run.

The line and the block read generic status keys (pipeline/ knows no RL): the real-process
tests use two small node kinds of this module that report them as the learner and the
evaluator do."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from pipeline.monitor import WIDTH, Progress, format_summary
from tests.pipeline_harness import ROOT, LiveRun, idle_demo_graph
from tests.test_pipeline_processes import CRASH_LOOP as PROCESS_CRASH_LOOP

# --- the progress line, from statuses as the supervisor reports them ----------------------------


def _status(uptime: float, nodes: dict) -> dict:
    return {"graph": "g", "run_dir": "runs/g/1", "uptime_s": uptime,
            "nodes": {name: {"state": state, "restarts": 0, "status": st}
                      for name, (state, st) in nodes.items()}}


def _rl_nodes(steps: int, eval_return=None, best=None, learner_state="running") -> dict:
    """Nodes as a DQN graph reports them, with every number their status has."""
    evaluator = {"env_steps": max(0, steps - 1000)}
    if eval_return is not None:
        evaluator.update(eval_return=eval_return, best_return=best, best_dir="runs/g/1/best")
    return {
        "env_runner.0": ("running", {"steps": steps // 4, "stepping_s": 12.5, "waiting_s": 3.1,
                                     "env_step_cpu_s": 9.9}),
        "unroller.0": ("running", {"env_steps": steps, "epsilon": 0.05, "version": 77}),
        "replay_store.0": ("running", {"inserted": steps, "sampled": 3 * steps}),
        "learner.0": (learner_state, {"iteration": steps // 2, "env_steps": steps - 50,
                                      "env_steps_target": 50_000, "version": 77}),
        "evaluator.0": ("running", evaluator),
        "metrics_sink.0": ("running", {"written": 1234}),
        "checkpointer.0": ("running", {"checkpoints": 2}),
    }


def test_the_line_leads_with_steps_rate_eta_and_returns_in_80_columns():
    progress = Progress()
    first = progress.line(_status(10.0, _rl_nodes(2_300)))
    assert first == "[0:10] steps 2300/50k 4% -/s ETA - | eval -"
    line = progress.line(_status(20.0, _rl_nodes(12_300, 321.43, 400.2)))
    # 10,000 env steps in 10 s: 1000/s; 37,700 to go: 37 s.
    assert line == "[0:20] steps 12.3k/50k 24% 1000/s ETA 0:37 | eval 321.4 best 400.2"
    assert len(line) <= WIDTH


def test_the_rate_is_over_the_last_ten_seconds():
    progress = Progress()
    for t, steps in [(0, 0), (5, 50_000), (10, 51_000), (15, 52_000), (20, 53_000)]:
        line = progress.line(_status(t, {"learner.0": ("running", {
            "env_steps": steps, "env_steps_target": 1_000_000})}))
    assert " 200/s " in line  # 2,000 env steps over 10 s, not the start's burst


def test_the_eta_is_the_duration_left_when_that_comes_first():
    progress = Progress(duration_s=60)
    progress.line(_status(10.0, _rl_nodes(1_000)))
    line = progress.line(_status(20.0, _rl_nodes(2_000)))  # 100/s: the budget in 8 min
    assert "ETA 0:40" in line


def test_the_widest_figures_still_fit_and_a_node_not_running_is_named():
    progress = Progress()
    progress.line(_status(99_000.0, _rl_nodes(123_456_789, -12345.6, -1234.5)))
    nodes = _rl_nodes(223_456_789, -12345.6, -1234.5, learner_state="backoff")
    nodes["learner.0"][1]["env_steps_target"] = 999_000_000
    line = progress.line(_status(99_010.0, nodes))
    # The figures fit; what does not fit (the node not running) is cut from the end.
    assert line == ("[27:30:10] steps 223.46M/999M 22% 10M/s ETA 1:17 | eval -12346 best -1234"
                    " | learner.0 backoff")
    assert len(line.rsplit(" | ", 1)[0]) <= WIDTH


def test_a_budget_before_the_first_step_and_the_end_of_a_run():
    progress = Progress()
    nodes = {"learner.0": ("running", {"env_steps_target": 50_000}),
             "env_runner.0": ("starting", {})}
    assert progress.line(_status(1.0, nodes)) == \
        "[0:01] steps 0/50k 0% -/s ETA - | eval - | env_runner.0 starting"
    # A finished evaluator's result says what it reached: its latest evaluation, newer than
    # the eval_return of its last status.
    nodes = _rl_nodes(25_000, 122.9, 300.0)
    nodes["evaluator.0"][1].update(reached=493.3, best_return=493.3)
    line = progress.line(_status(11.0, nodes), ending=True)
    assert line.endswith(" | eval 493.3 best 493.3 | stopping"), line


def test_a_graph_without_env_steps_shows_its_nodes_numbers():
    line = Progress().line(_status(3.0, {"source.0": ("running", {"sent": 12_000}),
                                         "sink.0": ("running", {"received": 11_000})}))
    assert line == "[0:03] source.0:running sent=12k | sink.0:running received=11k"


# --- the end-of-run block -------------------------------------------------------------------------


def _summary(reason, node=None, failure=None, **ended) -> dict:
    summary = _status(75.3, _rl_nodes(50_000, 480.0, 500.0, learner_state="finished"))
    summary["nodes"]["learner.0"]["status"]["env_steps"] = 50_000
    summary["nodes"]["evaluator.0"]["status"]["reached"] = 500.0
    summary["failure"] = failure
    summary["ended"] = {"reason": reason, "node": node, "duration_s": 600, "stop_when":
                        ["learner", "evaluator"], **ended}
    return summary


@pytest.mark.parametrize("summary,headline", [
    (_summary("stop condition", "learner.0"),
     "run ended: budget reached (learner.0 finished 50,000 env steps)"),
    (_summary("stop condition", "evaluator.0"),
     "run ended: threshold reached (evaluator.0 finished at 500.0)"),
    (_summary("duration"), "run ended: duration_s=600 reached (run.on_duration: stop)"),
    (_summary("duration", stop_when=[]),
     "run ended: duration_s=600 reached (the graph's stop condition)"),
    (_summary("stop requested"), "run stopped: run.py stop"),
    (_summary("signal SIGINT"), "run stopped: Ctrl-C (SIGINT)"),
    (_summary("signal SIGTERM"), "run stopped: SIGTERM"),
    (_summary("failure", failure="node learner.0 failed 5 times within 60s: boom"),
     "run failed in node learner.0: the error below"),
    (_summary("duration", failure="the run reached duration_s=600 before its stop condition"),
     "run failed: duration_s=600 reached before the stop condition (the error below)"),
])
def test_the_block_says_why_the_run_ended(summary, headline):
    lines = format_summary(summary).splitlines()
    assert lines == [headline,
                     "  best eval return  500.0",
                     "  best policy       runs/g/1/best",
                     "  env steps         50,000 of 50,000",
                     "  wall time         1:15 (664 env steps/s)",
                     "  run directory     runs/g/1"]


# --- real runs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _CounterConfig:
    target: int = 5000
    release: str = ""  # it finishes at its target once this file exists


async def counter(config: _CounterConfig, node, ready):
    """Counts env steps as a learner does, with its budget in its status."""
    node.status["env_steps_target"] = config.target
    ready()
    steps = 0
    while not node.stopping.is_set():
        steps = min(config.target, steps + 50)
        node.status["env_steps"] = steps
        if steps == config.target and os.path.exists(config.release):
            return {"env_steps": steps}
        with contextlib.suppress(TimeoutError):  # the pace of a learner, not a synchronization
            await asyncio.wait_for(node.stopping.wait(), 0.05)
    return {"env_steps": steps}


counter.Config = _CounterConfig


async def judge(config, node, ready):
    """Reports evaluations as the evaluator does, then waits to be stopped."""
    best_dir = os.path.join(node.info.run_dir, "best")
    node.status.update(env_steps=0, eval_return=321.4, best_return=400.2, best_dir=best_dir)
    ready()
    await node.stopping.wait()
    return {"best": 400.2, "best_dir": best_dir}


COUNTING = """
name: counting
nodes:
  counter:
    kind: "tests.test_progress_and_summary:counter"
    config: {{target: 5000, release: "{release}"}}
  judge:
    kind: "tests.test_progress_and_summary:judge"
run:
  stop_when: [counter]
  duration_s: 300
"""


@pytest.mark.timeout(180)
def test_a_run_prints_progress_lines_to_a_pipe_and_its_summary_at_the_end(tmp_path):
    release = tmp_path / "release"
    graph = tmp_path / "graph.yaml"
    graph.write_text(COUNTING.format(release=release))
    run_dir = str(tmp_path / "run")
    proc = subprocess.Popen([sys.executable, "run.py", "run", str(graph), "--run-dir", run_dir],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in proc.stderr:  # stderr is a pipe: a new line every 10 s, no \r
            lines.append(line)
            if line.startswith("[0:"):
                break
        progress = lines[-1].rstrip("\n")
        assert progress.startswith("[0:1"), "".join(lines)  # at 10 s
        assert "\r" not in "".join(lines)
        assert len(progress) <= WIDTH
        # Measured every second: the first line, at 10 s, has a rate and an ETA.
        assert "/5000 " in progress and "-/s" not in progress and "ETA -" not in progress
        assert progress.endswith(" | eval 321.4 best 400.2"), progress
        release.touch()
        _, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, rest
    best = os.path.join(run_dir, "best")
    block = _block(rest)
    assert block[:4] == ["run ended: budget reached (counter.0 finished 5,000 env steps)",
                         "  best eval return  400.2",
                         f"  best policy       {best}",
                         "  env steps         5,000 of 5,000"], rest
    assert block[4].startswith("  wall time ") and block[4].endswith(" env steps/s)")
    assert float(block[4].split()[2]) >= 10, block[4]  # it ran past the first progress line
    assert block[5:] == [f"  run directory     {run_dir}"]

    # The finished run: status and monitor show its summary.json instead of "no live run".
    for command in ("status", "monitor"):
        shown = subprocess.run([sys.executable, "run.py", command, run_dir], cwd=ROOT,
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith(
            "run ended: budget reached (counter.0 finished 5,000 env steps)\n"), shown.stdout
        assert f"  best policy       {best}\n" in shown.stdout
        assert "counter.0" in shown.stdout and "finished" in shown.stdout
    raw = subprocess.run([sys.executable, "run.py", "status", run_dir, "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    ended = json.loads(raw.stdout)["ended"]
    assert ended["reason"] == "stop condition" and ended["node"] == "counter.0"
    assert ended["exit_code"] == 0


def _idle(tmp_path, duration: float = 300, more: str = "") -> LiveRun:
    """The demo graph with nothing to send: it ends by duration_s or a stop."""
    graph = tmp_path / "graph.yaml"
    graph.write_text(idle_demo_graph("idle", f"run:\n  stop_when: [sink]\n"
                                             f"  duration_s: {duration}\n{more}\n"))
    return LiveRun(str(tmp_path / "run"), str(graph))


def _block(stderr: str) -> list[str]:
    lines = stderr.strip().splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("run "))
    return lines[start:]


@pytest.mark.timeout(120)
def test_on_duration_stop_makes_duration_a_time_budget(tmp_path):
    run = _idle(tmp_path, duration=2, more="  on_duration: stop")
    try:
        assert run.finish(100) == 0, run.stderr
    finally:
        run.kill()
    block = _block(run.stderr)
    assert block[0] == "run ended: duration_s=2 reached (run.on_duration: stop)", run.stderr
    assert block[-1] == f"  run directory     {run.run_dir}"
    assert run.summary()["ended"]["exit_code"] == 0


@pytest.mark.timeout(120)
def test_on_duration_fail_is_the_default_and_its_error_is_the_last_line(tmp_path):
    run = _idle(tmp_path, duration=2)
    try:
        assert run.finish(100) == 1, run.stderr
    finally:
        run.kill()
    block = _block(run.stderr)
    assert block[0] == ("run failed: duration_s=2 reached before the stop condition (the "
                        "error below)"), run.stderr
    assert block[-1] == ("error: the run reached duration_s=2 before its stop condition (sink "
                         "finished)")
    assert run.summary()["ended"]["exit_code"] == 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how,headline", [("stop", "run stopped: run.py stop"),
                                          ("ctrl-c", "run stopped: Ctrl-C (SIGINT)")])
def test_a_stop_asked_for_is_said_so(tmp_path, how, headline):
    run = _idle(tmp_path)
    try:
        run.wait_ready()
        if how == "stop":
            assert run.cli("stop", run.run_dir).returncode == 0
        else:
            run.interrupt()
        assert run.finish(100) == 0, run.stderr
    finally:
        run.kill()
    assert _block(run.stderr)[0] == headline, run.stderr


# The crash-looping graph of the process tests, given up after two failures here.
CRASH_LOOP = PROCESS_CRASH_LOOP.replace("max_failures: 3", "max_failures: 2")


@pytest.mark.timeout(120)
def test_a_failure_names_the_node_and_ends_with_the_error(tmp_path):
    graph = tmp_path / "graph.yaml"
    graph.write_text(CRASH_LOOP)
    result = subprocess.run([sys.executable, "run.py", "run", str(graph), "--run-dir",
                             str(tmp_path / "run"), "--quiet"], cwd=ROOT, capture_output=True,
                            text=True, timeout=100)
    assert result.returncode == 1, result.stderr
    block = _block(result.stderr)
    assert block[0] == "run failed in node broken.0: the error below", result.stderr
    assert block[-1].startswith("error: node broken.0 failed 2 times")
