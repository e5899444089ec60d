"""Time steps and the vector-env stepping that makes them: what every process that steps
environments needs, and no torch.

Kept apart from :mod:`algorithms.data` so that an env runner can start without importing torch
(about 1.5 s of CPU per process on the machines this runs on).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np


class StepType(IntEnum):
    """Position of a time step in its episode (ALF's values)."""

    FIRST = 0
    MID = 1
    LAST = 2


class TimeStep(NamedTuple):
    """What an environment batch returns for one step; every field is ``[B, ...]``.

    step_type: ``StepType`` as int (int32 or int64).
    reward: reward of the transition that arrived here (0 on FIRST), float32.
    discount: 0 on termination, 1 otherwise (truncation keeps 1), float32.
    observation: float32 observation (the final observation on LAST).
    prev_action: the action that led here.
    env_id: int index of each environment.
    """

    step_type: Any = ()
    reward: Any = ()
    discount: Any = ()
    observation: Any = ()
    prev_action: Any = ()
    env_id: Any = ()

    def is_first(self) -> Any:
        return self.step_type == StepType.FIRST

    def is_last(self) -> Any:
        return self.step_type == StepType.LAST



def make_vector_env(env_id: str, num_envs: int, seed: int | None = None,
                    env_kwargs: dict | None = None) -> gym.vector.VectorEnv:
    """Synchronous vector env with ``NEXT_STEP`` autoreset (the pipeline's convention)."""
    env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP},
                       **(env_kwargs or {}))
    env.action_space.seed(seed)
    return env


class VectorEnvStepper:
    """Turns a ``NEXT_STEP`` vector env into ALF ``TimeStep``s (numpy ``[B, ...]``).

    After a step that returned terminated/truncated (LAST), the env's next step resets it: that
    step is FIRST with reward 0 and discount 1, whatever the env reported.
    """

    def __init__(self, env: gym.vector.VectorEnv, seed: int | None = None):
        self.env = env
        self.num_envs = env.num_envs
        self._seed = seed
        self._was_last = np.zeros(self.num_envs, dtype=bool)
        self._env_id = np.arange(self.num_envs, dtype=np.int64)

    def _prev_action_zeros(self):
        space = self.env.single_action_space
        return np.zeros((self.num_envs, *space.shape), dtype=space.dtype)

    def reset(self) -> TimeStep:
        obs, _ = self.env.reset(seed=self._seed)
        self._was_last[:] = False
        n = self.num_envs
        return TimeStep(np.full(n, StepType.FIRST, np.int64), np.zeros(n, np.float32),
                        np.ones(n, np.float32), obs.astype(np.float32),
                        self._prev_action_zeros(), self._env_id)

    def step(self, action: np.ndarray) -> TimeStep:
        space = self.env.single_action_space
        if isinstance(space, gym.spaces.Box):
            action = np.clip(action, space.low, space.high)
        obs, reward, terminated, truncated, _ = self.env.step(action)
        first = self._was_last
        last = (terminated | truncated) & ~first
        step_type = np.where(first, StepType.FIRST, np.where(last, StepType.LAST, StepType.MID))
        discount = np.where(last & terminated, 0.0, 1.0).astype(np.float32)
        reward = np.where(first, 0.0, reward).astype(np.float32)
        self._was_last = last
        return TimeStep(step_type.astype(np.int64), reward, discount, obs.astype(np.float32),
                        np.asarray(action), self._env_id)
