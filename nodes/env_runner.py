"""env_runner: steps a batch of environments for the unroller's policy.

Each step it sends the envs' ``TimeStep`` (ALF fields, ``NEXT_STEP`` autoreset: the step
after a LAST is FIRST) to the ``policy`` service and applies the actions it gets back.
Termination (discount 0) and truncation (discount 1) stay apart. An environment that raises is
recreated: the runner reports a LAST step (truncation, the previous observation) so no target
bootstraps across the break, then starts new episodes and keeps going.

Environments come from :func:`algorithms.envs.make_env` (Gymnasium ids, Atari with its
preprocessing as ``env_kwargs``, MinAtar). Observations go out in the env's dtype (uint8 frames
stay uint8), one new frame per step: frame stacking is the acting policy's and the replay
store's. A ``Dict`` observation (goal-conditioned envs) goes out as one field per key,
``observation.<key>`` (:func:`algorithms.steps.flat_fields`). Episode metrics report whole games in raw score, also where the learner sees lost
lives as episode ends and clipped rewards (Atari training).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

from algorithms.envs import make_env as make_vector_env
from algorithms.steps import StepType, TimeStep, VectorEnvStepper, flat_fields
from nodes._agent import Agent, agent_field
from nodes.messages import ActionBatch, Metrics, TimeStepBatch
from pipeline.ports import Port, Ports, Service
from typedconfig import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Config:
    agent: Agent = agent_field()  # the env it steps: agent.env_id, agent.env_kwargs
    num_envs: int = field(default=1, metadata={"doc": "environments in this runner",
                                               "minimum": 1})
    seed: int = field(default=0, metadata={"doc": "base seed; replica r uses seed + 1000 r"})
    request_timeout_s: float = field(default=60.0, metadata={"doc": "wait for actions"})
    metrics_interval_s: float = field(default=5.0, metadata={"doc": "episode metrics period"})
    max_env_failures: int = field(default=100, metadata={"doc": "give up after this many"})
    max_steps: int | None = field(default=None, metadata={
        "doc": "finish after this many env steps (all envs together); None: run until stopped"})
    env_groups: int = field(default=1, metadata={
        "doc": "split the envs into groups that step while the others wait for actions",
        "minimum": 1})


def validate(config: Config) -> None:
    """Checked at graph load, so a bad split is one line naming the key, not a crash loop."""
    if config.num_envs % config.env_groups:
        raise ConfigError("env_groups", f"must divide num_envs ({config.num_envs}), "
                                        f"got {config.env_groups}")


def make_env(config: Config, seed: int, num_envs: int) -> gym.vector.VectorEnv:
    return make_vector_env(config.agent.env_id, num_envs, seed, config.agent.env_kwargs,
                           training=True)


class EpisodeStats:
    """Returns and lengths of finished episodes, reported as means per period.

    Where the game's episodes and the learner's differ (Atari training: lost lives end the
    learner's episodes, its rewards are clipped), the learner's are reported too, as
    ``train/learner_episode_*``: that is what peers such as Sample Factory print as their
    episode reward, so curves can be set side by side."""

    def __init__(self, num_envs: int, key: str = "train/episode"):
        self.key = key
        self.ret = np.zeros(num_envs)
        self.length = np.zeros(num_envs, dtype=np.int64)
        self.done_returns: list[float] = []
        self.done_lengths: list[int] = []
        self.episodes = 0
        self._learners: EpisodeStats | None = None  # the learner's episodes, where they differ
        self._marks_differ = False

    def update(self, ts: TimeStep, offset: int = 0, score=None, start=None, end=None) -> None:
        """Fold in one step of the envs ``offset .. offset + len(ts) - 1``.

        ``score``/``start``/``end`` are the stepper's episode marks (raw reward, a game starts,
        a game ends); by default the time step's reward, FIRST and LAST."""
        if score is not None and self._learners is None:
            self._learners = EpisodeStats(len(self.ret), "train/learner_episode")
        if self._learners is not None:
            self._learners.update(ts, offset)
        if score is not None and not self._marks_differ:
            self._marks_differ = bool(np.any(score != ts.reward)
                                      or np.any(end != (ts.step_type == StepType.LAST)))
        view = slice(offset, offset + len(ts.step_type))
        ret, length = self.ret[view], self.length[view]
        if score is None:
            score, start, end = (ts.reward, ts.step_type == StepType.FIRST,
                                 ts.step_type == StepType.LAST)
        ret[start], length[start] = 0.0, 0
        ret += np.where(start, 0.0, score)
        length += ~start
        for i in offset + np.flatnonzero(end):
            self.done_returns.append(float(self.ret[i]))
            self.done_lengths.append(int(self.length[i]))
            self.episodes += 1

    def flush(self) -> dict:
        out = {}
        if self._learners is not None:
            learners = self._learners.flush()
            if self._marks_differ:
                out.update(learners)
        if self.done_returns:
            out.update({f"{self.key}_return": float(np.mean(self.done_returns)),
                        f"{self.key}_length": float(np.mean(self.done_lengths)),
                        f"{self.key}s": self.episodes})
            self.done_returns, self.done_lengths = [], []
        return out


