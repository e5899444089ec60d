"""Learning: each reference task reaches its threshold (mean greedy return over 10 episodes)
within the issue's env-step budget, driven by the synchronous reference trainer.

DQN-CartPole, SAC-Pendulum and QRSAC-Pendulum run in CI with one seed and stop at the first
evaluation that reaches the threshold. The full table (median of 3 seeds) is behind ``-m slow``.
"""

import statistics

import pytest

from algorithms.presets import PRESETS, Preset, make_algorithm
from algorithms.sync_trainer import TrainerConfig, train


def run_preset(p: Preset, seed: int, stop_at_threshold: bool = True):
    alg = make_algorithm(p, seed)
    cfg = TrainerConfig.from_kwargs(**{**p.trainer, "num_env_steps": p.budget,
                                       "threshold": p.threshold,
                                       "stop_at_threshold": stop_at_threshold})
    return train(alg, p.env_id, cfg, seed=seed)


def _check(p: Preset, result):
    assert result.reached_at_steps is not None, (
        f"{p.algo} on {p.env_id}: best greedy return {result.best_return:.1f} < {p.threshold} "
        f"within {p.budget} env steps; evals {result.evals}")
    assert result.reached_at_steps <= p.budget


@pytest.mark.timeout(900)
@pytest.mark.parametrize("key", ["dqn-CartPole-v1", "sac-Pendulum-v1", "qrsac-Pendulum-v1"])
def test_ci_learning(key):
    p = PRESETS[key]
    _check(p, run_preset(p, p.seed))


@pytest.mark.slow
@pytest.mark.timeout(7200)
@pytest.mark.parametrize("key", sorted(PRESETS))
def test_learning_median_of_three_seeds(key):
    p = PRESETS[key]
    results = [run_preset(p, seed) for seed in range(3)]
    best = [r.best_return for r in results]
    assert statistics.median(best) >= p.threshold, (key, best)
