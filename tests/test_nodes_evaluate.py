"""The one ``evaluate()`` (algorithms.evaluation): the evaluator node and the single-process
trainer both use it, and it evaluates on the env the runners step, ``env_kwargs`` included
(the evaluator used to ignore them)."""

from __future__ import annotations

import gymnasium as gym

from algorithms.configs import RandomConfig
from algorithms.evaluation import evaluate
from algorithms.random_policy import RandomPolicy


def test_evaluate_applies_env_kwargs():
    policy = RandomPolicy(None, gym.spaces.Discrete(2), RandomConfig(seed=0))
    short = evaluate(policy, "CartPole-v1", 4, seed=0, env_kwargs={"max_episode_steps": 5})
    assert short.mean_length == 5.0 and short.mean_return == 5.0
    full = evaluate(policy, "CartPole-v1", 4, seed=0)
    assert full.mean_length > 5.0


def test_evaluator_and_trainer_share_it():
    import algorithms.sync_trainer as trainer
    import nodes.evaluator as evaluator

    assert trainer.evaluate is evaluate
    assert not hasattr(evaluator, "evaluate")


class _AlwaysLeft:
    """A greedy policy that never changes its mind (like a Breakout policy that never FIREs)."""

    def predict_step(self, time_step, state=()):
        import numpy as np

        from algorithms.data import AlgStep

        return AlgStep(output=np.zeros(len(time_step.step_type), np.int64), state=state, info={})


def test_epsilon_takes_random_actions():
    greedy = evaluate(_AlwaysLeft(), "CartPole-v1", 10, seed=0)
    assert greedy.mean_length <= 11  # pushing left only drops the pole within ~10 steps
    explored = evaluate(_AlwaysLeft(), "CartPole-v1", 10, seed=0, epsilon=1.0)
    assert explored.mean_length >= 15  # random play balances ~22 steps on average
    again = evaluate(_AlwaysLeft(), "CartPole-v1", 10, seed=0, epsilon=1.0)
    assert again == explored  # seeded: the same evaluation twice


def test_evaluations_fall_on_multiples_of_the_interval():
    """Parameters stamped a little past a multiple do not push the next evaluations later."""
    from nodes.evaluator import next_evaluation

    stamps, due = [], 1000
    for _ in range(30):
        stamp = due + 24  # the first parameters at or past the due step
        stamps.append(stamp)
        due = next_evaluation(stamp, 1000)
    assert [s // 1000 for s in stamps] == list(range(1, 31))
    assert all(s % 1000 == 24 for s in stamps)
    assert next_evaluation(999, 1000) == 1000 and next_evaluation(1000, 1000) == 2000