class _Counters:
    """What the runner's env groups share: steps, failures, the graph's env-step count."""

    def __init__(self):
        self.steps = 0
        self.failures = 0
        self.env_steps = 0
        self.stepping_s = 0.0  # in env.step and bookkeeping
        self.env_step_cpu_s = 0.0  # this thread's CPU time inside the envs' step alone
        self.waiting_s = 0.0  # from sending a time step to having its actions
        self.last_report = time.monotonic()


async def _step_group(config: Config, node, group: int, policy, metrics, stats: EpisodeStats,
                      counters: _Counters) -> None:
    """One group of environments: send its time step, apply the actions, repeat. With several
    groups, one group steps while another waits for its actions (double buffering)."""
    size = config.num_envs // config.env_groups
    seed = config.seed + 1000 * node.info.replica + 100 * group
    env_offset = node.info.replica * config.num_envs + group * size
    stepper = VectorEnvStepper(make_env(config, seed, size), seed)
    ts = stepper.reset()
    need_reset = False  # the env was recreated: the step after the LAST we reported is a reset
    sent = None  # the request for ``ts``, once sent

    def ask() -> None:
        nonlocal sent
        sent = policy.send(TimeStepBatch(node.info.instance, env_offset,
                                         flat_fields(ts._asdict())),
                           config.request_timeout_s)

    def going_on() -> bool:
        return not node.stopping.is_set() and (config.max_steps is None
                                               or counters.steps < config.max_steps)

    try:
        while going_on():
            if sent is None:
                ask()
            waited_from = time.perf_counter()
            try:
                reply = await policy.wait(sent)
            except TimeoutError as exc:  # the unroller is restarting: ask again, same step
                log.warning("%s: %s; asking again", node.info.instance, exc)
                sent = None
                continue
            sent = None
            if reply is None:
                break
            stepped_from = time.perf_counter()
            counters.waiting_s += stepped_from - waited_from
            counters.env_steps = max(counters.env_steps, reply.message.env_steps)
            if need_reset:
                ts, need_reset = stepper.reset(), False
            else:
                try:
                    cpu_from = time.thread_time()
                    ts = stepper.step(np.asarray(reply.message.action))
                    counters.env_step_cpu_s += time.thread_time() - cpu_from
                except Exception as exc:  # a broken environment must not take the runner down
                    counters.failures += 1
                    log.error("%s: environment raised %s: %s; recreating it (%d/%d)",
                              node.info.instance, type(exc).__name__, exc, counters.failures,
                              config.max_env_failures)
                    if counters.failures > config.max_env_failures:
                        raise
                    ts, need_reset = _truncated(ts), True
                    stepper.env.close()
                    seed += 1
                    stepper = VectorEnvStepper(make_env(config, seed, size), seed)
            counters.steps += size
            # Ask for the next actions before the bookkeeping below: it then runs while the
            # unroller computes them instead of before it starts.
            if going_on():
                ask()
            if need_reset or not stepper.has_marks:
                # The time step's own marks: after a recreated env the stepper's are of a
                # reset; for envs without raw_reward/game_over they are the same.
                stats.update(ts, offset=group * size)
            else:
                stats.update(ts, group * size, stepper.score, stepper.episode_start,
                             stepper.episode_end)
            counters.stepping_s += time.perf_counter() - stepped_from
            node.status.update(steps=counters.steps, stepping_s=round(counters.stepping_s, 3),
                              waiting_s=round(counters.waiting_s, 3),
                              env_step_cpu_s=round(counters.env_step_cpu_s, 3))
            if metrics is not None and \
                    time.monotonic() - counters.last_report >= config.metrics_interval_s:
                counters.last_report = time.monotonic()
                values = stats.flush()
                if values:
                    values["env/failures"] = counters.failures
                    await metrics.send(Metrics(node.info.instance, counters.env_steps, values))
    finally:
        # Asked before the run stopped: nobody will step on the reply. Cancelled, or, if it
        # already came or failed (the unroller gone), read: an expected failure at the stop,
        # which asyncio would otherwise log as never retrieved.
        if sent is not None and not sent.cancel() and not sent.cancelled():
            sent.exception()
        stepper.env.close()


