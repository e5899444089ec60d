"""The Atari graphs (PPO and APPO on Breakout, DQN on Pong) through the real multi-process
pipeline: a short run each, on ale-py's real emulator (CI installs it with the test extra;
its wheel ships the ROMs). Each run takes 84x84 frames from two processes' vector envs
through the frame stacker and the Nature CNN, trains, evaluates, and loses nothing on a
reliable topic; APPO's learner also reports its policy lag and its V-trace figures.
"""

from __future__ import annotations

import importlib.util

import pytest

import nodes.messages  # noqa: F401 - registers the RL message types for the taps
from tests.test_graphs_training import assert_smoke_run, graph

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ale_py") is None,
                                reason="needs ale-py (the test extra installs it)")

# One evaluation episode every 512 env steps, metrics after every update (a run this short
# can end before a 5 s period).
_EVAL = ("nodes.evaluator.config.eval_interval=512",
         "nodes.evaluator.config.num_eval_episodes=1",
         "nodes.learner.config.metrics_interval_s=0.01")
# Three unrolls of 2 runners x 8 envs x 32 steps; the learning rate anneals over the run.
_ON_POLICY = (*_EVAL,
              "nodes.unroller.config.unroll_length=32",
              "nodes.learner.config.num_env_steps=1536")
SMOKE = {
    "ppo_atari": _ON_POLICY,
    "appo_atari": (*_ON_POLICY, "agent.algorithm.learning_rate_anneal_steps=1536"),
    # A small store that samples soon: 32-sample updates from the 500th step on.
    "dqn_atari": (*_EVAL,
                  "nodes.replay_store.config.max_length=256",
                  "nodes.replay_store.config.min_size_to_sample=500",
                  "nodes.learner.config.num_env_steps=1500",
                  "nodes.evaluator.config.stop_at_return=null"),
}
# What only that algorithm's update reports: its own loss reached the learner's metrics.
OWN_METRICS = {"ppo_atari": {"loss/pg"},
               "appo_atari": {"loss/pg", "vtrace/rho", "lag/versions_max"},
               "dqn_atari": {"loss/td"}}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", sorted(SMOKE))
def test_atari_graph_smoke_run(live_runs, name):
    run = live_runs(graph(name), *SMOKE[name])
    assert_smoke_run(run, OWN_METRICS[name])
