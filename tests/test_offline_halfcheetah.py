"""The HalfCheetah offline procedure's own parts (``bench/datasets.py``): the normalized score,
the choice of the medium checkpoint, the medium rollouts written as a dataset that a replay
store accepts, and the HalfCheetah offline graphs' load checks.

Fast: a policy is a freshly made tiny SAC in a run directory written here (no training run);
the learning itself is measured by ``bench/datasets.py offline`` and the slow test at the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml

from tests.bench_scripts import load_bench
from tests.pipeline_harness import ROOT


@pytest.fixture(scope="module")
def bench():
    return load_bench("datasets", "bench_datasets")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def policy_run(root, env_id: str) -> str:
    """A run directory as load_policy reads it: graph.yaml's agent (a tiny SAC acting from its
    first step) and one checkpoint's learner state, of untrained parameters."""
    import typedconfig
    from nodes._agent import Agent
    from nodes._common import make_algorithm
    from pipeline.wiring import MARKER

    agent = {"env_id": env_id, "algorithm": {
        "name": "sac", "actor_fc_layer_params": [8], "critic_fc_layer_params": [8],
        "initial_random_steps": 0}}
    run_dir = root / env_id
    ckpt = run_dir / "checkpoints" / "ckpt-000000001000-0001"
    ckpt.mkdir(parents=True)
    (run_dir / "graph.yaml").write_text(yaml.safe_dump({"name": "tiny", "agent": agent}))
    alg = make_algorithm(typedconfig.build(Agent, agent, "agent"), "cpu")
    torch.save({"algorithm": alg.checkpoint_state(), "version": 3, "env_steps": 1000},
               ckpt / "learner.pt")
    (ckpt / MARKER).write_text(json.dumps({"env_steps": 1000}))
    return str(run_dir)


def test_normalized_score(bench):
    norm = {"random_return": -300.0, "expert_return": 4700.0}
    assert bench.normalized_score(-300.0, norm) == 0.0
    assert bench.normalized_score(4700.0, norm) == 100.0
    assert bench.normalized_score(2200.0, norm) == pytest.approx(50.0)
    assert bench.normalized_score(-800.0, norm) == pytest.approx(-10.0)
    with pytest.raises(ValueError, match="not above"):
        bench.normalized_score(1.0, {"random_return": 5.0, "expert_return": 5.0})


