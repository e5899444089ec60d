"""Checks at load and at swap (issue 37, item 3): values that pass ``check`` must not deadlock
the graph with every node healthy.

- Durations, sizes and rates are finite: NaN (every comparison false: a watchdog that never
  fires) and infinity are refused with one line (typedconfig, so graph keys and node configs).
- ``heartbeat_timeout_s`` stays below ``membership_timeout_s``: a stopped node is restarted
  before its publishers evict it.
- A learner's sample request the replay store can never fill (above its capacity, above what
  its rate limiter allows) is refused at load, at ``--set`` and at ``swap``.
- ``swap --kind`` with an unknown kind is exit 2 with one line.
"""

from __future__ import annotations

import asyncio
import os
import types

import pytest

import nodes  # noqa: F401 - registers the node kinds and their graph checks
import typedconfig
from pipeline import commands
from pipeline import graph as graphlib
from tests.pipeline_harness import ROOT, LiveRun

DQN = os.path.join(ROOT, "graphs", "dqn_cartpole.yaml")
DEMO = os.path.join(ROOT, "graphs", "demo_counter.yaml")


def _error(path: str, *overrides: str) -> str:
    with pytest.raises(graphlib.GraphError) as info:
        graphlib.load(path, overrides)
    return str(info.value)


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
@pytest.mark.parametrize("key", ["run.heartbeat_timeout_s", "run.grace_s", "run.duration_s",
                                 "run.heartbeat_s", "nodes.checkpointer.config.interval_s",
                                 "nodes.learner.config.request_timeout_s"])
def test_a_duration_that_is_not_finite_is_refused(key, value):
    message = _error(DQN, f"{key}={value}")
    assert f"{key}: must be a finite number" in message, message
    assert message.count("\n") == 0


def test_typedconfig_refuses_nan_and_infinity_for_every_float():
    for annotation in (float, float | None):
        for value in (float("nan"), float("inf"), -float("inf")):
            with pytest.raises(typedconfig.ConfigError, match="must be a finite number"):
                typedconfig.check(annotation, value, "x")
    assert typedconfig.check(float, 3, "x") == 3.0
    with pytest.raises(typedconfig.ConfigError):
        typedconfig.check(int, float("nan"), "x")


def test_the_heartbeat_timeout_stays_below_the_membership_timeout():
    # Both given, in the wrong order: refused, naming the heartbeat timeout.
    message = _error(DEMO, "run.heartbeat_timeout_s=120", "run.membership_timeout_s=100")
    assert "heartbeat_timeout_s (120) must be below membership_timeout_s (100)" in message
    message = _error(DEMO, "run.membership_timeout_s=30")  # at the default heartbeat timeout
    assert "run.membership_timeout_s" in message and "must be below" in message
    # Only the heartbeat timeout raised (the 120 s): the membership timeout follows.
    graph = graphlib.load(DEMO, ["run.heartbeat_timeout_s=120"])
    assert graph.run.membership_timeout_s == 240
    graph = graphlib.load(DEMO, ["run.heartbeat_timeout_s=120", "run.membership_timeout_s=200"])
    assert graph.run.membership_timeout_s == 200
    assert graphlib.load(DEMO).run.membership_timeout_s == 60


@pytest.mark.parametrize("overrides, expected", [
    # The reproductions: 30000 x 16 and 1e11 x 16 against 4 x 25000 steps.
    (["nodes.learner.config.mini_batch_size=30000"], "480000 items per sample request, more "
     "than replay_store 'replay_store' holds (100000"),
    (["nodes.learner.config.mini_batch_size=100000000000"], "can never be filled"),
    # Fits the store, but the rate limiter never lets 20000 go (tolerance 8192 each side).
    (["nodes.learner.config.mini_batch_size=20000",
      "nodes.learner.config.batches_per_request=1"], "2 x spi_tolerance = 16384"),
    (["nodes.replay_store.config.min_size_to_sample=100001"],
     "min_size_to_sample: is 100001, above what the store holds"),
])
def test_a_learner_batch_that_can_never_be_filled_is_refused_at_load(overrides, expected):
    message = _error(DQN, *overrides)
    assert expected in message, message
    assert message.count("\n") == 0


def test_the_largest_batch_that_can_be_filled_is_accepted():
    graphlib.load(DQN, ["nodes.learner.config.mini_batch_size=16384",
                        "nodes.learner.config.batches_per_request=1"])
    graphlib.load(DQN, ["nodes.replay_store.config.samples_per_insert=null",
                        "nodes.learner.config.mini_batch_size=6250"])  # 6250 x 16 = 100000


def _swap(graph, node: str, **args) -> dict:
    """``cmd_swap`` as the supervisor runs it, up to the point where it would start the
    replacement (a refusal comes before that; nothing is started here)."""
    host = types.SimpleNamespace(graph=graph, watchers={
        node: [types.SimpleNamespace(kind=None, config=None)]})
    return asyncio.run(commands.cmd_swap(host, node, **args))


def test_a_swap_to_a_batch_that_can_never_be_filled_is_refused():
    graph = graphlib.load(DQN)
    with pytest.raises(ValueError, match="swap of learner refused: nodes.learner.config."
                       "mini_batch_size: mini_batch_size 30000 x batches_per_request 16"):
        _swap(graph, "learner", set=["mini_batch_size=30000"])
    with pytest.raises(ValueError, match="must be a finite number"):
        _swap(graph, "learner", set=["metrics_interval_s=.nan"])
    with pytest.raises(ValueError, match="swap of learner refused: unknown node kind"):
        _swap(graph, "learner", kind="nosuch_kind")


@pytest.mark.timeout(120)
def test_swap_to_an_unknown_kind_is_a_one_line_user_error(tmp_path):
    run = LiveRun(str(tmp_path / "run"), DEMO, "nodes.source.config.count=0",
                  "nodes.sink.config.expected=0")
    try:
        run.wait_ready()
        swap = run.cli("swap", run.run_dir, "transformer", "--kind", "nosuch_kind")
        assert swap.returncode == 2, swap.stderr
        assert swap.stderr.count("\n") == 1, swap.stderr
        assert "swap of transformer refused" in swap.stderr and "nosuch_kind" in swap.stderr
        assert "internal" not in swap.stderr
        run.interrupt()
        assert run.finish(60) == 0, run.stderr
    finally:
        run.kill()
