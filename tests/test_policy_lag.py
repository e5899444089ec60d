"""Policy lag: measured per unroll by the learner, bounded by ``max_policy_lag`` (dropped and
counted), 0 in a lock-step graph and above 0 in an asynchronous one (real processes)."""

import json
import os
import subprocess
import sys

import numpy as np

from nodes._lag import PolicyLag

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_lag_in_versions_and_updates_per_row():
    lag = PolicyLag(publish_params_every=2, max_policy_lag=None)
    for version in range(6):
        lag.on_publish(version, iteration=2 * version)
    # Learner at version 5 (10 updates, 1 more since): rows acted by versions 3, 3, 4, 5.
    behind, updates = lag.lag([3, 3, 4, 5], learner_version=5, iteration=11)
    assert behind.tolist() == [2, 2, 1, 0]
    assert updates.tolist() == [5, 5, 3, 1]
    assert lag.admit([3, 3, 4, 5], 5, 11, env_steps=16, where="t")
    report = lag.report()
    assert report["lag/versions_min"] == 0 and report["lag/versions_max"] == 2
    assert report["lag/versions_mean"] == 1.25 and report["lag/updates_max"] == 5
    assert "lag/versions_mean" not in lag.report()  # a new period


def test_a_batch_older_than_the_bound_is_dropped_and_counted():
    lag = PolicyLag(publish_params_every=1, max_policy_lag=2)
    assert lag.admit([8, 9], learner_version=10, iteration=10, env_steps=8, where="t")
    assert not lag.admit([7, 9], learner_version=10, iteration=10, env_steps=8, where="t")
    assert not lag.admit([1], learner_version=10, iteration=10, env_steps=4, where="t")
    report = lag.report()
    assert report["lag/dropped_batches"] == 2 and report["lag/dropped_env_steps"] == 12
    assert report["lag/versions_max"] == 2  # only the admitted batch is measured
    assert lag.status()["lag_dropped_batches"] == 2


def test_a_learner_behind_its_data_counts_zero_and_unknown_versions_are_estimated():
    lag = PolicyLag(publish_params_every=4, max_policy_lag=0)
    behind, updates = lag.lag(np.array([12, 3]), learner_version=5, iteration=22)
    assert behind.tolist() == [0, 2]  # restored from an older checkpoint: not negative
    assert updates.tolist() == [0, 22 - 12]  # version 3 published after 3 * 4 updates
    assert lag.admit(None, 5, 22, 0, "t")  # a producer without versions is not judged


def _run(tmp_path, name: str, *sets: str) -> list[dict]:
    run_dir = str(tmp_path / name)
    cmd = [sys.executable, "run.py", "run", "graphs/ppo_cartpole.yaml", "--run-dir", run_dir,
           "--set", "nodes.learner.config.num_env_steps=6000",
           "--set", "nodes.learner.config.metrics_interval_s=0.01",
           "--set", "nodes.evaluator.config.eval_interval=100000",
           "--set", "nodes.unroller.config.unroll_length=16", *sum((["--set", s] for s in sets), [])]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _figures(records: list[dict], key: str) -> list[float]:
    out = []
    for r in records:
        values = r.get("metrics", r)
        if key in values:
            out.append(values[key])
    return out


def test_lock_step_has_no_lag_and_async_has_some_and_the_bound_drops(tmp_path):
    lock_step = _run(tmp_path, "lock", "nodes.unroller.config.max_unrolls_per_version=1")
    assert _figures(lock_step, "lag/versions_max"), "no lag figures in the learner's metrics"
    # Lock-step: only the row an unroll continues from (the previous unroll's bootstrap row,
    # acted before the learner trained on that unroll) is one version behind.
    assert max(_figures(lock_step, "lag/versions_max")) == 1
    assert max(_figures(lock_step, "lag/versions_mean")) <= 1 / 16 + 1e-9
    assert max(_figures(lock_step, "lag/dropped_batches")) == 0
    free = _run(tmp_path, "async", "nodes.unroller.config.max_unrolls_per_version=0",
                "nodes.learner.config.max_policy_lag=1")
    assert max(_figures(free, "lag/dropped_batches")) > 0
    assert max(_figures(free, "lag/versions_max")) == 1  # what was trained on obeyed the bound


def test_an_unroll_started_only_once_the_last_was_taken_halves_the_lag(tmp_path):
    """Asynchronous, one unroll queued at most (hwm 1): the runner collects an unroll ahead of
    the full queue, so the learner trains on unrolls two versions old. ``max_queued_unrolls:
    0`` starts each unroll only once the learner took the last one, with the parameters it
    published then: one version old (the bootstrap row, acted at the previous unroll's end, is
    the one row two behind)."""
    sets = ("nodes.unroller.config.max_unrolls_per_version=0", "topics.trajectories.hwm=1")
    queued = _run(tmp_path, "queued", *sets)
    fresh = _run(tmp_path, "fresh", *sets, "nodes.unroller.config.max_queued_unrolls=0")
    queued_means = _figures(queued, "lag/versions_mean")
    fresh_means = _figures(fresh, "lag/versions_mean")
    assert queued_means and fresh_means, "no lag figures in the learner's metrics"
    assert np.median(queued_means) >= 1.5  # the queue's extra unroll: the lag to remove
    assert np.median(fresh_means) <= 1.25
    assert max(_figures(fresh, "lag/versions_max")) <= 2


def test_just_in_time_unrolls_are_acted_by_a_policy_an_epoch_old_not_a_batch(tmp_path):
    """The learner publishes between its epochs (each a version, so lag counts epochs) with
    the time its batch has left; a just-in-time unroller starts each unroll about one
    unroll's time before the batch ends, with the freshest of those parameters. Learner-bound
    here (64 gradient steps per 128-step unroll): without the hold the unroll is acted by the
    policy of the batch before, about ``num_epochs`` (8) versions behind; with it, a few."""
    sets = ("nodes.unroller.config.max_unrolls_per_version=0", "topics.trajectories.hwm=1",
            "nodes.unroller.config.max_queued_unrolls=0", "agent.algorithm.num_epochs=8",
            "agent.algorithm.mini_batch_size=16", "nodes.learner.config.publish_between_epochs=true")
    eager = _run(tmp_path, "eager", *sets)
    held = _run(tmp_path, "held", *sets, "nodes.unroller.config.just_in_time=true")
    eager_means = _figures(eager, "lag/versions_mean")
    held_means = _figures(held, "lag/versions_mean")
    assert eager_means and held_means, "no lag figures in the learner's metrics"
    assert np.median(eager_means) >= 6, eager_means  # a batch of 8 epochs behind
    assert np.median(held_means) <= np.median(eager_means) / 2, (held_means, eager_means)
    assert max(_figures(held, "lag/dropped_batches")) == 0
