"""Offline and hybrid graphs for real: a short SAC run's replay becomes a dataset
(``run.py dataset``), which an offline graph (replay store, learner, evaluator, checkpointer, no
runners) trains BC and IQL on, and which a hybrid SAC graph mixes into its own experience. Then
``run.py check`` refusing the mismatches, one line each.

Tiny budgets and networks: these show the graphs run and account for what they do, not that
they learn (bench/datasets.py and docs/benchmarks.md measure that)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.pipeline_harness import ROOT

TINY_SAC = ["agent.algorithm.actor_fc_layer_params=[16]",
            "agent.algorithm.critic_fc_layer_params=[16]",
            "agent.algorithm.precision=float32", "agent.algorithm.parallel_update=false"]


def graph(name: str) -> str:
    return os.path.join(ROOT, "graphs", f"{name}.yaml")


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(ROOT, "run.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def metrics(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A dataset made as a user makes one: a short SAC Pendulum run (random actions all along,
    one update per 8 env steps), then ``run.py dataset`` on its final checkpoint."""
    root = tmp_path_factory.mktemp("offline")
    run_dir = str(root / "sac")
    done = cli("run", "--quiet", graph("sac_pendulum"), "--run-dir", run_dir,
               *[f"--set={s}" for s in TINY_SAC + [
                   "agent.algorithm.initial_random_steps=1000",
                   "nodes.learner.config.num_env_steps=450",
                   "nodes.learner.config.mini_batch_size=8",
                   "nodes.replay_store.config.samples_per_insert=1",
                   "nodes.replay_store.config.min_size_to_sample=100",
                   "nodes.replay_store.config.max_length=1000",
                   "nodes.evaluator.config.stop_at_return=null",
                   "nodes.evaluator.config.eval_interval=100000"]])
    assert done.returncode == 0, done.stderr[-2000:]
    path = str(root / "pendulum-tiny-v0")
    made = cli("dataset", run_dir, "--to", path)
    assert made.returncode == 0, made.stderr
    assert "episodes" in made.stdout and "Pendulum-v1" in made.stdout
    return path, run_dir


def test_the_dataset_holds_the_run(dataset):
    import minari

    path, run_dir = dataset
    data = minari.MinariDataset(os.path.join(path, "data"))
    # 450+ env steps of 200-step episodes: two whole episodes and a cut one at least.
    assert data.total_episodes >= 3 and data.total_steps >= 440
    meta = data.storage.metadata["conduit"]
    assert meta["run_dir"] == os.path.abspath(run_dir) and meta["env_id"] == "Pendulum-v1"
    assert meta["policy_version"] > 0
    episode = next(data.iterate_episodes())
    assert len(episode.observations) == len(episode.actions) + 1 == 201
    assert episode.truncations[-1] and not episode.terminations.any()


@pytest.mark.parametrize("name", ["bc_pendulum_offline", "iql_pendulum_offline"])
def test_an_offline_graph_trains_from_the_dataset(dataset, name, tmp_path):
    path, _ = dataset
    run_dir = str(tmp_path / "run")
    layers = [f"agent.algorithm.{k}=[16]" for k in (
        ["actor_fc_layer_params"] if name.startswith("bc") else
        ["actor_fc_layer_params", "critic_fc_layer_params", "value_fc_layer_params"])]
    done = cli("run", "--quiet", graph(name), "--run-dir", run_dir,
               *[f"--set={s}" for s in layers + [
                   f"nodes.replay_store.config.datasets=[{path}]",
                   "nodes.learner.config.num_env_steps=300",
                   "nodes.evaluator.config.eval_interval=100",
                   "nodes.evaluator.config.num_eval_episodes=1",
                   "nodes.evaluator.config.stop_at_return=null"]])
    assert done.returncode == 0, done.stderr[-2000:]
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    learner = summary["nodes"]["learner.0"]["status"]
    # Offline the store counts the batches it served: the learner trained on 300 of them.
    assert learner["iteration"] >= 300 and learner["env_steps"] >= 300
    evals = [m for m in metrics(run_dir) if "eval/return" in m]
    assert evals and all(-2000 < m["eval/return"] <= 0 for m in evals)
    (loaded,) = summary["nodes"]["replay_store.0"]["status"]["datasets"]
    assert loaded["path"] == path and loaded["steps"] > 440


