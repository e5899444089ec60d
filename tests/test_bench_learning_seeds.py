"""``bench/learning.py --seeds``: each seed's run gets the other arguments unchanged, and a run
that missed the threshold raises the median instead of vanishing from it."""

from pathlib import Path

import pytest

from tests.bench_scripts import load_bench

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    return load_bench("learning", "bench_learning_seeds")


@pytest.mark.parametrize("argv", [
    ["sac", "Pendulum-v1", "--seeds", "0,1,2", "--graph", "g.yaml"],
    ["sac", "Pendulum-v1", "--graph", "g.yaml", "--seeds=0,1,2"],
])
def test_each_seed_run_gets_the_other_arguments(bench, argv):
    assert bench.without_option(argv, "--seeds") == ["sac", "Pendulum-v1", "--graph", "g.yaml"]


def test_a_missed_threshold_counts_against_the_median(bench):
    assert bench.median_ratio([0.5, 0.7, 0.6]) == 0.6
    assert bench.median_ratio([0.5, None, 0.6]) == 0.6  # not 0.55: the miss sorts last
    assert bench.median_ratio([0.5, None, None]) is None
