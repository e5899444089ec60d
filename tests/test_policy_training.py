"""The real one: DQN trained on CartPole through the whole graph to its threshold, then the
policy the evaluator kept, loaded with ``conduit.load_policy``, plays as well as the evaluator
said it did."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import yaml

from algorithms.steps import StepType, VectorEnvStepper, make_vector_env
from conduit import load_policy
from nodes.evaluator import BEST, INFO_FILE, REACHED, Config
from tests.test_policy_commands import episode_returns

THRESHOLD = 475


def evaluate_policy(policy, num_episodes: int, seed: int) -> float:
    """``algorithms.evaluation.evaluate`` with ``policy.act`` in place of ``predict_step``: the
    same vector env, seeds and batch, so it repeats the evaluator's episodes."""
    env = make_vector_env(policy.agent.env_id, num_episodes, seed, policy.agent.env_kwargs)
    try:
        stepper = VectorEnvStepper(env, seed)
        ts, state = stepper.reset(), None
        returns, done = np.zeros(num_episodes), np.zeros(num_episodes, bool)
        while not done.all():
            action, state = policy.act(ts.observation, state,
                                       episode_start=ts.step_type == StepType.FIRST)
            ts = stepper.step(action)
            returns += np.where(done, 0.0, ts.reward)
            done |= ts.step_type == StepType.LAST
        return float(returns.mean())
    finally:
        env.close()


def play(policy, episodes: int, seed: int) -> list[float]:
    """Episodes one after another, as ``run.py play`` plays them."""
    env = policy.make_env()
    try:
        return episode_returns(policy, env, episodes, seed)
    finally:
        env.close()


@pytest.mark.timeout(1200)
def test_the_best_policy_plays_as_the_evaluator_reported(dqn_cartpole_learned):
    run, hit = dqn_cartpole_learned  # trained to 475 (THRESHOLD) once, shared
    evals = [m for m in run.metrics() if "eval/return" in m]
    top = max(evals, key=lambda m: m["eval/return"])
    with open(os.path.join(run.run_dir, BEST, INFO_FILE)) as f:
        best = json.load(f)
    with open(os.path.join(run.run_dir, REACHED, INFO_FILE)) as f:
        reached = json.load(f)
    # best/ holds the best evaluation's parameters, reached/ the one that stopped the run.
    assert best["mean_return"] == top["eval/return"] and best["version"] == top["eval/version"]
    assert reached["reached"] and reached["mean_return"] == hit[1] >= THRESHOLD
    status = run.summary()["nodes"]["evaluator.0"]["status"]
    assert status["best_return"] == round(top["eval/return"], 1)
    assert status["best_dir"] == os.path.join(run.run_dir, BEST)

    policy = load_policy(run.run_dir, which="best")
    assert policy.info["version"] == best["version"]
    # The evaluator's own episodes (its seed as the run's graph.yaml records it) give the
    # return it reported: the loaded policy is the one it evaluated.
    with open(os.path.join(run.run_dir, "graph.yaml")) as f:
        evaluator = yaml.safe_load(f)["nodes"]["evaluator"]["config"]
    seed = evaluator.get("seed", Config.seed)  # written where --seed moved it
    assert evaluate_policy(policy, evaluator["num_eval_episodes"], seed) == \
        pytest.approx(best["mean_return"])
    # Twenty new episodes, one after another as run.py play plays them.
    returns = play(policy, 20, seed=0)
    assert np.mean(returns) >= best["mean_return"] - 0.1 * abs(best["mean_return"]), returns
