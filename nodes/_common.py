"""Plumbing the RL nodes share: building the algorithm and its spaces, tensors to the wire.

Written once here so that every node builds the same algorithm from the same graph config.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import torch

import algorithms
from algorithms.steps import TimeStep
from nodes._agent import Agent
from nodes.checkpointer import left_state_path
from nodes.messages import StateReply

log = logging.getLogger(__name__)


def env_spaces(env_id: str, env_kwargs: dict | None = None) -> tuple[gym.Space, gym.Space]:
    """The spaces of the env the runners step (Atari: the preprocessed frame)."""
    from algorithms.envs import env_spaces as spaces

    return spaces(env_id, env_kwargs)


def make_algorithm(agent: Agent, device: str):
    """The graph's algorithm (its typed config, data transformers included) for the spaces
    of the agent's env."""
    obs_space, action_space = env_spaces(agent.env_id, agent.env_kwargs)
    return algorithms.make(agent.algorithm, obs_space, action_space,
                           device=resolve_device(device))


def experience_schema(agent: Agent):
    """The agent's declared experience schema (:mod:`algorithms.schema`): every hop checks
    the first batch it gets from each producer against it."""
    from algorithms.schema import agent_schema

    obs_space, action_space = env_spaces(agent.env_id, agent.env_kwargs)
    return agent_schema(agent.algorithm, obs_space, action_space)


class FirstBatchCheck:
    """Checks the first batch from each sender against the schema (one dict lookup after
    that: the producers' code does not change shape between batches)."""

    def __init__(self, schema, batch_dims: int, where: str, shapes: bool = True):
        self.schema, self.batch_dims, self.where = schema, batch_dims, where
        self.shapes = shapes
        self.seen: set = set()

    def __call__(self, rows: dict, sender: str = "") -> None:
        if sender in self.seen:
            return
        where = f"{self.where} from {sender}" if sender else self.where
        self.schema.check(rows, self.batch_dims, where, self.shapes)
        self.seen.add(sender)


def probe(alg, observation) -> list | None:
    """What the policy sees for one raw ``observation``: the data transformers applied with
    the statistics the algorithm holds now (None without transformers)."""
    transform = getattr(alg, "transform_timestep", None)
    if transform is None or getattr(alg, "data_transformer", None) is None:
        return None
    obs = np.asarray([observation], dtype=np.float32)
    ts = TimeStep(step_type=np.array([1]), reward=np.zeros(1, np.float32),
                  discount=np.ones(1, np.float32), observation=obs,
                  env_id=np.zeros(1, np.int64))
    with torch.no_grad():
        out = transform(ts, ())[0].observation
    return [round(float(v), 6) for v in out.reshape(-1).cpu()]


class ProbeLog:
    """The probe's value per parameter version, newest last (a bounded history, so that
    nodes that see different versions share some of them), reported in the node's status."""

    def __init__(self, status: dict, observation, keep: int = 100):
        self.status, self.observation, self.keep = status, observation, keep
        self.values: dict[str, list] = {}

    def record(self, alg, version: int) -> None:
        if self.observation is None:
            return
        value = probe(alg, self.observation)
        if value is None:
            return
        self.values[str(version)] = value
        while len(self.values) > self.keep:
            self.values.pop(next(iter(self.values)))
        self.status["probe"] = dict(self.values)


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


def leave_state(node_context, service: str, component: str, node: Stateful) -> None:
    """Leave ``node``'s state for the run's final checkpoint, which the node will not be there
    to answer: the learner at its budget finishes, and so ends the run, before the
    checkpointer asks. The checkpointer takes the file as that service's answer (else the
    final checkpoint would carry over the newest periodic state, or none). Written with
    :func:`save_atomically`: the checkpointer finds all of it or nothing."""
    if not node_context.info.run_dir or not node_context.bus.publishes(service):
        return
    path = left_state_path(node_context.info.run_dir, service)
    save_atomically(path, {"component": component, "env_steps": node.env_steps,
                           "state": as_torch(node.state())})
    log.info("%s: left its final state in %s", node_context.info.instance, path)


def save_atomically(path: str, obj) -> None:
    """``torch.save`` to a temporary file, synced, then renamed over ``path``: whoever reads
    ``path`` finds all of it or nothing, whenever this process dies."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def discard_left_state(node_context, service: str) -> None:
    """A node that runs again is newer than what it left when it finished before."""
    if node_context.info.run_dir:
        with contextlib.suppress(FileNotFoundError):
            os.remove(left_state_path(node_context.info.run_dir, service))


def start_state_server(bus, service: str, component: str, node: Stateful,
                       prepare=None) -> asyncio.Task | None:
    """The ``serve_state`` task, or None when the graph has this node not serve ``service``."""
    if not bus.publishes(service):
        return None
    return asyncio.ensure_future(serve_state(bus, service, component, node, prepare))
