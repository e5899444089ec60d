"""unroller: policy inference for every env runner (ALF's rollout / AsyncUnroller).

Serves the ``policy`` service: it takes the time-step requests that are waiting, runs one
batched ``rollout_step`` over all of them with the newest parameters it has, replies with each
runner's actions, and publishes what was collected:

* off-policy: every step as an ``ExperienceBatch`` on ``experience`` (time step ``t``, action
  ``t``, rollout info ``t``, global env ids);
* on-policy: per runner, whole unrolls ``[unroll_length + 1, B]`` on ``trajectories``, each row
  stamped with the parameter version that acted (``Trajectory.versions``: the learner measures
  policy lag with them, :mod:`nodes._lag`). Lock-step (PPO, A2C): after
  ``max_unrolls_per_version`` unrolls collected with one parameter version it waits for a newer
  one. Asynchronous (IMPALA, APPO): ``max_unrolls_per_version: 0`` never waits; the runners
  keep stepping with whatever parameters are newest while the learner trains.
  ``just_in_time`` (with a learner that has ``publish_between_epochs``): an unroll starts not
  as soon as the learner took the last one but about one unroll's time before the learner
  expects to finish training on it, with the parameters it published between its epochs, so
  the behaviour policy is an epoch behind the learner's network instead of a whole batch,
  while the runner still steps as the learner trains.

A recurrent policy's state (PPO's ``rnn_size``) is kept here per environment, by runner and
env id, and goes out with each step in ``rollout_info.state``, which training starts from.

It waits for the learner's first parameters before acting, so every process starts from the
same network. Parameters are taken when newer by ``(epoch, version)``: a restarted learner,
whose version restarted from a checkpoint, is followed at once (:class:`~nodes.messages.Params`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from algorithms.data import TimeStep
from algorithms.steps import flat_fields, nested_fields
from nodes._agent import Agent, agent_field
from nodes._common import (
    FirstBatchCheck,
    ProbeLog,
    experience_schema,
    make_algorithm,
    restore_from_checkpoint,
    start_state_server,
    strip_empty,
    to_numpy,
)
from nodes.messages import (
    FINAL_CHECKPOINT,
    ActionBatch,
    ExperienceBatch,
    Params,
    StateReply,
    StateRequest,
    TimeStepBatch,
    Trajectory,
)
from pipeline.ports import Port, Ports, Service

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Config:
    agent: Agent = agent_field()
    unroll_length: int = field(default=8, metadata={"doc": "on-policy unroll length T"})
    max_unrolls_per_version: int = field(default=1, metadata={
        "doc": "on-policy lag bound: unrolls collected with one parameter version before "
               "waiting for a newer one (0 = never wait: asynchronous actor-learner, for "
               "IMPALA and APPO)", "minimum": 0})
    max_queued_unrolls: int | None = field(default=None, metadata={
        "doc": "asynchronous on-policy: start an unroll only when at most this many unrolls "
               "wait on trajectories untaken by a learner (0 = once the learner took the "
               "last one: it trains on unrolls about one version old, where a full queue "
               "makes them two; null = collect regardless, bounded by the topic's hwm)",
        "minimum": 0})
    just_in_time: bool = field(default=False, metadata={
        "doc": "asynchronous on-policy: start each unroll about one unroll's time before the "
               "learner expects to finish its batch (the eta_s of the parameters a learner with "
               "publish_between_epochs sends), with the freshest parameters, instead of as "
               "soon as it may"})
    max_batch_requests: int = field(default=64, metadata={"doc": "requests batched at most"})
    seed: int = field(default=0, metadata={"doc": "torch seed of the rollout policy"})
    params_timeout_s: float = field(default=300.0, metadata={"doc": "wait for parameters"})


def PORTS(config: Config) -> Ports:  # noqa: N802 - the name the pipeline looks for
    """It serves ``policy``; publishes ``trajectories`` on-policy, ``experience`` off-policy;
    needs ``params`` unless the algorithm is ``random``."""
    output = ({"trajectories": Port(Trajectory)} if config.agent.on_policy else
              {"experience": Port(ExperienceBatch)})
    return Ports(publishes=output,
                 subscribes={"params": Port(Params, required=not config.agent.is_random)},
                 serves={"policy": Service(TimeStepBatch, ActionBatch),
                         "unroller_state": Service(StateRequest, StateReply, required=False)})


class Stopping(Exception):
    """The run is ending while the unroller waits for parameters."""


class Unroller:
    def __init__(self, config: Config, node):
        bus = node.bus
        torch.manual_seed(config.seed)
        torch.set_num_threads(1)
        self.config, self.node, self.bus = config, node, bus
        self.alg = make_algorithm(config.agent, node.info.device)
        self.params = bus.subscriber("params") if bus.subscribes("params") else None
        self.on_policy = self.alg.on_policy
        self.output = bus.publisher("trajectories" if self.on_policy else "experience")
        # Sharded replay: each runner's steps go to one replay shard, keyed by its replica.
        self.partitioned = not self.on_policy and getattr(bus.topics.get("experience"),
                                                          "partitioned", False)
        # What this replica sent over the run, restarts included (pipeline.ledger).
        self.ledger = None if self.on_policy else node.ledger("experience", "sent")
        self.sent = 0
        self.version = -1
        self.epoch = -1  # of the learner whose parameters we act with
        self.env_steps = 0
        self.unrolls_at_version = 0
        # Just in time: how long an unroll takes to collect (smoothed), and when each group's
        # current one started.
        self.unroll_s = 0.0
        self.unroll_started: dict[tuple[str, int], float] = {}
        self.batch_s = 0.0  # how long the learner's batch takes to train (Params.batch_s)
        self.sent_env_steps = 0  # the env steps the last unroll sent went out with
        # On-policy rows per env group: (runner, env_offset), as a runner with env_groups
        # sends each group's steps apart and each group's unroll must hold its own envs.
        self.rows: dict[tuple[str, int], list[dict]] = {}
        self.row_versions: dict[tuple[str, int], list[int]] = {}  # the version of each row
        self.states: dict[str, object] = {}
        # A recurrent policy's state per environment, (runner, env id) -> [state]: the batch
        # of one act holds whichever runners asked, so each env's state is gathered and kept
        # by its id. Not checkpointed: a new incarnation starts each env from the zero state
        # (as an episode start would). ``zero_state`` is one env's initial state, None when the
        # policy is feed-forward.
        zero = self.alg.get_initial_state(1)
        self.zero_state = zero[0] if isinstance(zero, torch.Tensor) else None
        self.hidden: dict[tuple[str, int], torch.Tensor] = {}
        self.probe = ProbeLog(node.status, config.agent.probe_observation)
        # What this node sends, checked against the agent's declared schema at the first
        # batch (a producer that builds a field wrongly fails here, naming the field).
        self.check_rows = FirstBatchCheck(experience_schema(config.agent), 1,
                                          f"{node.info.instance}: experience")

    def load_params(self, envelope) -> bool:
        """Take the parameters if newer; whether they were."""
        msg = envelope.message
        if not msg.newer_than(self.epoch, self.version):
            return False
        self.alg.load_policy_state_dict(msg.params)
        self.epoch, self.version = msg.epoch, msg.version
        self.batch_s = msg.batch_s or 0.0
        self.unrolls_at_version = 0
        self.node.status.update(version=self.version, epoch=str(self.epoch))  # not a figure to show
        self.probe.record(self.alg, self.version)
        return True

    def of_current_batch(self, msg) -> bool:
        """Whether parameters come from the learner's batch on the last unroll sent, or
        after it: the learner's env steps count that unroll's from when it took it (those of
        the batch before, still on their way at the gate, count fewer)."""
        return msg.env_steps >= self.sent_env_steps

    async def wait_for_params(self) -> None:
        """Wait for parameters newer than those we have; raise Stopping if the run ends."""
        have = (self.epoch, self.version)
        while (self.epoch, self.version) <= have:
            try:
                envelope = await self.node.wait_or_stop(self.params.recv(),
                                                        timeout=self.config.params_timeout_s)
            except TimeoutError:
                raise TimeoutError(f"no parameters newer than version {have[1]} within "
                                   f"{self.config.params_timeout_s:.0f}s") from None
            if envelope is None:
                raise Stopping
            self.load_params(envelope)

    async def hold_until_due(self) -> None:
        """Just in time: the learner has just taken the last unroll (``max_queued_unrolls``)
        and trains on it for about ``batch_s`` (the learner's own smoothed figure); hold this
        one until about ``unroll_s`` before that batch ends, taking the parameters the learner
        publishes between epochs meanwhile, so the unroll is acted by the freshest policy
        that still keeps the learner busy. Each of those carries the seconds the batch has
        left (``eta_s``), which moves the end of the hold; the batch's final parameters (no
        ``eta_s``) end it at once. Parameters of the batch before, which may still be on
        their way at the gate, are taken but move nothing (:meth:`of_current_batch`). No hold
        before the learner has timed a batch, nor when collecting takes longer than one."""
        self.refresh_params()
        due = time.monotonic() + self.batch_s - self.unroll_s
        while (now := time.monotonic()) < due:
            try:
                envelope = await self.node.wait_or_stop(self.params.recv(), timeout=due - now)
            except TimeoutError:
                return
            if envelope is None:
                raise Stopping
            msg = envelope.message
            if not self.load_params(envelope) or not self.of_current_batch(msg):
                continue
            if msg.eta_s is None:
                return  # the learner finished its batch: collect now
            due = time.monotonic() + msg.eta_s - self.unroll_s

    def refresh_params(self) -> None:
        if self.params is None:
            return
        newest = self.params.poll_newest()
        if newest is not None:
            self.load_params(newest)

    async def act(self, requests: list) -> None:
        bound = self.config.max_unrolls_per_version
        if self.on_policy and bound and self.unrolls_at_version >= bound:
            await self.wait_for_params()
        steps = [r.message for r in requests]
        starting = [(s.runner, s.env_offset) for s in steps
                    if len(self.rows.get((s.runner, s.env_offset), ())) <= 1] \
            if self.on_policy else []
        if starting:
            if self.config.max_queued_unrolls is not None:
                # An unroll starts: collect it once the learner can take it soon, with the
                # parameters it published meanwhile (refreshed below), not ahead of a full queue.
                await self.output.wait_for_backlog(self.config.max_queued_unrolls)
            if self.config.just_in_time:
                await self.hold_until_due()
            now = time.monotonic()
            self.unroll_started.update((group, now) for group in starting)
        self.refresh_params()
        sizes = [len(s.time_step["step_type"]) for s in steps]
        ts = _batched_time_step(steps)
        keys, state = self.gather_state(steps, sizes)
        with torch.no_grad():
            alg_step = self.alg.rollout_step(ts, state)
        if keys:
            self.hidden.update(zip(keys, alg_step.state.unbind(), strict=True))
        action = to_numpy(alg_step.output)
        info = to_numpy(dict(alg_step.info or {}))
        self.env_steps += int(sum(sizes))
        self.node.status["env_steps"] = self.env_steps
        if hasattr(self.alg, "epsilon"):  # DQN's exploration, where it acts
            self.node.status["epsilon"] = round(self.alg.epsilon(), 3)
        bounds = np.cumsum([0, *sizes])
        for i, request in enumerate(requests):
            lo, hi = bounds[i], bounds[i + 1]
            await request.reply(ActionBatch(action[lo:hi], self.version, self.env_steps))
        rows = strip_empty({**flat_fields(ts._asdict()), "action": action,
                            **{f"rollout_info.{k}": v for k, v in info.items()}})
        self.check_rows(rows)
        if self.partitioned:
            for i, s in enumerate(steps):
                lo, hi = bounds[i], bounds[i + 1]
                await self.send_experience(ExperienceBatch(ts.env_id[lo:hi], {
                    k: v[lo:hi] for k, v in rows.items()}, self.version), key=runner_replica(s))
            return
        if not self.on_policy:
            await self.send_experience(ExperienceBatch(ts.env_id, rows, self.version))
            return
        for i, s in enumerate(steps):
            lo, hi = bounds[i], bounds[i + 1]
            await self.collect((s.runner, s.env_offset), {k: v[lo:hi] for k, v in rows.items()})

    def gather_state(self, steps: list, sizes: list[int]) -> tuple[list, object]:
        """``(keys, state)``: each env's id and its recurrent state stacked in batch order,
        the zero state for an env not seen yet; ``([], ())`` for a feed-forward policy."""
        if self.zero_state is None:
            return [], ()
        keys = [(s.runner, s.env_offset + j) for s, n in zip(steps, sizes, strict=True)
                for j in range(n)]
        return keys, torch.stack([self.hidden.get(k, self.zero_state) for k in keys])

    async def send_experience(self, batch: ExperienceBatch, key: int | None = None) -> None:
        """Recorded before it is handed to the transport: the ledger never counts less than
        what went out."""
        if self.ledger is not None:
            self.sent += 1
            self.ledger.record(self.bus.instance, self.sent, len(batch.env_ids))
        await self.output.send(batch, key=key)

    async def collect(self, group: tuple[str, int], row: dict) -> None:
        rows = self.rows.setdefault(group, [])
        versions = self.row_versions.setdefault(group, [])
        rows.append(row)
        versions.append(self.version)
        if len(rows) == self.config.unroll_length + 1:
            unroll = {k: np.stack([r[k] for r in rows]) for k in row}
            await self.output.send(Trajectory(unroll, self.version, self.env_steps,
                                              list(versions)))
            self.sent_env_steps = self.env_steps
            if group in self.unroll_started:
                took = time.monotonic() - self.unroll_started.pop(group)
                self.unroll_s = 0.7 * self.unroll_s + 0.3 * took if self.unroll_s else took
            self.unrolls_at_version += 1
            self.rows[group] = [row]  # the bootstrap row starts the next unroll
            self.row_versions[group] = [versions[-1]]

    def state(self) -> dict:
        return {"algorithm": self.alg.checkpoint_state(), "env_steps": self.env_steps}

    def restore(self, state: dict) -> None:
        self.alg.load_checkpoint_state(state["algorithm"])
        self.env_steps = int(state["env_steps"])


async def start(unroller: Unroller, node) -> asyncio.Task | None:
    """Restore the unroller's checkpoint state, wait for the learner's first parameters
    (raises :class:`Stopping` if the run ends first) and serve ``unroller_state`` if the
    graph lists it (the task, or None). Shared with :mod:`nodes.actor`."""
    config = unroller.config
    restore_from_checkpoint(unroller, "unroller", node.info.resume)
    if not config.agent.is_random:
        await unroller.wait_for_params()

    async def flush_if_final(reason: str) -> None:
        if reason == FINAL_CHECKPOINT:
            # The last checkpoint must hold every step we produced: wait until the
            # consumers acknowledged all of it before reporting our counters. Not for a
            # consumer that already left (a learner at its budget): it never will.
            await unroller.output.flush(config.params_timeout_s, present_only=True)

    return start_state_server(node.bus, "unroller_state", "unroller", unroller, flush_if_final)


async def run(config: Config, node, ready) -> dict:
    unroller = Unroller(config, node)
    server = node.bus.server("policy")
    try:
        state_task = await start(unroller, node)
    except Stopping:
        return {"env_steps": unroller.env_steps, "version": unroller.version}
    ready()
    tasks = [state_task] if state_task else []
    held = None  # a request that must wait for the next batch (see take_batch)
    try:
        while True:
            first, held = held or server.recv_nowait(), None
            if first is None:  # nothing waiting: sleep until a request comes or the run stops
                first = await node.wait_or_stop(server.recv())
                if first is None:
                    break
            elif node.stopping.is_set():
                break
            requests, held = take_batch(first, server.recv_nowait, config.max_batch_requests)
            await unroller.act(requests)
    except Stopping:
        pass
    finally:
        for task in tasks:
            task.cancel()
    return {"env_steps": unroller.env_steps, "version": unroller.version}


def take_batch(first, recv_nowait, limit: int) -> tuple[list, object | None]:
    """``first`` and the requests waiting behind it (``recv_nowait()`` until None), at most
    ``limit``, acted on together; returns ``(requests, held)``, ``held`` being a request that
    must start the next batch.

    A batch never holds two steps of one environment (issue 11: a replay store exited with
    ``env_ids of one batch must be distinct``): a runner killed -9 leaves its last request in
    the queue and its restart asks for the same environments again, and a runner whose
    request timed out asks again for the same step. Both requests are answered, in the order
    they came, as they would be had they come a moment apart; only never in one batch,
    because one batch is one row per environment of the replay store's rings.
    """
    requests = [first]
    if limit <= 1:
        return requests, None
    seen = None
    while len(requests) < limit and (more := recv_nowait()) is not None:
        if seen is None:
            seen = set(_env_ids(first))
        ids = _env_ids(more)
        if not seen.isdisjoint(ids):
            return requests, more
        seen.update(ids)
        requests.append(more)
    return requests, None


def runner_replica(step: TimeStepBatch) -> int:
    """The replica index of the runner that sent ``step`` ("env_runner.3" -> 3): the key that
    keeps each runner's experience in one replay shard."""
    return int(step.runner.rpartition(".")[2])


def _env_ids(request) -> list:
    step = request.message
    return (np.asarray(step.time_step["env_id"]) + step.env_offset).tolist()


def _batched_time_step(steps: list) -> TimeStep:
    """One ``TimeStep`` of every request's envs, with global env ids (a dict observation
    comes as ``observation.<key>`` fields and leaves as a dict)."""
    if len(steps) == 1:  # the common case with one runner: no copies
        step = steps[0]
        fields = nested_fields(step.time_step)
        ts = TimeStep(**{k: fields[k] for k in TimeStep._fields})
        return ts._replace(env_id=np.asarray(ts.env_id) + step.env_offset)
    fields = nested_fields({k: np.concatenate([np.asarray(s.time_step[k]) for s in steps])
                            for k in steps[0].time_step})
    ts = TimeStep(**{k: fields[k] for k in TimeStep._fields})
    return ts._replace(env_id=np.concatenate(
        [np.asarray(s.time_step["env_id"]) + s.env_offset for s in steps]))

