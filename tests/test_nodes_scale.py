"""``run.py scale RUN env_runner 2`` (issue 11 item 5): in every shipped training graph it either
keeps the run going or is refused with one line before anything changes. It used to answer
``{"replicas": 2}`` on the DQN graph, whose replay store then crash-looped on env ids 4-7."""

from __future__ import annotations

import os

import pytest

import nodes  # noqa: F401 - registers the node kinds and their graph checks
from pipeline import graph as graphlib
from pipeline.cli import UsageError
from pipeline.commands import _check_scaled
from tests.pipeline_harness import ROOT

TRAINING = ["dqn_cartpole", "dqn_cartpole_per", "ppo_cartpole", "sac_pendulum", "td3_pendulum",
            "sac_halfcheetah", "ppo_halfcheetah"]
# Graphs whose replay store is sized for one runner: a second one is refused.
REFUSED = {"dqn_cartpole", "dqn_cartpole_per", "sac_pendulum", "td3_pendulum", "sac_halfcheetah"}


def graph(name: str) -> str:
    return os.path.join(ROOT, "graphs", f"{name}.yaml")


@pytest.mark.parametrize("name", TRAINING)
def test_a_second_env_runner_is_refused_exactly_where_replay_cannot_take_it(name):
    loaded = graphlib.load(graph(name))
    if name in REFUSED:
        with pytest.raises(ValueError, match=r"^scale of env_runner to 2 refused: nodes\."
                                             r"replay_store\.config\.num_environments: is "):
            _check_scaled(loaded, "env_runner", 2)
    else:
        _check_scaled(loaded, "env_runner", 2)


@pytest.fixture
def live(live_runs):
    return lambda name, *overrides: live_runs(graph(name), *overrides)


@pytest.mark.timeout(600)
def test_refused_scale_changes_nothing_and_the_run_goes_on(live):
    run = live("dqn_cartpole", "nodes.evaluator.config.stop_at_return=null",
               "nodes.learner.config.num_env_steps=8000")
    run.wait_ready()
    with pytest.raises(UsageError, match="scale of env_runner to 2 refused"):
        run.command("scale", node="env_runner", replicas=2)
    status = run.command("status")["nodes"]
    assert "env_runner.1" not in status and status["replay_store.0"]["restarts"] == 0
    assert run.finish(500) == 0, run.stderr
    assert run.summary()["nodes"]["learner.0"]["status"]["env_steps"] >= 8000


@pytest.mark.timeout(600)
def test_scaled_on_policy_graph_keeps_training_with_both_runners(live):
    run = live("ppo_cartpole", "nodes.evaluator.config.stop_at_return=null",
               "nodes.learner.config.num_env_steps=30000")
    run.wait_ready()
    assert run.command("scale", node="env_runner", replicas=2)["replicas"] == 2
    run.wait_ready("env_runner")
    # Both runners' episodes are reported, and the learner keeps going to its budget.
    run.wait_for_message("metrics", lambda m: m.source == "env_runner.1")
    assert run.finish(500) == 0, run.stderr
    summary = run.summary()["nodes"]
    assert summary["learner.0"]["status"]["env_steps"] >= 30000
    assert summary["env_runner.1"]["status"]["steps"] > 0
