"""Greedy (or epsilon-greedy) evaluation: the one ``evaluate()`` of the code base.

The single-process trainer, the learning benchmark and the graph's evaluator node all measure a
policy the same way (same episodes, same seeds, same environment kwargs), so their numbers can
be compared.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from algorithms.steps import StepType, VectorEnvStepper, make_vector_env


class Evaluation(NamedTuple):
    """``success_rate``: the share of episodes whose last step said ``info["is_success"]``
    (goal-conditioned envs such as Gymnasium-Robotics' Fetch); None for envs that never
    report it."""

    mean_return: float
    mean_length: float
    success_rate: float | None = None


def evaluate(alg, env_id: str, num_episodes: int = 10, seed: int = 10_000,
             env_kwargs: dict | None = None, epsilon: float = 0.0) -> Evaluation:
    """Mean undiscounted return and length of ``num_episodes`` greedy episodes (``predict_step``),
    one per parallel env, on ``gymnasium.make(env_id, **env_kwargs)``, and their success rate
    where the env reports ``is_success``.

    ``epsilon``: each step, each env takes a random action with this probability instead.
    Why: a greedy Atari policy can wait forever (Breakout after a lost life, until someone
    presses FIRE), so each evaluation would run to the 108k-frame limit; Atari evaluations
    (Nature DQN, CleanRL) use 0.05, and 0.001-0.01 is common.
    """
    env = make_vector_env(env_id, num_episodes, seed, env_kwargs)
    rng = np.random.default_rng(seed)
    env.action_space.seed(seed)
    try:
        stepper = VectorEnvStepper(env, seed)
        ts = stepper.reset()
        returns = np.zeros(num_episodes)
        lengths = np.zeros(num_episodes)
        done = np.zeros(num_episodes, dtype=bool)
        success = np.full(num_episodes, np.nan)  # at each episode's last step, if reported
        initial_state = getattr(alg, "get_initial_state", None)
        state = initial_state(num_episodes) if initial_state is not None else ()
        while not done.all():
            with torch.no_grad():
                step = alg.predict_step(ts, state)
            state = step.state
            action = step.output
            action = (action.detach().cpu().numpy() if isinstance(action, torch.Tensor)
                      else np.asarray(action))
            if epsilon > 0.0:
                explore = rng.random(num_episodes) < epsilon
                if explore.any():
                    action = action.copy()
                    action[explore] = np.asarray(env.action_space.sample())[explore]
            ts = stepper.step(action)
            returns += np.where(done, 0.0, ts.reward)
            lengths += ~done
            ended = ~done & (ts.step_type == StepType.LAST)
            if stepper.success is not None:
                success[ended] = stepper.success[ended]
            done |= ended
        reported = ~np.isnan(success)
        rate = float(success[reported].mean()) if reported.any() else None
        return Evaluation(float(returns.mean()), float(lengths.mean()), rate)
    finally:
        env.close()
