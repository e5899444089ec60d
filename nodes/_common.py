"""Plumbing the RL nodes share: building the algorithm and its spaces, tensors to the wire.

Written once here so that every node builds the same algorithm from the same graph config.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import torch

import algorithms
from nodes._algorithm_config import AlgorithmConfig  # noqa: F401  (nodes import it from here)
from nodes.messages import StateReply

log = logging.getLogger(__name__)


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


def as_torch(tree: Any) -> Any:
    """Wire arrays (read-only numpy views) become writable tensors, at any depth: a state that
    came over the wire then loads like one read with ``torch.load``."""
    if isinstance(tree, np.ndarray):
        return torch.from_numpy(np.array(tree))
    if isinstance(tree, torch.Tensor):
        return tree.clone()
    if isinstance(tree, dict):
        return {k: as_torch(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(as_torch(v) for v in tree)
    return tree


class Stateful(Protocol):
    """A node's part that checkpoints: ``state()`` is what ``restore(state)`` takes back."""

    env_steps: int

    def state(self) -> dict: ...

    def restore(self, state: dict) -> None: ...


def restore_from_checkpoint(node: Stateful, component: str, checkpoint: str | None) -> bool:
    """Load ``<checkpoint>/<component>.pt`` into ``node`` if the checkpoint has it.

    The one place nodes read checkpoints (written by the checkpointer from the ``StateReply``
    of each node's state service, one file per component)."""
    if not checkpoint:
        return False
    path = os.path.join(checkpoint, f"{component}.pt")
    if not os.path.exists(path):
        return False
    try:
        state = torch.load(path, weights_only=True)
    except Exception as exc:  # a truncated file: say which one
        raise RuntimeError(f"cannot load checkpoint {path}: {type(exc).__name__}: {exc}") \
            from None
    node.restore(state)
    log.info("%s restored from %s (env_steps %d)", component, path, node.env_steps)
    return True


async def serve_state(bus, service: str, component: str, node: Stateful,
                      prepare=None) -> None:
    """Answer every ``StateRequest`` on ``service`` with ``node``'s full state.

    ``prepare(reason)``, if given, is awaited before each snapshot: the unroller flushes its
    output before a final checkpoint, the learner stops training before it hands over."""
    async for request in bus.server(service):
        if prepare is not None:
            await prepare(request.message.reason)
        await request.reply(StateReply(component, node.env_steps, node.state()))


def start_state_server(bus, service: str, component: str, node: Stateful,
                       prepare=None) -> asyncio.Task | None:
    """The ``serve_state`` task, or None when the graph has this node not serve ``service``."""
    if not bus.publishes(service):
        return None
    return asyncio.ensure_future(serve_state(bus, service, component, node, prepare))