# What the graph entry may list (pipeline.ports): checked at load.
PORTS = Ports(calls={"policy": Service(TimeStepBatch, ActionBatch)},
              publishes={"metrics": Port(Metrics, required=False)})


async def run(config: Config, node, ready) -> dict:
    policy = _StopAwareRequests(node.bus.client("policy"), node)
    try:
        return await step_envs(config, node, policy, ready)
    finally:
        policy.close()


async def step_envs(config: Config, node, policy, ready) -> dict:
    """Step the envs until the run stops, taking actions from ``policy``: the ``policy``
    service here, the actor's own unroller in :mod:`nodes.actor`. ``policy.send(time_step,
    timeout)`` returns what ``await policy.wait(sent)`` turns into the reply (its ``message``
    an :class:`ActionBatch`), or None once the run stops."""
    if config.env_groups < 1 or config.num_envs % config.env_groups:
        raise ValueError(f"num_envs ({config.num_envs}) must be a multiple of env_groups "
                         f"({config.env_groups})")
    bus = node.bus
    metrics = bus.publisher("metrics") if bus.publishes("metrics") else None
    stats = EpisodeStats(config.num_envs)
    counters = _Counters()
    ready()
    await asyncio.gather(*(_step_group(config, node, g, policy, metrics, stats, counters)
                           for g in range(config.env_groups)))
    return {"steps": counters.steps, "episodes": stats.episodes,
            "failures": counters.failures}


class _StopAwareRequests:
    """Requests that give up when the run stops (the unroller may be waiting on others).

    A request is the client's bare reply future when a server is connected: this runs once
    per step of the environments, where a task per request would cost more than the round
    trip itself."""

    def __init__(self, client, node):
        self.client, self.node = client, node

    def send(self, msg, timeout: float):
        """Send ``msg`` now; what :meth:`wait` takes (None if the run is stopping)."""
        if self.node.stopping.is_set():
            return None
        if self.client.connections:
            return self.client.submit(msg, timeout)
        # No unroller yet, or it is restarting: wait for one within the timeout.
        return asyncio.ensure_future(self.client.request(msg, timeout))

    async def wait(self, sent):
        """The reply to what :meth:`send` sent, or None if the run stops first."""
        if sent is None:
            return None
        return await self.node.wait_or_stop(sent)

    def close(self) -> None:
        pass


def _truncated(ts: TimeStep) -> TimeStep:
    """The last good step, re-labelled LAST with discount 1: the episode was cut, not ended."""
    n = len(ts.step_type)
    return ts._replace(step_type=np.full(n, StepType.LAST, np.int64),
                       reward=np.zeros(n, np.float32), discount=np.ones(n, np.float32))
