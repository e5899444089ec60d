"""The asynchronous graphs (APPO, IMPALA on MinAtar Breakout) through the real multi-process
pipeline: a short run each (CI), in which the runner never waits for parameters, the learner
trains on V-trace targets and measures the lag, and nothing is lost on a reliable topic. The
graphs start an unroll only once the learner took the last one (``max_queued_unrolls: 0``),
so no unroll is older than one batch but for its first row (the previous unroll's bootstrap
row): a lag above two batches means the queue ran ahead of the learner. A batch is one version,
or ``num_epochs`` where the learner publishes between epochs (``appo_minatar``, just in time).
"""

from __future__ import annotations

import pytest

import nodes.messages  # noqa: F401 - registers the RL message types for the taps
from pipeline import graph as graphlib
from tests.test_graphs_training import assert_smoke_run, graph

# Four unrolls of 32 x 64 steps; metrics after every update (a run this short can end before
# a 5 s period); an evaluation after the second unroll.
SMOKE = ("nodes.learner.config.num_env_steps=8192",
         "nodes.evaluator.config.eval_interval=4096",
         "nodes.evaluator.config.num_eval_episodes=2",
         "nodes.evaluator.config.stop_at_return=null",
         "nodes.learner.config.metrics_interval_s=0.01")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["appo_minatar", "impala_minatar"])
def test_async_graph_smoke_run(live_runs, name):
    run = live_runs(graph(name), *SMOKE)
    metrics = assert_smoke_run(run, {"vtrace/rho", "lag/versions_max"})
    lag_max = [m["lag/versions_max"] for m in metrics if "lag/versions_max" in m]
    spec = graphlib.load(graph(name))
    learner = spec.configs["learner"]
    per_batch = learner.agent.algorithm.num_epochs if learner.publish_between_epochs else 1
    assert max(lag_max) <= 2 * per_batch, lag_max
