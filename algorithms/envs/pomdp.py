"""Partially observed control tasks: a recurrent policy's reference tasks.

``CartPoleNoVelocity-v1`` is CartPole-v1 whose observation keeps the cart position and the
pole angle and drops both velocities, as RL Zoo's ``CartPoleNoVel-v1``. A policy that sees
one step cannot tell which way the pole moves; one that remembers the previous step can, so
a feed-forward PPO stalls far below 475 while a recurrent one reaches it.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

VISIBLE = (0, 2)  # cart position, pole angle (CartPole's observation: x, x', theta, theta')


class _DropVelocities(gym.ObservationWrapper):
    def __init__(self, env: gym.Env):
        super().__init__(env)
        box = env.observation_space
        self.observation_space = gym.spaces.Box(box.low[list(VISIBLE)], box.high[list(VISIBLE)],
                                                dtype=box.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[list(VISIBLE)]


def cartpole_no_velocity(**kwargs) -> gym.Env:
    from gymnasium.envs.classic_control import CartPoleEnv

    return _DropVelocities(CartPoleEnv(**kwargs))


def register() -> None:
    """Register the ids with Gymnasium (idempotent: every process that makes envs calls it)."""
    if "CartPoleNoVelocity-v1" not in gym.registry:
        gym.register("CartPoleNoVelocity-v1", entry_point=cartpole_no_velocity,
                     max_episode_steps=500, reward_threshold=475.0)
