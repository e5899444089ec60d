"""Training through the real multi-process graphs: learning, accounting, resume, faults.

CI runs DQN-CartPole to its threshold and a short stop/resume; the other learning runs and the
fault-injection runs take several minutes each and are marked ``slow``.
"""

from __future__ import annotations

import os
import signal

import pytest

import nodes.messages  # noqa: F401 - registers the RL message types for the taps
from tests.pipeline_harness import ROOT, LiveRun


def graph(name: str) -> str:
    return os.path.join(ROOT, "graphs", f"{name}.yaml")


@pytest.fixture
def live(live_runs):
    def start(name, *overrides, run_dir=None, resume=False, seed=0):
        return live_runs(None if resume else graph(name), *overrides, run_dir=run_dir,
                         resume=resume, seed=seed)

    return start


def eval_returns(run: LiveRun) -> list[tuple[int, float]]:
    return [(m["env_steps"], m["eval/return"]) for m in run.metrics() if "eval/return" in m]


def reached(run: LiveRun, threshold: float, budget: int) -> tuple[int, float] | None:
    return next(((s, r) for s, r in eval_returns(run) if r >= threshold and s <= budget), None)


def learned(start, threshold: float, budget: int, finish_s: float,
            seeds: tuple = (0, 1)) -> tuple[LiveRun, tuple[int, float]]:
    """The first of ``start(seed)``'s finished runs (every node's seed plus ``seed``) whose
    evaluation reaches ``threshold`` within ``budget`` env steps, and that evaluation.

    Why a second seed: an asynchronous graph does not repeat its env steps to the threshold,
    not even with the same seeds (DQN CartPole with an actor, seed 0, eight runs: 18k-42k), so
    now and then a run misses the budget, and one such miss made CI red (2026-11-27). A graph
    that does not learn misses with both seeds."""
    misses = []
    for seed in seeds:
        run = start(seed)
        assert run.finish(finish_s) == 0, run.stderr
        hit = reached(run, threshold, budget)
        if hit is not None:
            return run, hit
        misses.append((seed, eval_returns(run)))
    raise AssertionError(f"no seed reached {threshold} within {budget} env steps: {misses}")


def assert_accounting(run: LiveRun) -> None:
    """Zero gaps on every reliable topic; every step the runners produced reached replay."""
    summary = run.summary()
    assert summary["failure"] is None, summary["failure"]
    for instance, info in summary["nodes"].items():
        for topic, stats in (info.get("topics") or {}).items():
            assert stats.get("gaps", 0) == 0, (instance, topic, stats)
            assert stats.get("malformed", 0) == 0, (instance, topic, stats)
    nodes = summary["nodes"]
    shards = [info for name, info in nodes.items() if name.startswith("replay_store.")]
    if shards:  # one store, or every shard of a sharded one
        producer = nodes.get("unroller.0") or nodes["actor.0"]  # whichever acted
        produced = producer["status"]["env_steps"]
        inserted = sum(info["status"]["inserted"] for info in shards)
        assert inserted == produced, (inserted, produced)


def assert_smoke_run(run: LiveRun, own_metrics: set[str]) -> list[dict]:
    """A short run of a reference graph finished cleanly, lost nothing, evaluated, and its
    algorithm's own figures (``own_metrics``) reached the learner's metrics; returns them."""
    assert run.finish(600) == 0, run.stderr
    assert_accounting(run)
    metrics = run.metrics()
    assert any("eval/return" in m for m in metrics), "no evaluation came back"
    seen = {k for m in metrics for k in m}
    assert own_metrics <= seen, sorted(seen)
    return metrics


@pytest.mark.timeout(1200)
def test_dqn_cartpole_reaches_475_through_the_graph(dqn_cartpole_learned):
    run, hit = dqn_cartpole_learned
    # Each evaluation says how long it took (a benchmark takes it off its training clock).
    evals = [m for m in run.metrics() if "eval/return" in m]
    assert all(0 < m["eval/seconds"] < 60 for m in evals), evals
    # No node was restarted: a learner whose sample replies are always there in time once
    # starved its own event loop, and the supervisor killed it for missing heartbeats.
    restarts = {name: info["restarts"] for name, info in run.summary()["nodes"].items()}
    assert not any(restarts.values()), restarts
    assert_accounting(run)
    assert_tensorboard_has(run, "eval/return", hit[1])


