"""Bring your own environment (docs/custom.md): a Gymnasium env in a module of the user's,
named by the graph's ``imports:`` or as ``module:EnvId``, checked at load like a built-in id,
and stepped by every node process however it started (forks, fresh interpreters).

The learning test trains DQN on ``examples/corridor.py`` through ``examples/corridor_dqn.yaml``
and restarts the env runner on the way: the replacement is a fresh interpreter, which finds
``Corridor-v0`` only because its launch spec carries the graph's ``imports:``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

import nodes.messages  # noqa: F401 - registers the RL message types for the taps
from tests.pipeline_harness import ROOT

GRAPH = os.path.join(ROOT, "examples", "corridor_dqn.yaml")
RUN_PY = os.path.join(ROOT, "run.py")
with open(GRAPH) as _f:
    ENV_ID_LINE = next(i for i, line in enumerate(_f, 1) if line.strip().startswith("env_id:"))


def check(graph: str, *overrides: str, cwd: str = ROOT) -> subprocess.CompletedProcess:
    """``run.py check`` in a fresh interpreter: what a module registers there is only what
    this graph made it import (in this process, an earlier test may have imported it)."""
    args = [sys.executable, RUN_PY, "check", graph]
    for item in overrides:
        args += ["--set", item]
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("overrides,expected", [
    ((), "ok"),
    # Gymnasium's module:EnvId form, without imports:
    (("imports=[]", "agent.env_id=examples.corridor:Corridor-v0"), "ok"),
    # Neither: the id is not registered, and the error says how to register it.
    (("imports=[]",), "agent.env_id: unknown environment id 'Corridor-v0': "),
    (("imports=[]", "agent.env_id=corridor:Corridor-v0"),
     f"examples/corridor_dqn.yaml:{ENV_ID_LINE}: agent.env_id: cannot import module "
     f"'corridor': No module named 'corridor'"),
    (("imports=[examples.corridor, corridor]",),
     "imports.1: cannot import module 'corridor': No module named 'corridor'"),
    (("imports=[examples/corridor.py]",),
     "imports.0: expected a module name such as mypackage.envs, got 'examples/corridor.py'"),
])
def test_an_env_of_your_own_is_checked_at_load(overrides, expected):
    result = check("examples/corridor_dqn.yaml", *overrides)
    if expected == "ok":
        assert (result.returncode, result.stdout.strip()) == (0, "ok"), result.stderr
        return
    assert result.returncode == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], lines
    assert lines[0].startswith("error: examples/corridor_dqn.yaml:"), lines


@pytest.mark.timeout(120)
def test_modules_in_the_working_directory_are_importable(tmp_path):
    """A user runs Conduit's run.py from their own project: their modules there import, as
    with ``python -m``, though run.py's own directory is elsewhere."""
    shutil.copy(os.path.join(ROOT, "examples", "corridor.py"), tmp_path / "mycorridor.py")
    with open(GRAPH) as f:
        text = f.read().replace("imports: [examples.corridor]", "imports: [mycorridor]")
    (tmp_path / "g.yaml").write_text(text)
    assert check("g.yaml", cwd=str(tmp_path)).stdout.strip() == "ok"
    result = check("g.yaml", "imports=[]", "agent.env_id=mycorridor:Corridor-v0",
                   cwd=str(tmp_path))
    assert result.stdout.strip() == "ok", result.stderr


def eval_returns(run) -> list[tuple[int, float]]:
    return [(m["env_steps"], m["eval/return"]) for m in run.metrics() if "eval/return" in m]


@pytest.mark.timeout(300)
def test_dqn_learns_the_corridor_through_an_env_runner_restart(live_runs):
    # The learner's budget is out of reach: only the evaluator's stop_at_return (1.0) ends
    # the run. The evaluator is held (SIGSTOP) while the runner is restarted, longer than
    # one heartbeat period: a heartbeat timeout must not kill it meanwhile.
    run = live_runs(GRAPH, "nodes.learner.config.num_env_steps=10000000",
                    "run.heartbeat_timeout_s=300")
    run.wait_ready()
    first = run.command("status")["nodes"]["env_runner.0"]["incarnation"]
    run.wait_for_message("experience", lambda m: True)  # the corridor is being walked
    # Why hold the evaluator: DQN walks this corridor within a few thousand env steps, a few
    # seconds, and the evaluator then ends the run; the restart must come before that, so
    # nothing can end the run until the restarted runner has stepped.
    evaluator = run.command("status")["nodes"]["evaluator.0"]["pid"]
    os.kill(evaluator, signal.SIGSTOP)
    try:
        restart = run.cli("restart", run.run_dir, "env_runner")
        assert restart.returncode == 0, restart.stderr
        # Only the new incarnation's tap is listed now: its episodes come from a fresh
        # interpreter that imported examples.corridor from its launch spec.
        run.wait_for_message("metrics", lambda m: m.source == "env_runner.0")
    finally:
        with contextlib.suppress(ProcessLookupError):  # a run that failed: its own report
            os.kill(evaluator, signal.SIGCONT)
    assert run.finish(240) == 0, run.stderr

    summary = run.summary()
    assert summary["failure"] is None, summary["failure"]
    nodes_ = summary["nodes"]
    assert nodes_["env_runner.0"]["incarnation"] != first
    assert nodes_["env_runner.0"]["status"]["steps"] > 0  # the new incarnation's own
    assert nodes_["evaluator.0"]["state"] == "finished"  # stop_at_return, not the budget
    returns = eval_returns(run)
    assert max(r for _, r in returns) >= 1.0, returns
    with open(os.path.join(run.run_dir, "events.jsonl")) as f:
        events = [json.loads(line)["topic"] for line in f]
    # Restarted by the command, once; nothing crashed.
    assert [t for t in events if t.endswith((".restarted", ".failed"))] == [
        "supervisor.env_runner.restarted"], events
    for instance, info in nodes_.items():
        for topic, stats in (info.get("topics") or {}).items():
            assert stats.get("gaps", 0) == 0, (instance, topic, stats)
    produced = nodes_["unroller.0"]["status"]["env_steps"]
    assert nodes_["replay_store.0"]["status"]["inserted"] == produced
