"""``run.py scale RUN env_runner N`` works or refuses (issue 11, item 5): a scale whose env ids
a replay store cannot hold is refused with one line before anything changes and the run goes
on; an on-policy graph takes the new runner. Real run.py and processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.pipeline_harness import ROOT
from tests.test_nodes_graph_checks import line_of


@pytest.fixture
def live(live_runs):
    return lambda graph, *overrides: live_runs(os.path.join(ROOT, "graphs", graph), *overrides)


def _steps(run, instance: str) -> int:
    return run.command("status")["nodes"].get(instance, {}).get("status", {}).get("steps", 0)


def _wait_steps(run, instance: str, more_than: int, timeout_s: float = 120) -> int:
    """Wait until ``instance`` has stepped past ``more_than``: looked at as each metrics message
    arrives, so the wait is on events, not a polling period."""
    try:
        run.wait_for_message("metrics", lambda _m: _steps(run, instance) > more_than,
                             timeout_s=timeout_s)
    except TimeoutError:
        raise AssertionError(f"{instance} did not pass {more_than} steps in {timeout_s}s") \
            from None
    return _steps(run, instance)


@pytest.mark.timeout(300)
def test_graph_load_refuses_runners_beyond_the_replay_store(tmp_path):
    out = subprocess.run([sys.executable, "run.py", "check", "graphs/dqn_cartpole.yaml",
                          "--set", "nodes.env_runner.replicas=2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0, out.stderr
    line = line_of(os.path.join(ROOT, "graphs", "dqn_cartpole.yaml"), "num_environments:")
    assert "num_environments" in out.stderr and f"dqn_cartpole.yaml:{line}:" in out.stderr


@pytest.mark.timeout(300)
# One discrete and one continuous off-policy graph: TD3's replay store is SAC's.
@pytest.mark.parametrize("graph", ["dqn_cartpole.yaml", "sac_pendulum.yaml"])
def test_scale_beyond_the_replay_store_is_refused_and_the_run_goes_on(live, graph):
    # No early stop: a greedy DQN evaluation can reach 475 a few thousand env steps in (CI saw
    # the run end, its env runner already stopped, between the refusal and the status check).
    run = live(graph, "nodes.evaluator.config.stop_at_return=null")
    run.wait_ready()
    before = _wait_steps(run, "env_runner.0", 0)
    out = run.cli("scale", run.run_dir, "env_runner", "2")
    assert out.returncode != 0
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "refused" in out.stderr and "num_environments" in out.stderr
    status = run.command("status")["nodes"]
    assert "env_runner.1" not in status
    stopped = {k: n["state"] for k, n in status.items() if n["state"] != "running"}
    assert not stopped, f"{stopped}; {run.ended_because()}"
    _wait_steps(run, "env_runner.0", before)  # still stepping
    run.interrupt()
    assert run.finish() == 0, run.stderr


@pytest.mark.timeout(300)
def test_scale_of_an_on_policy_graph_adds_a_runner_and_down_again(live):
    # No early stop: PPO reaches 475 within seconds, and the run must outlive both scales.
    run = live("ppo_cartpole.yaml", "nodes.evaluator.config.stop_at_return=null",
               "nodes.learner.config.num_env_steps=10000000")
    run.wait_ready()
    out = run.cli("scale", run.run_dir, "env_runner", "2")
    assert out.returncode == 0, out.stderr
    _wait_steps(run, "env_runner.1", 1000)  # its env ids 8-15 are being stepped
    learner = run.command("status")["nodes"]["learner.0"]
    assert learner["state"] == "running" and learner["restarts"] == 0
    out = run.cli("scale", run.run_dir, "env_runner", "1")
    assert out.returncode == 0, out.stderr
    status = run.command("status")["nodes"]
    assert "env_runner.1" not in status
    assert all(n["state"] == "running" and n["restarts"] == 0 for n in status.values()), status
    run.interrupt()
    assert run.finish() == 0, run.stderr
