"""env_runner: steps a batch of Gymnasium environments for the unroller's policy.

Each step it sends the envs' ``TimeStep`` (ALF fields, ``NEXT_STEP`` autoreset: the step
after a LAST is FIRST) to the ``policy`` service and applies the actions it gets back.
Termination (discount 0) and truncation (discount 1) stay apart. An environment that raises is
recreated: the runner reports a LAST step (truncation, the previous observation) so no target
bootstraps across the break, then starts new episodes and keeps going.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

from algorithms.data import StepType, TimeStep
from algorithms.sync_trainer import VectorEnvStepper
from nodes.messages import Metrics, TimeStepBatch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Config:
    env_id: str = field(metadata={"doc": "any registered Gymnasium id"})
    num_envs: int = field(default=1, metadata={"doc": "environments in this runner"})
    env_kwargs: dict = field(default_factory=dict, metadata={"doc": "gymnasium.make kwargs"})
    seed: int = field(default=0, metadata={"doc": "base seed; replica r uses seed + 1000 r"})
    request_timeout_s: float = field(default=60.0, metadata={"doc": "wait for actions"})
    metrics_interval_s: float = field(default=5.0, metadata={"doc": "episode metrics period"})
    max_env_failures: int = field(default=100, metadata={"doc": "give up after this many"})


def make_env(config: Config, seed: int) -> gym.vector.VectorEnv:
    env = gym.make_vec(config.env_id, num_envs=config.num_envs, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP},
                       **config.env_kwargs)
    env.action_space.seed(seed)
    return env


class EpisodeStats:
    """Returns and lengths of finished episodes, reported as means per period."""

    def __init__(self, num_envs: int):
        self.ret = np.zeros(num_envs)
        self.length = np.zeros(num_envs, dtype=np.int64)
        self.done_returns: list[float] = []
        self.done_lengths: list[int] = []
        self.episodes = 0

    def update(self, ts: TimeStep) -> None:
        first = ts.step_type == StepType.FIRST
        self.ret[first], self.length[first] = 0.0, 0
        self.ret += ts.reward
        self.length += ~first
        for i in np.flatnonzero(ts.step_type == StepType.LAST):
            self.done_returns.append(float(self.ret[i]))
            self.done_lengths.append(int(self.length[i]))
            self.episodes += 1

    def flush(self) -> dict:
        if not self.done_returns:
            return {}
        out = {"train/episode_return": float(np.mean(self.done_returns)),
               "train/episode_length": float(np.mean(self.done_lengths)),
               "train/episodes": self.episodes}
        self.done_returns, self.done_lengths = [], []
        return out


async def run(config: Config, bus, ready) -> dict:
    replica = bus.context.replica
    seed = config.seed + 1000 * replica
    env_offset = replica * config.num_envs
    policy = bus.client("policy")
    metrics = bus.publisher("metrics") if bus.publishes("metrics") else None
    stepper = VectorEnvStepper(make_env(config, seed), seed)
    stats = EpisodeStats(config.num_envs)
    ts = stepper.reset()
    failures = 0
    steps = 0
    env_steps = 0
    need_reset = False  # the env was recreated: the step after the LAST we reported is a reset
    last_report = time.monotonic()
    ready()
    try:
        while not bus.stopping.is_set():
            try:
                reply = await _request_unless_stopping(
                    policy, TimeStepBatch(bus.context.instance, env_offset, ts._asdict()),
                    config.request_timeout_s, bus.stopping)
            except TimeoutError as exc:  # the unroller is restarting: ask again, same step
                log.warning("%s: %s; asking again", bus.context.instance, exc)
                continue
            if reply is None:
                break
            env_steps = reply.message.env_steps
            if need_reset:
                ts, need_reset = stepper.reset(), False
            else:
                try:
                    ts = stepper.step(np.asarray(reply.message.action))
                except Exception as exc:  # a broken environment must not take the runner down
                    failures += 1
                    log.error("%s: environment raised %s: %s; recreating it (%d/%d)",
                              bus.context.instance, type(exc).__name__, exc, failures,
                              config.max_env_failures)
                    if failures > config.max_env_failures:
                        raise
                    ts, need_reset = _truncated(ts), True
                    stepper.env.close()
                    stepper = VectorEnvStepper(make_env(config, seed + failures), seed + failures)
            stats.update(ts)
            steps += 1
            bus.status["steps"] = steps * config.num_envs
            if metrics is not None and time.monotonic() - last_report >= config.metrics_interval_s:
                last_report = time.monotonic()
                values = stats.flush()
                if values:
                    values["env/failures"] = failures
                    await metrics.send(Metrics(bus.context.instance, env_steps, values))
    finally:
        stepper.env.close()
    return {"steps": steps * config.num_envs, "episodes": stats.episodes, "failures": failures}


async def _request_unless_stopping(client, msg, timeout: float, stopping: asyncio.Event):
    """The reply, or None if the run stops first (the unroller may be waiting on others)."""
    request = asyncio.ensure_future(client.request(msg, timeout))
    stop = asyncio.ensure_future(stopping.wait())
    try:
        done, _ = await asyncio.wait({request, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if request not in done:
        request.cancel()
        return None
    return request.result()


def _truncated(ts: TimeStep) -> TimeStep:
    """The last good step, re-labelled LAST with discount 1: the episode was cut, not ended."""
    n = len(ts.step_type)
    return ts._replace(step_type=np.full(n, StepType.LAST, np.int64),
                       reward=np.zeros(n, np.float32), discount=np.ones(n, np.float32))