def test_a_hybrid_graph_mixes_the_dataset_into_its_experience(dataset, tmp_path):
    path, _ = dataset
    run_dir = str(tmp_path / "run")
    done = cli("run", "--quiet", graph("sac_pendulum_hybrid"), "--run-dir", run_dir,
               *[f"--set={s}" for s in TINY_SAC + [
                   f"nodes.replay_store.config.datasets=[{path}]",
                   "nodes.replay_store.config.offline_share=0.25",
                   "nodes.replay_store.config.offline_pretrain_batches=20",
                   "nodes.replay_store.config.samples_per_insert=8",
                   "nodes.replay_store.config.min_size_to_sample=50",
                   "nodes.replay_store.config.metrics_interval_s=0.5",
                   "nodes.learner.config.mini_batch_size=8",
                   "nodes.learner.config.num_env_steps=300",
                   "nodes.evaluator.config.stop_at_return=null",
                   "nodes.evaluator.config.eval_interval=100000"]])
    assert done.returncode == 0, done.stderr[-2000:]
    replay = [m for m in metrics(run_dir) if "replay/offline_rows" in m]
    # 20 batches from the dataset alone first, then a quarter of each 8-row batch from the
    # dataset and the rest from the run's own steps, which the env steps still count.
    assert replay and all(m["replay/offline_rows"] == 2 for m in replay)
    assert replay[-1]["replay/offline_pretrained"] == 20
    with open(os.path.join(run_dir, "summary.json")) as f:
        learner = json.load(f)["nodes"]["learner.0"]["status"]
    assert 300 <= learner["env_steps"] < 1000


@pytest.mark.parametrize("overrides,message", [
    (["agent.algorithm={name: ppo}"], "ppo is on-policy"),
    (["nodes.replay_store.config.datasets=null"], "bc learns from datasets only"),
    (["nodes.replay_store.config.samples_per_insert=8"], "nothing is inserted"),
    (["nodes.replay_store.config.offline_share=0.5"], "no experience input"),
    (["nodes.replay_store.config.dataset_weights=[1, 2]"], "2 entries for 1 datasets"),
    (["agent.env_id=MountainCarContinuous-v0"], "recorded on Pendulum-v1"),
    (["nodes.replay_store.config.nstep=3"], "not supported with datasets"),
], ids=["on-policy", "bc-without-data", "rate-limit", "share", "weights", "env", "nstep"])
def test_graph_load_refuses_mismatches(dataset, overrides, message):
    """As ``run.py check`` and ``run.py run`` load a graph: one line naming the key."""
    import nodes  # noqa: F401 - the node kinds and their graph checks
    from pipeline import graph as graphlib

    path, _ = dataset
    with pytest.raises(graphlib.GraphError) as info:
        graphlib.load(graph("bc_pendulum_offline"),
                      [f"nodes.replay_store.config.datasets=[{path}]", *overrides])
    assert message in str(info.value) and "\n" not in str(info.value)
    assert "bc_pendulum_offline.yaml:" in str(info.value)


def test_check_and_dataset_mistakes_are_one_line_and_exit_2(dataset, tmp_path):
    path, run_dir = dataset
    done = cli("check", graph("iql_pendulum_offline"),
               f"--set=nodes.replay_store.config.datasets=[{path}]",
               "--set=agent.env_id=MountainCarContinuous-v0")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "recorded on Pendulum-v1" in done.stderr
    done = cli("dataset", run_dir, "--to", path)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "exists" in done.stderr


def test_dataset_command_mistakes(tmp_path, dataset):
    import argparse

    from nodes._datasets import make_dataset
    from pipeline.cli import UsageError

    def attempt(run_dir):
        args = argparse.Namespace(run_dir=str(run_dir), to=str(tmp_path / "d"),
                                  dataset_id=None, checkpoint=None, replay_files=False)
        with pytest.raises(UsageError) as info:
            make_dataset(args)
        return str(info.value)

    assert "no such run directory" in attempt(tmp_path / "nope")
    assert "no graph.yaml" in attempt(tmp_path)
    empty = tmp_path / "run"
    empty.mkdir()
    (empty / "graph.yaml").write_text("name: x\nagent: {env_id: Pendulum-v1}\n")
    assert "no complete checkpoint" in attempt(empty)
    assert not (tmp_path / "d").exists()


def test_a_stopped_runs_replay_files_give_the_same_dataset(dataset, tmp_path):
    """The memory-mapped replay a run left (its storage_dir) holds what its final checkpoint
    holds; while a store holds the files, they are refused in one line."""
    import fcntl

    import numpy as np

    from storage.datasets import Dataset, DatasetError, ring_files

    path, run_dir = dataset
    made = cli("dataset", run_dir, "--to", str(tmp_path / "files-v0"), "--replay-files")
    assert made.returncode == 0, made.stderr
    ours, theirs = Dataset(str(tmp_path / "files-v0")), Dataset(path)
    assert ours.metadata["conduit"]["replay_files"] == [os.path.join(run_dir, "replay")]
    pairs = list(zip(ours.episodes(), theirs.episodes(), strict=True))
    assert pairs
    for a, b in pairs:
        np.testing.assert_array_equal(a.observations, b.observations)
        np.testing.assert_array_equal(a.actions, b.actions)
        np.testing.assert_array_equal(a.rewards, b.rewards)
    replay = os.path.join(run_dir, "replay")
    fd = os.open(os.path.join(replay, "lock"), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running store holds it
        with pytest.raises(DatasetError, match="in use by a running replay store"), \
                ring_files(replay):
            pass
    finally:
        os.close(fd)
