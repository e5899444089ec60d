"""The one ``evaluate()`` (algorithms.evaluation): the evaluator node and the single-process
trainer both use it, and it evaluates on the env the runners step, ``env_kwargs`` included
(the evaluator used to ignore them)."""

from __future__ import annotations

import gymnasium as gym

from algorithms.evaluation import evaluate
from algorithms.random_policy import RandomPolicy


def test_evaluate_applies_env_kwargs():
    policy = RandomPolicy(gym.spaces.Discrete(2), seed=0)
    short = evaluate(policy, "CartPole-v1", 4, seed=0, env_kwargs={"max_episode_steps": 5})
    assert short.mean_length == 5.0 and short.mean_return == 5.0
    full = evaluate(policy, "CartPole-v1", 4, seed=0)
    assert full.mean_length > 5.0


def test_evaluator_and_trainer_share_it():
    import algorithms.sync_trainer as trainer
    import nodes.evaluator as evaluator

    assert trainer.evaluate is evaluate
    assert not hasattr(evaluator, "evaluate")
