"""Plumbing the RL nodes share: building the algorithm and its spaces, tensors to the wire.

Written once here so that every node builds the same algorithm from the same graph config.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

import algorithms
from nodes._algorithm_config import AlgorithmConfig  # noqa: F401  (nodes import it from here)


def env_spaces(env_id: str, env_kwargs: dict | None = None) -> tuple[gym.Space, gym.Space]:
    """The spaces of the env the runners step (Atari: the preprocessed frame)."""
    from algorithms.envs import env_spaces as spaces

    return spaces(env_id, env_kwargs)


class RandomPolicy:
    """Uniformly random actions (``algorithm: {name: random}``): for measuring the pipeline
    itself, and for collecting data before any learning. It has no parameters to wait for."""

    on_policy = False

    def __init__(self, action_space: gym.Space, seed: int = 0):
        self.action_space = action_space
        self.action_space.seed(seed)

    def rollout_step(self, time_step, state=()):
        n = len(time_step.step_type)
        space = self.action_space
        if isinstance(space, gym.spaces.Discrete):  # vectorized: this is a hot path in benches
            action = space.start + space.np_random.integers(space.n, size=n)
        else:
            action = np.stack([space.sample() for _ in range(n)])
        return algorithms.AlgStep(output=action, state=(), info={})

    predict_step = rollout_step

    def policy_state_dict(self) -> dict:
        return {}

    def load_policy_state_dict(self, d: dict) -> None:
        pass

    def checkpoint_state(self) -> dict:
        return {}

    def load_checkpoint_state(self, state: dict) -> None:
        pass


def make_algorithm(env_id: str, algorithm: dict, device: str, env_kwargs: dict | None = None):
    """``algorithm`` is the graph's ``{name: ..., <hyperparameter>: ...}`` mapping."""
    spec = dict(algorithm)
    name = spec.pop("name", None)
    if not name:
        raise ValueError("algorithm config needs a 'name' (one of "
                         f"{', '.join(algorithms.algorithm_names())}, random)")
    obs_space, action_space = env_spaces(env_id, env_kwargs)
    if name == "random":
        return RandomPolicy(action_space, **spec)
    from algorithms import configs

    # The typed config carries data transformer configs (a frame stacker) that the keyword
    # form of ``algorithms.make`` cannot take.
    return algorithms.make(configs.parse(dict(algorithm)), obs_space, action_space,
                           device=resolve_device(device))


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def to_numpy(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    if isinstance(x, dict):
        return {k: to_numpy(v) for k, v in x.items()}
    return x


def to_torch(tree: dict) -> dict:
    """Wire arrays are read-only views of the receive buffer: copy into writable tensors."""
    return {k: torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) else
            (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in tree.items()}


def strip_empty(d: dict) -> dict:
    """Drop fields an algorithm left empty (``()``), which have no array to send."""
    return {k: v for k, v in d.items() if not (isinstance(v, tuple) and v == ())}