def assert_tensorboard_has(run: LiveRun, tag: str, value: float) -> None:
    """The metrics sink's event files hold what metrics.jsonl holds (TensorBoard reads them)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(os.path.join(run.run_dir, "tensorboard")).Reload()
    assert tag in events.Tags()["scalars"], events.Tags()  # scalars, as TensorBoard plots them
    values = [e.value for e in events.Scalars(tag)]
    assert any(abs(v - value) < 1e-3 for v in values), (values, value)


@pytest.mark.timeout(600)
def test_sigint_then_resume_continues_where_it_stopped(live, tmp_path):
    # The runners step CartPole fast: with the learner's default 5 s metrics a quick machine
    # reached the whole budget before the first report the stop waits for. Reports every
    # 0.2 s make the stop come at ~2,000 env steps on any machine, well inside the budget.
    budget = 12_000
    short = ("nodes.evaluator.config.stop_at_return=null",
             f"nodes.learner.config.num_env_steps={budget}", "nodes.checkpointer.config.interval_s=5",
             "nodes.learner.config.metrics_interval_s=0.2")
    first = live("dqn_cartpole", *short)
    stopped = first.interrupt_after_learning(2000)
    stop_steps = stopped["learner.0"]["status"]["env_steps"]
    stop_version = stopped["learner.0"]["status"]["version"]
    assert 2000 <= stop_steps < budget
    checkpoints = sorted(os.listdir(os.path.join(first.run_dir, "checkpoints")))
    assert checkpoints and all(c.startswith("ckpt-") for c in checkpoints)

    resumed = live("dqn_cartpole", run_dir=first.run_dir, resume=True)
    assert resumed.finish(500) == 0, resumed.stderr
    assert "resuming from" in resumed.stderr
    final = resumed.summary()["nodes"]
    assert final["learner.0"]["status"]["env_steps"] >= budget
    assert final["learner.0"]["status"]["version"] > stop_version
    # The replay store came back with its contents: it counts on from where it stopped.
    assert final["replay_store.0"]["status"]["inserted"] >= budget
    assert final["unroller.0"]["status"]["env_steps"] == final["replay_store.0"]["status"][
        "inserted"]
    # Over both runs: two unroller incarnations (named apart across the resume), both ended
    # cleanly, and every step they sent stored once.
    assert final["unroller.0"]["incarnation"] != stopped["unroller.0"]["incarnation"]
    ledger = resumed.summary()["ledger"]["experience"]
    assert ledger["publishers"] == ledger["publishers_closed"] == 2, ledger
    assert ledger["produced"] == ledger["consumers"]["replay_store"]["stored"], ledger


@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("name,threshold,budget", [
    ("ppo_cartpole", 475, 100_000),
    ("ppo_cartpole_novelocity", 475, 150_000),
    ("dqn_cartpole_per", 475, 50_000),
    ("dqn_cartpole_sharded", 475, 50_000),
    ("sac_pendulum", -200, 20_000),
    ("td3_pendulum", -200, 20_000),
])
def test_graph_reaches_threshold(live, name, threshold, budget):
    run, _ = learned(lambda seed: live(name, seed=seed), threshold, budget, 1150)
    assert_accounting(run)


@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("victim", ["env_runner", "unroller", "evaluator", "replay_store"])
def test_sac_pendulum_survives_kill_9(live, victim):
    run = live("sac_pendulum", "nodes.checkpointer.config.interval_s=10")
    run.wait_ready()
    # SAC usually reaches -200 near 4,000 steps: strike while it is still learning.
    run.wait_for_message("metrics", lambda m: m.env_steps >= 2000, timeout_s=300)
    pid = run.command("status")["nodes"][f"{victim}.0"]["pid"]
    os.kill(pid, signal.SIGKILL)
    assert run.finish(2300) == 0, run.stderr
    assert reached(run, -200, 20_000) is not None, eval_returns(run)
    restarted = run.summary()["nodes"][f"{victim}.0"]["restarts"]
    assert restarted >= 1
