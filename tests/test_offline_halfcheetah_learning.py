"""The HalfCheetah offline targets through the graphs (slow: tens of minutes on a 2-core CPU).

On ``datasets/halfcheetah-medium-v0`` (made first with ``bench/datasets.py halfcheetah`` when
missing: a SAC run of about 20 minutes), seed 0: IQL's final normalized score is at least the
dataset policy's own and at least 5 points above BC's. docs/benchmarks.md records the
three-seed medians (``bench/datasets.py offline iql bc --dataset ...``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.bench_scripts import load_bench
from tests.pipeline_harness import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bench():
    return load_bench("datasets", "bench_datasets_learning")


@pytest.fixture(scope="module")
def medium(bench):
    path = os.path.join(ROOT, bench.HALFCHEETAH["halfcheetah-medium"])
    if not os.path.exists(os.path.join(path, bench.NORMALIZATION)):
        made = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "datasets.py"),
                               "halfcheetah"], cwd=ROOT, capture_output=True, text=True,
                              timeout=5400)
        assert made.returncode == 0, made.stderr[-2000:]
    return bench.read_normalization(path)


@pytest.mark.timeout(7200)
def test_iql_beats_bc_and_the_dataset_on_halfcheetah_medium(bench, medium, tmp_path):
    scores = {}
    for algorithm in ("iql", "bc"):
        graph, extra = bench._offline_graph(algorithm, "halfcheetah-medium")
        run_dir = str(tmp_path / algorithm)
        assert bench._run(graph, run_dir, 0, *extra) == 0
        scores[algorithm] = bench._offline_result(run_dir, "halfcheetah-medium", 0)["final_score"]
    assert scores["iql"] >= medium["dataset_score"], (scores, medium["dataset_score"])
    assert scores["iql"] >= scores["bc"] + 5, scores
