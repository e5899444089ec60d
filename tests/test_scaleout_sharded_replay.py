"""Sharded replay through the real graph (issue 12): graphs/dqn_cartpole_sharded.yaml with two
env runners and two prioritized replay shards, as processes over ZeroMQ. Every step the
unroller produced is inserted exactly once, in the shard of the runner that stepped it; both
shards are sampled and get priority updates; the learner trains on both. Graph mistakes about
shards are one line at load, and scaling a shard set at run time is refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from pipeline import graph as graphlib
from tests.pipeline_harness import ROOT, LiveRun

GRAPH = os.path.join(ROOT, "graphs", "dqn_cartpole_sharded.yaml")


@pytest.mark.timeout(300)
def test_two_shards_store_every_step_once_and_both_are_sampled(tmp_path):
    run = LiveRun(str(tmp_path / "run"), GRAPH, "nodes.evaluator.config.stop_at_return=null",
                  "nodes.learner.config.num_env_steps=6000")
    run.wait_ready()
    out = run.cli("scale", run.run_dir, "replay_store", "3")  # partitions are fixed at start
    assert out.returncode != 0 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "refused" in out.stderr and "partitioned" in out.stderr, out.stderr
    assert run.finish() == 0, run.stderr
    with open(os.path.join(run.run_dir, "summary.json")) as f:
        summary = json.load(f)
    nodes = summary["nodes"]
    produced = nodes["unroller.0"]["status"]["env_steps"]
    shards = [nodes[f"replay_store.{i}"] for i in range(2)]
    inserted = [s["status"]["inserted"] for s in shards]
    assert sum(inserted) == produced >= 6000, (inserted, produced)
    ledger = summary["ledger"]["experience"]  # the shards' ledgers add up as one store's
    assert ledger["produced"] == ledger["consumers"]["replay_store"]["stored"] == produced, ledger
    assert ledger["consumers"]["replay_store"]["stored_twice"] == 0, ledger
    # Each runner's steps land in its own shard: a shard holds what its runner stepped (the
    # runner counts a step once its action came back: its last batch of 2 may be uncounted).
    steps = [nodes[f"env_runner.{i}"]["status"]["steps"] for i in range(2)]
    assert all(0 <= i - s <= 2 for i, s in zip(inserted, steps, strict=True)), (inserted, steps)
    for s in shards:
        assert s["status"]["sampled"] > 0 and s["status"]["priority_updates"] > 0, s
        assert s["topics"]["sub:experience"].get("gaps", 0) == 0
    learner = nodes["learner.0"]["status"]
    assert learner["iteration"] > 500 and learner["env_steps"] >= 6000, learner


def _check(*overrides: str) -> subprocess.CompletedProcess:
    args = [sys.executable, "run.py", "check", GRAPH]
    for item in overrides:
        args += ["--set", item]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("overrides, words", [
    (("topics.experience.partitioned=false",), ["topics.experience", "partitioned: true"]),
    (("topics.priorities.partitioned=false",), ["topics.priorities", "partitioned: true"]),
    (("nodes.env_runner.replicas=1",), ["nodes.replay_store.replicas", "at least one runner"]),
    (("nodes.env_runner.replicas=3",), ["num_environments", "per shard"]),
    (("nodes.unroller.replicas=2",), ["unroller_state", "one state per component"]),
])
def test_shard_mistakes_are_one_line_at_load(overrides, words):
    """Each mistake, as the graph's load reports it (run.py check prints it: below)."""
    with pytest.raises(graphlib.GraphError) as info:
        graphlib.load(GRAPH, overrides)
    text = str(info.value)
    assert text.count("\n") == 0, text
    for word in words:
        assert word in text, text


def test_a_shard_mistake_is_one_line_from_run_py_check_and_exit_2():
    out = _check("nodes.env_runner.replicas=3")
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().count("\n") == 0, out.stderr
    assert "num_environments" in out.stderr and "per shard" in out.stderr, out.stderr


def test_the_sharded_graph_loads():
    out = _check()
    assert out.returncode == 0, out.stderr


@pytest.mark.timeout(400)
def test_kill_9_of_a_shard_leaves_the_learner_training_on_both(tmp_path):
    """Each shard checkpoints as its own component; the killed shard restarts from its own
    state in the newest checkpoint, the learner's requests to it fail over at once, and both
    shards are sampled again."""
    import torch

    from tests.test_reliability_replay_restart import _status, _wait

    run = LiveRun(str(tmp_path / "run"), GRAPH, "nodes.evaluator.config.stop_at_return=null",
                  "nodes.learner.config.num_env_steps=100000000",
                  "nodes.checkpointer.config.interval_s=2")
    try:
        run.wait_ready()
        _wait(run, lambda nodes: nodes["learner.0"].get("status", {}).get("iteration", 0) > 50
              and nodes["checkpointer.0"].get("status", {}).get("checkpoints", 0) >= 1,
              "the learner did not train, or no checkpoint was written")
        root = os.path.join(run.run_dir, "checkpoints")
        newest = os.path.join(root, sorted(d for d in os.listdir(root) if d[0] != ".")[-1])
        assert {"replay_store.0.pt", "replay_store.1.pt"} <= set(os.listdir(newest))
        saved = [torch.load(os.path.join(newest, f"replay_store.{i}.pt"), weights_only=True)
                 for i in range(2)]
        assert all(s["inserted"] > 0 for s in saved) and \
            saved[0]["shard_envs"] != saved[1]["shard_envs"]  # each shard its own envs
        shard = _status(run, "replay_store.1")
        os.kill(shard["pid"], signal.SIGKILL)
        _wait(run, lambda nodes: nodes["replay_store.1"]["restarts"] > shard["restarts"]
              and nodes["replay_store.1"].get("status", {}).get("sampled", 0) > 0
              and nodes["replay_store.1"]["state"] == "running",
              "the killed shard was not sampled again")
        restored = _status(run, "replay_store.1")["status"]["inserted"]
        assert restored >= saved[1]["inserted"], (restored, saved[1]["inserted"])
        iteration = _status(run, "learner.0")["status"]["iteration"]
        _wait(run, lambda nodes: nodes["learner.0"]["status"]["iteration"] > iteration + 100,
              "the learner did not train on after the shard's restart")
        nodes = run.command("status")["nodes"]
        for name, node in nodes.items():
            if name != "replay_store.1":
                assert node["restarts"] == 0 and node["state"] == "running", (name, node)
        run.interrupt()
        assert run.finish() == 0, run.stderr
    finally:
        run.kill()
