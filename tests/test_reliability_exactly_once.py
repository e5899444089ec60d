"""Exactly-once through restarts on the demo graph (issue 11, item 3): real run.py, real
processes, kill -9 of the transformer and of the sink; the sink's verdict must show every
record counted once, none missing, whatever was redelivered."""

from __future__ import annotations

import functools
import os
import signal

import pytest

from tests.pipeline_harness import ROOT, LiveRun

GRAPH = os.path.join(ROOT, "graphs", "demo_counter.yaml")


@pytest.fixture
def live(live_runs):
    return functools.partial(live_runs, GRAPH)


# A record lost leaves the sink waiting with every node healthy: the progress watchdog then
# ends the run (exit 1, the waiting nodes named) within about twice this, instead of the test
# waiting out its 300 s timeout (mutation caught fast: an acknowledgement one message early).
STALL = "run.stall_timeout_s=15"


def _kill_during_run(live, node: str, n: int, at: int, *overrides) -> tuple[dict, LiveRun]:
    run = live(f"nodes.source.config.count={n}", f"nodes.sink.config.expected={n}", STALL,
               *overrides)
    run.wait_ready()
    pid = run.command("status")["nodes"][f"{node}.0"]["pid"]
    run.wait_for_origin("doubled", at)
    os.kill(pid, signal.SIGKILL)
    assert run.finish() == 0, run.stderr
    with open(os.path.join(run.run_dir, "events.jsonl")) as f:
        assert f"supervisor.{node}.restarted" in f.read()
    return run.result(), run


def _assert_exactly_once(result: dict, n: int) -> None:
    assert result["missing"] == 0, result
    assert result["duplicates"] == 0, result
    assert result["unique"] == n and result["received"] == n, result
    assert result["gaps"] == 0 and result["malformed"] == 0, result
    assert result["wrong_values"] == 0, result


@pytest.mark.timeout(300)
def test_kill_9_of_the_transformer_duplicates_and_loses_nothing(live):
    n = 64_000
    result, _ = _kill_during_run(live, "transformer", n, 20_000)
    _assert_exactly_once(result, n)


@pytest.mark.timeout(300)
def test_kill_9_of_the_transformer_on_coalescing_topics_loses_nothing(live):
    """Coalescing holds a node's outputs to the end of its loop's turn: the watermark releases
    them before any input is acknowledged, so a kill -9 in between still loses nothing. In
    batches of 64 the source has sent all 80,000 before the kill: it must wait for the
    replacement (it used to exit, and what the killed transformer held was lost)."""
    n = 64_000
    result, run = _kill_during_run(live, "transformer", n, 20_000,
                                   "topics.numbers.coalesce=true", "topics.doubled.coalesce=true")
    _assert_exactly_once(result, n)
    with open(os.path.join(run.run_dir, "graph.yaml")) as f:
        assert f.read().count("coalesce: true") == 2  # the run had it


@pytest.mark.timeout(300)
def test_kill_9_of_the_sink_goes_on_counting_from_its_state(live):
    n = 64_000
    result, run = _kill_during_run(live, "sink", n, 20_000)
    _assert_exactly_once(result, n)
    assert result["incarnations"] == 2, result  # the second one restored the first one's state


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [1, 1000])  # at most the topic's hwm: all of it held at once
def test_a_producer_done_before_its_consumers_joined_loses_nothing(live, n):
    """The source sends everything and finishes before the transformer (or the sink) has
    joined: what it holds for a declared group that has not joined yet is delivered, not
    taken for the leftovers of consumers that are gone (the run used to wait for its
    duration, the records held by an exited source)."""
    run = live(f"nodes.source.config.count={n}", f"nodes.sink.config.expected={n}",
               "run.duration_s=90", STALL)
    assert run.finish(100) == 0, run.stderr
    _assert_exactly_once(run.result(), n)
