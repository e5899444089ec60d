"""The observation and action spaces the algorithm interface tests run on."""

import gymnasium as gym
import numpy as np

CARTPOLE_OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
PENDULUM_OBS = gym.spaces.Box(-8.0, 8.0, (3,), np.float32)
DISCRETE = gym.spaces.Discrete(2)
BOX = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
