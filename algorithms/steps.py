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
    observation: the env's observation (the final observation on LAST), in the env's dtype:
        uint8 (and bool) images stay as they are, float vectors are float32.
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
                    env_kwargs: dict | None = None, training: bool = False
                    ) -> gym.vector.VectorEnv:
    """Synchronous vector env with ``NEXT_STEP`` autoreset (the pipeline's convention), from
    :func:`algorithms.envs.make_env`. Evaluation envs by default (whole Atari games, raw
    rewards), as its callers evaluate; envs that collect training data pass ``training=True``."""
    from algorithms.envs import make_env

    return make_env(env_id, num_envs, seed, env_kwargs, training)


def observation_array(obs: np.ndarray) -> np.ndarray:
    """The observation as the pipeline carries it: uint8 images stay uint8 (0-255 pixels) and
    bool images stay bool (both one byte; the networks scale them, uint8 by 1/255, bool as 0/1),
    floats become float32, other integers float32 as before.

    Never a float copy of an image: 84x84 frames as float32 would be 4x the bytes on the wire
    and in replay."""
    obs = np.asarray(obs)
    if obs.dtype in (np.uint8, np.bool_, np.float32):
        return obs
    return obs.astype(np.float32)


class VectorEnvStepper:
    """Turns a ``NEXT_STEP`` vector env into ALF ``TimeStep``s (numpy ``[B, ...]``).

    After a step that returned terminated/truncated (LAST), the env's next step resets it: that
    step is FIRST with reward 0 and discount 1, whatever the env reported.

    Besides the time step, each ``reset``/``step`` leaves the episode marks that metrics need
    where the learner's episodes and the game's differ (Atari with episodic life and clipped
    rewards, see :class:`algorithms.envs.atari.AtariEnv`): ``score`` (the raw reward,
    ``info["raw_reward"]``), ``episode_start`` (a new game begins at this step) and
    ``episode_end`` (the game ended here, ``info["game_over"]``). For other envs they are the
    reward, FIRST and LAST.
    """

    def __init__(self, env: gym.vector.VectorEnv, seed: int | None = None):
        self.env = env
        self.num_envs = env.num_envs
        self._seed = seed
        self._was_last = np.zeros(self.num_envs, dtype=bool)
        self._game_over = np.zeros(self.num_envs, dtype=bool)
        self._env_id = np.arange(self.num_envs, dtype=np.int64)
        self.score = np.zeros(self.num_envs, np.float32)
        self.episode_start = np.ones(self.num_envs, dtype=bool)
        self.episode_end = np.zeros(self.num_envs, dtype=bool)

    def _prev_action_zeros(self):
        space = self.env.single_action_space
        return np.zeros((self.num_envs, *space.shape), dtype=space.dtype)

    def reset(self) -> TimeStep:
        obs, _ = self.env.reset(seed=self._seed)
        self._was_last[:] = False
        self._game_over[:] = False
        n = self.num_envs
        self.score = np.zeros(n, np.float32)
        self.episode_start = np.ones(n, dtype=bool)
        self.episode_end = np.zeros(n, dtype=bool)
        return TimeStep(np.full(n, StepType.FIRST, np.int64), np.zeros(n, np.float32),
                        np.ones(n, np.float32), observation_array(obs),
                        self._prev_action_zeros(), self._env_id)

    def step(self, action: np.ndarray) -> TimeStep:
        space = self.env.single_action_space
        if isinstance(space, gym.spaces.Box):
            action = np.clip(action, space.low, space.high)
        obs, reward, terminated, truncated, info = self.env.step(action)
        first = self._was_last
        last = (terminated | truncated) & ~first
        step_type = np.where(first, StepType.FIRST, np.where(last, StepType.LAST, StepType.MID))
        discount = np.where(last & terminated, 0.0, 1.0).astype(np.float32)
        self.episode_start = self._game_over
        game_over = info.get("game_over", last)
        self.episode_end = game_over & ~self.episode_start
        self.score = np.where(self.episode_start, 0.0,
                              info.get("raw_reward", reward)).astype(np.float32)
        self._game_over = self.episode_end
        reward = np.where(first, 0.0, reward).astype(np.float32)
        self._was_last = last
        return TimeStep(step_type.astype(np.int64), reward, discount, observation_array(obs),
                        np.asarray(action), self._env_id)
