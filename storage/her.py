"""Hindsight experience replay (HER, Andrychowicz et al. 2017) as relabeling at sample time.

A goal-conditioned env's observation carries the goal the agent was asked to reach
(``desired_goal``) and the one its last action did reach (``achieved_goal``); the reward
is a function of the two. An episode that missed its goal still shows how to reach the
goals it passed through, so a share of the sampled windows is retold as if one of those had
been asked for: every step's ``desired_goal`` becomes the ``achieved_goal`` of a step of the
same episode, and each reward is recomputed from that step's ``achieved_goal`` and the new
goal. With sparse rewards (FetchReach's ``-1`` until the gripper is within 5 cm) this is
what gives the critic transitions that end at the goal.

Why at sample time, in the store: the rings keep what the env said, once; the relabeling
ratio, strategy and reward can change without rewriting replay, every draw of a window gets
a fresh goal, and the learner receives ordinary windows (its data transformers concatenate
the dict observation afterwards). The episode index (:class:`storage.episodes.EpisodeIndex`)
says where each sampled window's episode ends, so no goal ever comes from another episode.

Strategies (where the new goal is taken):

* ``future``: a step drawn uniformly from the window's last row to its episode's last step
  (at least the next state for the one-step windows of SAC/DDPG/TD3, so the relabeled
  transition may reach its goal);
* ``final``: the episode's last step.

An episode still being collected ends, for this purpose, at its newest stored step. Rows of
a window that lie past its episode's end (a window that crosses a LAST) keep their own goal
and reward; FIRST rows keep reward 0 (ALF's convention); discounts are not touched
(termination stays the env's: Fetch envs only truncate).

Nothing here imports ZeroMQ or the pipeline: the replay store node calls :meth:`relabel`.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from storage.nest import StepType

STRATEGIES = ("future", "final")

RewardFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


def distance_reward(threshold: float) -> RewardFn:
    """Gymnasium-Robotics' sparse goal reward: ``0`` where ``||achieved - desired||`` is
    within ``threshold``, else ``-1`` (float32), over the last axis."""

    def reward(achieved: np.ndarray, desired: np.ndarray) -> np.ndarray:
        distance = np.linalg.norm(np.asarray(achieved, np.float64)
                                  - np.asarray(desired, np.float64), axis=-1)
        return np.where(distance > threshold, -1.0, 0.0).astype(np.float32)

    return reward


def import_reward(path: str) -> RewardFn:
    """The function ``"module:function"`` names, ``function(achieved [N, G], desired [N, G])
    -> reward [N]``. Raises ``ValueError`` with one line when it cannot be imported."""
    module, sep, name = path.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"expected module:function, got {path!r}")
    try:
        fn = getattr(importlib.import_module(module), name)
    except Exception as exc:  # user code: any failure of its import is the config's mistake
        raise ValueError(f"cannot import {path!r}: {type(exc).__name__}: "
                         f"{' '.join(str(exc).split())}") from None
    if not callable(fn):
        raise ValueError(f"{path!r} is not callable")
    return fn


@dataclass
class HindsightRelabeler:
    """Relabels sampled ``[B, T]`` windows in place (see the module's docstring).

    ratio: the share of windows relabeled (each window independently), 0 to 1.
    strategy: ``future`` or ``final``.
    achieved_field, desired_field: the stored fields of the two goals.
    reward_fn: ``(achieved [N, G], desired [N, G]) -> reward [N]``, numpy.
    seed: of the draws (which windows, which steps).
    """

    ratio: float
    strategy: str = "future"
    achieved_field: str = "observation.achieved_goal"
    desired_field: str = "observation.desired_goal"
    reward_fn: RewardFn = field(default_factory=lambda: distance_reward(0.05))
    seed: int = 0

    def __post_init__(self):
        if not 0.0 <= self.ratio <= 1.0:
            raise ValueError(f"relabel ratio must lie in [0, 1], got {self.ratio}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got "
                             f"{self.strategy!r}")
        self.rng = np.random.default_rng(self.seed)

    def relabel(self, buffer, experience: dict, env_ids, positions) -> np.ndarray:
        """Relabel a share of the windows ``experience`` (``{field: [B, T, ...]}`` CPU
        tensors that ``buffer.get_batch`` returned for ``env_ids``/``positions``, their
        first steps) in place; returns which windows were relabeled (``[B]`` bools).
        ``buffer`` must keep episodic info (``keep_episodic_info``)."""
        step_type = experience["step_type"]
        b, t = step_type.shape[:2]
        chosen = self.rng.random(b) < self.ratio
        if not chosen.any():
            return chosen
        rows = np.flatnonzero(chosen)
        env_ids = _numpy(env_ids)[rows]
        positions = _numpy(positions)[rows]
        to_end = _numpy(buffer.steps_to_episode_end(torch.as_tensor(positions),
                                                    torch.as_tensor(env_ids)))
        goal_offset = self._goal_offsets(to_end, t)
        goal = buffer.get_field(self.achieved_field, torch.as_tensor(env_ids),
                                torch.as_tensor(positions + goal_offset)).cpu()
        # Rows of the window in the sampled step's episode: [n, T].
        inside = torch.as_tensor(np.arange(t)[None, :] <= to_end[:, None])
        desired = experience[self.desired_field]
        goal = goal.to(desired.dtype)
        goal_shape = tuple(goal.shape[1:])
        relabeled = desired[rows].clone()
        mask = inside.reshape(len(rows), t, *([1] * len(goal_shape)))
        relabeled = torch.where(mask, goal[:, None], relabeled)
        desired[rows] = relabeled

        achieved = experience[self.achieved_field][rows]
        new_reward = np.asarray(self.reward_fn(
            achieved.reshape(-1, *goal_shape).numpy(),
            relabeled.reshape(-1, *goal_shape).numpy()), dtype=np.float32).reshape(len(rows), t)
        reward = experience["reward"]
        update = inside & (step_type[rows] != int(StepType.FIRST))
        reward[rows] = torch.where(update, torch.from_numpy(new_reward).to(reward.dtype),
                                   reward[rows])
        return chosen

    def _goal_offsets(self, to_end: np.ndarray, window: int) -> np.ndarray:
        """Steps from each window's start to the step whose achieved goal becomes its goal."""
        if self.strategy == "final":
            return to_end.copy()
        low = np.minimum(window - 1, to_end)
        return self.rng.integers(low, to_end + 1)

    def state_dict(self) -> dict:
        """The draws' generator, so a restored store relabels as the original would (as JSON
        text: its 128-bit integers fit neither msgpack nor a tensor)."""
        return {"rng": json.dumps(self.rng.bit_generator.state)}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = json.loads(state["rng"])


def _numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy().astype(np.int64, copy=False)
    return np.asarray(x, dtype=np.int64)
