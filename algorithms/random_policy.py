"""Uniformly random actions (``algorithm: {name: random}``): for measuring the pipeline itself
and for collecting data before any learning. No torch, no parameters to wait for."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from algorithms.config_core import RandomConfig
from algorithms.steps import TimeStep


class RandomPolicy:
    """The algorithm interface's acting half, with nothing to learn; options: see
    :class:`RandomConfig`."""

    @property
    def on_policy(self) -> bool:
        return self.config.on_policy

    def __init__(self, observation_space: gym.Space, action_space: gym.Space,
                 config: RandomConfig, device="cpu"):
        """``observation_space`` and ``device`` are unused: the constructor every algorithm
        has. The sampler is seeded from ``config.seed``."""
        self.config = config
        self.action_space = action_space
        self.action_space.seed(config.seed)

    def get_initial_state(self, batch_size: int):
        return ()

    def rollout_step(self, time_step: TimeStep, state=()):
        from algorithms.data import AlgStep

        n = len(time_step.step_type)
        space = self.action_space
        if isinstance(space, gym.spaces.Discrete):  # vectorized: this is a hot path in benches
            action = space.start + space.np_random.integers(space.n, size=n)
        else:
            action = np.stack([space.sample() for _ in range(n)])
        return AlgStep(output=action, state=(), info={})

    predict_step = rollout_step

    def policy_state_dict(self) -> dict:
        return {}

    def load_policy_state_dict(self, d: dict) -> None:
        pass

    def checkpoint_state(self) -> dict:
        return {}

    def load_checkpoint_state(self, state: dict) -> None:
        pass
