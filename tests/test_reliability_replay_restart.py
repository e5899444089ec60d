"""kill -9 of the replay store of a running DQN CartPole graph (issue 11, item 4): its clients
(the learner sampling, the unroller inserting) wait for its restart instead of failing, and no
peer's death aborts another process (the unroller died of libzmq's ``!_more`` assertion in
fq.cpp when this happened). Real run.py and processes."""

from __future__ import annotations

import os
import signal

import pytest

from tests.pipeline_harness import ROOT, LiveRun


def _status(run, instance: str) -> dict:
    return run.command("status")["nodes"][instance]


def _wait(run, predicate, what: str, timeout_s: float = 180):
    """The status once ``predicate(nodes)`` holds: looked at as each metrics message arrives
    (several a second), so the wait is on events, not a polling period."""
    seen = {}

    def holds(_msg) -> bool:
        seen["nodes"] = run.command("status")["nodes"]
        return predicate(seen["nodes"])

    try:
        run.wait_for_message("metrics", holds, timeout_s=timeout_s)
    except TimeoutError:
        raise AssertionError(f"{what} within {timeout_s}s: {seen.get('nodes')}") from None
    return seen["nodes"]


@pytest.mark.timeout(400)
def test_kill_9_of_the_replay_store_leaves_learner_and_unroller_running(tmp_path):
    # No stop condition: on a slow machine the graph reached 475 between two kills, the run
    # ended and the wait for the replay store's restart saw no message for 180 s.
    run = LiveRun(str(tmp_path / "run"), os.path.join(ROOT, "graphs", "dqn_cartpole.yaml"),
                  "nodes.evaluator.config.stop_at_return=null",
                  "nodes.learner.config.num_env_steps=100000000")
    try:
        run.wait_ready()
        trained = lambda nodes: nodes["learner.0"].get("status", {}).get("iteration", 0) > 50  # noqa: E731
        _wait(run, trained, "the learner did not train")
        for _ in range(2):
            replay = _status(run, "replay_store.0")
            os.kill(replay["pid"], signal.SIGKILL)
            restarted = lambda nodes, r=replay: (  # noqa: E731
                nodes["replay_store.0"]["restarts"] > r["restarts"]
                and nodes["replay_store.0"]["state"] == "running")
            _wait(run, restarted, "the replay store did not come back")
            iteration = _status(run, "learner.0")["status"]["iteration"]
            _wait(run, lambda nodes, i=iteration: nodes["learner.0"]["status"]["iteration"]
                  > i + 50, "the learner did not train after the replay store's restart")
        nodes = run.command("status")["nodes"]
        for name, node in nodes.items():
            if not name.startswith("replay_store"):
                assert node["restarts"] == 0 and node["state"] == "running", (name, node)
        # The in-memory buffer lost what it held; its ledger did not, and says how much.
        assert nodes["replay_store.0"]["status"].get("lost_at_restart", 0) > 0, nodes
        run.interrupt()
        assert run.finish() == 0, run.stderr
        assert "Assertion failed" not in run.stderr
        # Over the run, with redeliveries after each kill: every step sent was stored once.
        ledger = run.summary()["ledger"]["experience"]
        stored = ledger["consumers"]["replay_store"]
        assert ledger["publishers"] == ledger["publishers_closed"] == 1, ledger
        assert stored["stored_twice"] == stored["missing"] == stored["unaccounted"] == 0, ledger
        assert stored["lost_with_publisher"] == 0 and ledger["produced"] == stored["stored"], \
            ledger
    finally:
        run.kill()
