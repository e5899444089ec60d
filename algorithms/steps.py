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
        uint8 (and bool) images stay as they are, float vectors are float32. A ``Dict``
        space's observation is a dict of such arrays (goal-conditioned envs:
        ``observation``, ``achieved_goal``, ``desired_goal``); on the wire and in replay it
        travels as one field per key, ``observation.<key>`` (:func:`flat_fields`).
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


def observation_array(obs):
    """The observation as the pipeline carries it: uint8 images stay uint8 (0-255 pixels) and
    bool images stay bool (both one byte; the networks scale them, uint8 by 1/255, bool as 0/1),
    floats become float32, other integers float32 as before.

    Never a float copy of an image: 84x84 frames as float32 would be 4x the bytes on the wire
    and in replay. A dict observation (a ``Dict`` space) becomes a dict of such arrays."""
    if isinstance(obs, dict):
        return {key: observation_array(value) for key, value in obs.items()}
    obs = np.asarray(obs)
    if obs.dtype in (np.uint8, np.bool_, np.float32):
        return obs
    return obs.astype(np.float32)


OBSERVATION_PREFIX = "observation."


def flat_fields(fields: dict) -> dict:
    """``fields`` (a time step's or a stored step's ``{name: array}``) with a dict
    ``observation`` spelled as one field per key, ``observation.<key>``: what the wire, the
    experience schema and the replay rings carry. Why flat: every hop already handles flat
    ``{name: array}`` mappings (``rollout_info.<key>`` is spelled the same way), so a dict
    observation needs no new message type, codec rule or ring layout, and the replay store
    can read and rewrite one key (the goal, for hindsight relabeling) in place."""
    observation = fields.get("observation")
    if not isinstance(observation, dict):
        return dict(fields)
    out = {}
    for name, value in fields.items():
        if name == "observation":
            out.update({OBSERVATION_PREFIX + key: v for key, v in observation.items()})
        else:
            out[name] = value
    return out


def nested_fields(fields: dict) -> dict:
    """The inverse of :func:`flat_fields`: ``observation.<key>`` fields become one dict
    ``observation`` (in the order they came)."""
    keys = [name for name in fields if name.startswith(OBSERVATION_PREFIX)]
    if not keys:
        return dict(fields)
    out = {name: value for name, value in fields.items() if name not in keys}
    out["observation"] = {name[len(OBSERVATION_PREFIX):]: fields[name] for name in keys}
    return out


def batch_size_of(observation) -> int:
    """The leading dimension of an observation, a dict one included (not cast to ``int``:
    under ``torch.export`` it is the symbolic batch size, which a cast would fix)."""
    if isinstance(observation, dict):
        observation = next(iter(observation.values()))
    return observation.shape[0]


def success_of(info: dict, num_envs: int) -> np.ndarray | None:
    """``info["is_success"]`` of a vector env's step as ``[num_envs]`` floats, NaN where an
    env did not report it (Gymnasium's ``_is_success`` mask); None when no env did (the env
    has no notion of success)."""
    success = info.get("is_success")
    if success is None:
        return None
    values = np.asarray(success, dtype=np.float64).reshape(num_envs)
    mask = info.get("_is_success")
    if mask is not None:
        values = np.where(np.asarray(mask, bool).reshape(num_envs), values, np.nan)
    return values


class VectorEnvStepper:
    """Turns a ``NEXT_STEP`` vector env into ALF ``TimeStep``s (numpy ``[B, ...]``).

    After a step that returned terminated/truncated (LAST), the env's next step resets it: that
    step is FIRST with reward 0 and discount 1, whatever the env reported.

    Besides the time step, each ``reset``/``step`` leaves the episode marks that metrics need
    where the learner's episodes and the game's differ (Atari with episodic life and clipped
    rewards, see :class:`algorithms.envs.atari.AtariEnv`): ``score`` (the raw reward,
    ``info["raw_reward"]``), ``episode_start`` (a new game begins at this step) and
    ``episode_end`` (the game ended here, ``info["game_over"]``). For other envs they are the
    reward, FIRST and LAST, and ``has_marks`` stays False (consumers can skip them).

    ``success`` is the step's ``info["is_success"]`` per env (:func:`success_of`; None for
    envs that do not report it): goal-conditioned envs (Gymnasium-Robotics' Fetch) say there
    whether the goal is reached, which the evaluator reports at each episode's end.
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
        self.has_marks = False  # the env reported raw_reward or game_over at least once
        self.success: np.ndarray | None = None

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
        self.success = None
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
        self.has_marks = self.has_marks or "raw_reward" in info or "game_over" in info
        self.episode_start = self._game_over
        game_over = info.get("game_over", last)
        self.episode_end = game_over & ~self.episode_start
        self.score = np.where(self.episode_start, 0.0,
                              info.get("raw_reward", reward)).astype(np.float32)
        self._game_over = self.episode_end
        self.success = success_of(info, self.num_envs)
        reward = np.where(first, 0.0, reward).astype(np.float32)
        self._was_last = last
        return TimeStep(step_type.astype(np.int64), reward, discount, observation_array(obs),
                        np.asarray(action), self._env_id)