def test_iql_reward_scale_is_1000_over_the_range_of_episode_returns(bench):
    assert bench.iql_reward_scale([58.9, 2400.0, 3840.3]) == pytest.approx(1000 / 3781.4)
    assert bench.iql_reward_scale([-500.0, 1500.0]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no range"):
        bench.iql_reward_scale([7.0, 7.0])


def test_normalization_is_read_beside_the_dataset(bench, tmp_path):
    with pytest.raises(SystemExit) as info:
        bench.read_normalization(str(tmp_path))
    assert str(tmp_path / "normalization.json") in str(info.value)
    assert "\n" not in str(info.value) and "bench/datasets.py halfcheetah" in str(info.value)
    (tmp_path / "normalization.json").write_text('{"random_return": -280}')
    with pytest.raises(SystemExit, match="no expert_return"):
        bench.read_normalization(str(tmp_path))
    (tmp_path / "normalization.json").write_text('{"random_return": -280, '
                                                 '"expert_return": 4000}')
    assert bench.read_normalization(str(tmp_path))["expert_return"] == 4000


def test_the_medium_candidates_bracket_a_third_to_a_half_of_the_best(bench):
    evals = [(10_000, -50.0), (50_000, 500.0), (70_000, 1100.0), (90_000, 1800.0),
             (110_000, 2600.0), (150_000, 3500.0), (200_000, 4000.0)]
    checkpoints = [(s, f"ckpt-{s}") for s in range(5_000, 200_001, 15_000)]
    picked = bench.pick_medium(evals, checkpoints)
    # A quarter of 4000 first reached at 70k, half at 110k: 50k..130k with the 20k margin.
    assert [s for s, _ in picked] == [50_000, 65_000, 80_000, 95_000, 110_000, 125_000]


def test_medium_rollouts_become_a_dataset_a_replay_store_accepts(bench, tmp_path):
    """Three Pendulum episodes of a (random-weight) SAC policy's exploring actions, written
    from buffers: the episodes, returns and metadata as written, float32 observations as the
    replay stores them, and check_dataset (what a replay store runs) accepts it for an IQL
    agent on the env."""
    import minari

    import typedconfig
    from conduit import load_policy
    from nodes._agent import Agent
    from nodes._datasets import check_dataset

    run_dir = policy_run(tmp_path, "Pendulum-v1")
    policy = load_policy(run_dir, which=os.path.join(run_dir, "checkpoints",
                                                     "ckpt-000000001000-0001"))
    path = str(tmp_path / "pendulum-medium-v0")
    written = bench.write_rollouts(path, policy, 600, 3, 0, dataset_id="pendulum-medium-v0",
                                   metadata={"normalization": {"random_return": -1200.0},
                                             "conduit": {"checkpoint": "c"}})
    assert written["total_episodes"] == 3 and written["total_steps"] == 600
    data = minari.MinariDataset(os.path.join(path, "data"))
    episodes = list(data.iterate_episodes())
    assert [len(ep.actions) for ep in episodes] == [200, 200, 200]
    assert [float(ep.rewards.sum()) for ep in episodes] == pytest.approx(written["returns"])
    assert all(ep.truncations[-1] and not ep.terminations.any() for ep in episodes)
    assert episodes[0].observations.dtype == np.float32
    # Exploring actions of one policy: the three envs' first actions differ, within bounds.
    firsts = np.stack([ep.actions[0] for ep in episodes])
    assert len({float(a) for a in firsts.ravel()}) == 3 and np.abs(firsts).max() <= 2.0
    assert data.storage.metadata["normalization"] == {"random_return": -1200.0}
    agent = typedconfig.build(Agent, {"env_id": "Pendulum-v1", "algorithm": {"name": "iql"}},
                              "agent")
    assert check_dataset(path, agent).total_steps == 600


def test_the_same_seed_writes_the_same_rollouts(bench, tmp_path):
    from conduit import load_policy

    run_dir = policy_run(tmp_path, "Pendulum-v1")
    policy = load_policy(run_dir, which=os.path.join(run_dir, "checkpoints",
                                                     "ckpt-000000001000-0001"))
    a = bench.write_rollouts(str(tmp_path / "a-v0"), policy, 400, 2, 5, dataset_id="a-v0",
                             metadata={})
    b = bench.write_rollouts(str(tmp_path / "b-v0"), policy, 400, 2, 5, dataset_id="b-v0",
                             metadata={})
    assert a["returns"] == b["returns"]


@pytest.mark.parametrize("name", ["iql_halfcheetah_offline", "bc_halfcheetah_offline",
                                  "cql_halfcheetah_offline"])
def test_halfcheetah_graphs_check_with_or_without_a_dataset_and_run_refuses_without(bench, tmp_path, name):
    from conduit import load_policy

    graph = os.path.join("graphs", f"{name}.yaml")
    missing = tmp_path / "halfcheetah-medium-v0"
    # check: the graph is valid, the dataset still to be made is a note; run refuses it.
    done = cli("run.py", "check", graph, f"--set=nodes.replay_store.config.datasets=[{missing}]")
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"note: {graph}: dataset {missing}: no such directory" in done.stderr
    assert "bench/datasets.py pendulum or halfcheetah" in done.stderr
    done = cli("run.py", "run", graph, f"--set=nodes.replay_store.config.datasets=[{missing}]")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"dataset {missing}: no such directory" in done.stderr
    assert not os.path.exists(missing)
    run_dir = policy_run(tmp_path, "HalfCheetah-v5")
    policy = load_policy(run_dir, which=os.path.join(run_dir, "checkpoints",
                                                     "ckpt-000000001000-0001"))
    bench.write_rollouts(str(missing), policy, 1000, 1, 0, dataset_id="halfcheetah-medium-v0",
                         metadata={})
    done = cli("run.py", "check", graph, f"--set=nodes.replay_store.config.datasets=[{missing}]")
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr


def test_graphs_read_where_the_bench_writes(bench):
    for name in ("iql_halfcheetah_offline", "bc_halfcheetah_offline", "cql_halfcheetah_offline"):
        with open(os.path.join(ROOT, "graphs", f"{name}.yaml")) as f:
            datasets = yaml.safe_load(f)["nodes"]["replay_store"]["config"]["datasets"]
        assert datasets == [bench.HALFCHEETAH["halfcheetah-medium"]]
    done = cli("bench/datasets.py", "score", "--dataset", "halfcheetah-medium-replay",
               os.path.join(ROOT, "graphs"))
    assert done.returncode != 0 and "graph.yaml" in done.stderr.strip().splitlines()[-1]
