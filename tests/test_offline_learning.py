"""Learning from datasets through the graphs (slow: minutes each on a 2-core CPU).

The reference procedure end to end: a SAC Pendulum run to 10,000 env steps becomes a dataset
(``python bench/datasets.py pendulum`` does the same), IQL learns from it offline to -200, and
SAC with it mixed in reaches -200 in at most half the env steps of the same graph without it.
docs/benchmarks.md records the three-seed figures (``bench/datasets.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.pipeline_harness import ROOT

pytestmark = pytest.mark.slow


def run(graph: str, run_dir: str, *overrides: str, seed: int = 0) -> list[tuple[int, float]]:
    """``run.py`` on a graph to its end; the evaluations ``(env steps, return)``."""
    cmd = [sys.executable, os.path.join(ROOT, "run.py"), "run", "--quiet",
           os.path.join(ROOT, "graphs", graph), "--run-dir", run_dir, "--seed", str(seed)]
    for item in overrides:
        cmd += ["--set", item]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stderr[-2000:]
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [(m["env_steps"], m["eval/return"]) for m in rows if "eval/return" in m]


def first_at(evals, threshold=-200.0):
    return next((steps for steps, ret in evals if ret >= threshold), None)


@pytest.fixture(scope="module")
def pendulum_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("pendulum")
    run_dir = str(root / "sac")
    run("sac_pendulum.yaml", run_dir, "nodes.learner.config.num_env_steps=10000",
        "nodes.evaluator.config.stop_at_return=null",
        "nodes.replay_store.config.max_length=10000")
    path = str(root / "pendulum-sac-v0")
    made = subprocess.run([sys.executable, os.path.join(ROOT, "run.py"), "dataset", run_dir,
                           "--to", path], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr
    return path


@pytest.mark.timeout(3600)
def test_iql_learns_pendulum_offline(pendulum_dataset, tmp_path):
    evals = run("iql_pendulum_offline.yaml", str(tmp_path / "iql"),
                f"nodes.replay_store.config.datasets=[{pendulum_dataset}]")
    assert first_at(evals) is not None, evals


@pytest.mark.timeout(3600)
def test_hybrid_sac_needs_half_the_env_steps(pendulum_dataset, tmp_path):
    data = f"nodes.replay_store.config.datasets=[{pendulum_dataset}]"
    with_data = first_at(run("sac_pendulum_hybrid.yaml", str(tmp_path / "with"), data))
    without = first_at(run("sac_pendulum_hybrid.yaml", str(tmp_path / "without"),
                           "nodes.replay_store.config.datasets=null",
                           "nodes.replay_store.config.offline_pretrain_batches=0"))
    assert with_data is not None and without is not None, (with_data, without)
    assert with_data <= without / 2, (with_data, without)
