"""A tiny Gymnasium environment of your own, trained by a Conduit graph (docs/custom.md).

The agent stands at the left end of a corridor of ``length`` cells and must walk to the right
end. Which of the two actions steps right alternates from cell to cell (action 1 in even
cells, action 0 in odd ones; the other steps left, and the left wall stops it), so no constant
policy gets through: the agent has to learn each cell's action. Reaching the right end ends the
episode with reward 1; every other step gives 0, and after ``4 * length`` steps the episode is
truncated. The observation is the agent's cell, one-hot. A greedy policy that has learned the
corridor scores 1.0; one that has not, 0.0.

Importing this module registers ``Corridor-v0``. A graph names the module in one of two ways
(``examples/corridor_dqn.yaml``)::

    imports: [examples.corridor]         # then env_id: Corridor-v0
    agent: {env_id: "examples.corridor:Corridor-v0"}   # Gymnasium's module:EnvId form
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class Corridor(gym.Env):
    """Walk right to the end of a corridor of ``length`` cells."""

    def __init__(self, length: int = 8):
        if length < 2:
            raise ValueError(f"a corridor needs at least 2 cells, got {length}")
        self.length = length
        self.max_steps = 4 * length
        self.observation_space = spaces.Box(0.0, 1.0, (length,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.position = 0
        self.steps = 0

    def _observation(self) -> np.ndarray:
        observation = np.zeros(self.length, np.float32)
        observation[self.position] = 1.0
        return observation

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.position, self.steps = 0, 0
        return self._observation(), {}

    def step(self, action):
        right = int(action) == (1 if self.position % 2 == 0 else 0)
        self.position = max(0, self.position + (1 if right else -1))
        self.steps += 1
        terminated = self.position == self.length - 1
        truncated = not terminated and self.steps >= self.max_steps
        return self._observation(), float(terminated), terminated, truncated, {}


gym.register(id="Corridor-v0", entry_point=Corridor)
