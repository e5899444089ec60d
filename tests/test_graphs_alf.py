"""The OAC, QR-SAC, TAAC and PPG graphs (and SAC's on BipedalWalker, TAAC's baseline) through
the real multi-process pipeline.

CI runs each reference graph for a short budget (the smoke runs): every node starts, the
algorithm's rollout info crosses unroller, replay and learner, the learner trains (PPG: an
auxiliary phase too), an evaluation comes back, and nothing is lost on a reliable topic. The
runs to a threshold take minutes and are marked ``slow``.
"""

from __future__ import annotations

import pytest

import nodes.messages  # noqa: F401 - registers the RL message types for the taps
from tests.test_graphs_training import assert_accounting, assert_smoke_run, graph, learned


@pytest.fixture
def live(live_runs):
    def start(name, *overrides, seed=0):
        return live_runs(graph(name), *overrides, seed=seed)

    return start


# A short off-policy run: few random steps, sampling soon, an evaluation every 1000 steps.
SHORT_OFF_POLICY = (
    "agent.algorithm.initial_random_steps=500",
    "nodes.replay_store.config.min_size_to_sample=500",
    "nodes.learner.config.num_env_steps=2000",
    "nodes.evaluator.config.eval_interval=1000",
    "nodes.evaluator.config.num_eval_episodes=1",
    "nodes.evaluator.config.stop_at_return=null",
    "nodes.learner.config.metrics_interval_s=0.01")
SMOKE = {
    "oac_halfcheetah": SHORT_OFF_POLICY,
    "qrsac_halfcheetah": SHORT_OFF_POLICY,
    "sac_bipedalwalker": SHORT_OFF_POLICY,
    # Later settings win: smaller batches of windows and a shorter run for TAAC's costly update.
    "taac_bipedalwalker": (*SHORT_OFF_POLICY, "nodes.learner.config.mini_batch_size=64",
                           "nodes.learner.config.num_env_steps=1500"),
    # Three unrolls of 32 x 64 steps, an auxiliary phase after the second.
    "ppg_minatar": (
        "agent.algorithm.aux_interval=2",
        "nodes.learner.config.num_env_steps=6144",
        "nodes.evaluator.config.eval_interval=2048",
        "nodes.evaluator.config.num_eval_episodes=2",
        "nodes.evaluator.config.stop_at_return=null",
        # Metrics after every update: a run of three updates can end before a 5 s period.
        "nodes.learner.config.metrics_interval_s=0.01"),
}
# What only that algorithm's update reports: its own loss reached the learner's metrics.
OWN_METRICS = {"oac_halfcheetah": {"loss/critic", "alpha"},
               "qrsac_halfcheetah": {"loss/critic", "alpha"},
               "sac_bipedalwalker": {"loss/critic", "alpha"},
               "taac_bipedalwalker": {"entropy/switch", "switch_prob", "alpha/switch"},
               "ppg_minatar": {"aux/kl", "aux/aux_value", "loss/pg"}}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", sorted(SMOKE))
def test_graph_smoke_run(live, name):
    run = live(name, *SMOKE[name])
    assert_smoke_run(run, OWN_METRICS[name])


@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("name,threshold,budget", [
    ("oac_pendulum", -200, 20_000),
    ("qrsac_pendulum", -200, 20_000),
    ("taac_pendulum", -200, 20_000),
])
def test_graph_reaches_threshold(live, name, threshold, budget):
    run, _ = learned(lambda seed: live(name, seed=seed), threshold, budget, 1150)
    assert_accounting(run)
