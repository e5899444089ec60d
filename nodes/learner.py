"""learner: ALF's training iterations, fed by the replay store (off-policy) or by unrolls.

Off-policy: it asks the ``sample`` service for ``[mini_batch_size, mini_batch_length]`` batches,
keeping the next ``prefetch`` requests in flight while it trains on the current batch, runs
``train_on`` with the importance weights when replay is prioritized, publishes the new
priorities, and every ``publish_params_every`` updates publishes the policy parameters with a
version that only grows. How many updates per environment step is the replay store's rate
limiter's business (``samples_per_insert``), as in Reverb.

On-policy: it trains on each ``[T + 1, B]`` unroll from ``trajectories`` and publishes new
parameters after every one. With ``publish_between_epochs`` it also publishes them between the
epochs of a batch (PPO's, APPO's), each a version, with the seconds it expects the batch to go
on for: a just-in-time unroller (its ``just_in_time``) starts its next unroll that long before
the batch ends, with the freshest of them, so the unroll the learner takes next was acted by a
policy an epoch old rather than a batch old. It measures each unroll's policy lag (versions and updates behind,
``lag/*`` metrics, ``policy_lag`` in the status; :mod:`nodes._lag`) and, with
``max_policy_lag``, drops and counts unrolls older than that. Lock-step graphs bound the lag
upstream (the unroller's ``max_unrolls_per_version``); asynchronous ones (IMPALA, APPO) train on
whatever arrives and correct for the lag with V-trace.

The run's env-step budget is counted here: at ``num_env_steps`` the learner finishes, which ends
a graph that lists it in ``run.stop_when``.

A learner continues from the newest state it can get before it says ready: a swapped-in (or
restarted-by-command) one asks the running learner over ``learner_state`` for a handover (the
old one stops training, hands over weights, optimizer state and counters, and waits to be
stopped), so the version count goes on; failing that (kill -9, resume) it restores the newest
checkpoint and publishes under a new epoch, which the unroller takes at once
(:class:`~nodes.messages.Params`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from dataclasses import dataclass, field

import torch

from algorithms.data import Experience, TrainResult, mini_batch_rows
from algorithms.schema import REPLAY_EXTRAS
from nodes._agent import Agent, agent_field
from nodes._common import (
    FirstBatchCheck,
    ProbeLog,
    as_torch,
    discard_left_state,
    experience_schema,
    leave_state,
    make_algorithm,
    restore_from_checkpoint,
    start_state_server,
    to_torch,
)
from nodes._lag import PolicyLag
from nodes._sharded_sample import ShardedBatch, ShardedSampler
from nodes.messages import (
    HANDOVER,
    Metrics,
    Params,
    Priorities,
    SampleBatch,
    SampleRequest,
    StateReply,
    StateRequest,
    Trajectory,
)
from pipeline.ports import Port, Ports, Service
from storage.sharding import split_by_shard

log = logging.getLogger(__name__)

# The longest the learner trains on ready replies without letting its other tasks run.
_LOOP_TURN_S = 0.05


@dataclass(frozen=True)
class Config:
    agent: Agent = agent_field()
    num_env_steps: int = field(default=100_000, metadata={"doc": "env-step budget of the run"})
    mini_batch_size: int = field(default=256, metadata={"doc": "replay batch size B", "minimum": 1})
    mini_batch_length: int | None = field(default=None, metadata={
        "doc": "replay window T (default: the algorithm's)"})
    prioritized: bool = field(default=False, metadata={
        "doc": "use importance weights and send priorities (replay must be prioritized)"})
    publish_params_every: int = field(default=1, metadata={"doc": "updates between params"})
    prefetch: int = field(default=2, metadata={
        "doc": "sample requests kept in flight while training", "minimum": 1})
    batches_per_request: int = field(default=1, metadata={
        "doc": "mini-batches fetched by one sample request (fewer round trips for small "
               "updates; each is trained on in turn)", "minimum": 1})
    metrics_interval_s: float = field(default=5.0, metadata={"doc": "metrics period"})
    publish_between_epochs: bool = field(default=False, metadata={
        "doc": "on-policy: publish the parameters between a batch's epochs too (each a "
               "version: lag in versions then counts epochs), with the batch's time left, for "
               "a just_in_time unroller"})
    max_policy_lag: int | None = field(default=None, metadata={
        "doc": "on-policy: drop (and count) unrolls collected by a policy more than this many "
               "parameter versions old (null = train on every unroll)", "minimum": 0})
    request_timeout_s: float = field(default=120.0, metadata={"doc": "sample reply timeout"})
    seed: int = field(default=0, metadata={"doc": "torch seed"})
    num_threads: int = field(default=1, metadata={"doc": "torch threads"})
    handover_timeout_s: float = field(default=120.0, metadata={
        "doc": "wait for a running predecessor's state; after handing over, wait this long "
               "to be stopped before training again (the swap failed)"})


def PORTS(config: Config) -> Ports:  # noqa: N802 - the name the pipeline looks for
    """Off-policy it must call ``sample`` (and publish ``priorities`` when prioritized);
    on-policy it must subscribe to ``trajectories``. ``calls: [learner_state]`` lets a
    swapped-in learner take over the running one's state."""
    state = Service(StateRequest, StateReply, required=False)
    ports = Ports(publishes={"params": Port(Params), "metrics": Port(Metrics, required=False)},
                  serves={"learner_state": state}, calls={"learner_state": state})
    if config.agent.on_policy:
        ports.subscribes["trajectories"] = Port(Trajectory)
    else:
        ports.calls["sample"] = Service(SampleRequest, SampleBatch)
        if config.prioritized:
            ports.publishes["priorities"] = Port(Priorities)
    return ports


class Learner:
    def __init__(self, config: Config, node):
        bus = node.bus
        torch.manual_seed(config.seed)
        torch.set_num_threads(config.num_threads)
        self.config, self.node, self.bus = config, node, bus
        self.alg = make_algorithm(config.agent, node.info.device)
        # The first batch from each sender checked against the agent's schema: trajectories
        # whole; replay samples by names and dtypes, with the replay store's extras
        # (nstep.*, episode.*), which no algorithm reads yet: set apart, reported in the
        # status (``replay_extras``), never dropped unsaid.
        schema = experience_schema(config.agent).with_extras(*REPLAY_EXTRAS)
        self.schema = schema
        self.check_rows = FirstBatchCheck(
            schema, 2, f"{node.info.instance}: "
            f"{'trajectories' if config.agent.on_policy else 'sample'}",
            shapes=config.agent.on_policy)
        self.params = bus.publisher("params")
        self.metrics = bus.publisher("metrics") if bus.publishes("metrics") else None
        self.version = 0
        self.epoch = time.time_ns()  # new at every start that does not continue a live learner
        self.handed_over = asyncio.Event()
        self.not_training = asyncio.Event()  # the training task is not running
        self.not_training.set()
        self.iteration = 0
        self.env_steps = 0
        node.status["env_steps_target"] = config.num_env_steps  # the run's budget (progress, ETA)
        self.last_metrics: dict = {}
        self.lag = PolicyLag(config.publish_params_every, config.max_policy_lag)
        self.probe = ProbeLog(node.status, config.agent.probe_observation)
        self._report_at = time.monotonic() + config.metrics_interval_s
        self._updates_at_report = 0
        # Where the learner's time goes between reports: training vs waiting for data.
        self._train_s = 0.0
        self._wait_s = 0.0
        self._batch_s: float | None = None  # a batch's training time, smoothed (eta_s)

    async def publish_params(self, eta_s: float | None = None) -> None:
        self.lag.on_publish(self.version, self.iteration)
        batch_s = self._batch_s if self.config.publish_between_epochs else None
        await self.params.send(Params(self.version, self.env_steps,
                                      self.alg.policy_params(), self.epoch, eta_s, batch_s))
        self.probe.record(self.alg, self.version)
        self.node.status.update(version=self.version, epoch=str(self.epoch))  # not a figure to show

    async def after_update(self, metrics: dict) -> None:
        self.iteration += 1
        self.last_metrics = metrics
        self.node.status.update(iteration=self.iteration, env_steps=self.env_steps)
        if self.iteration % self.config.publish_params_every == 0:
            self.version += 1
            await self.publish_params()
        now = time.monotonic()
        if self.metrics is not None and now >= self._report_at:
            period = now - self._report_at + self.config.metrics_interval_s
            updates = self.iteration - self._updates_at_report
            self._report_at, self._updates_at_report = now + self.config.metrics_interval_s, \
                self.iteration
            timing = {"learner/updates_per_s": updates / period,
                      "learner/train_ms_per_update": 1e3 * self._train_s / max(updates, 1),
                      "learner/wait_share": self._wait_s / period}
            self._train_s = self._wait_s = 0.0
            lag = self.lag.report() if self.alg.on_policy else {}
            await self.metrics.send(Metrics(self.node.info.instance, self.env_steps, {
                **metrics, **timing, **lag, "learner/iteration": self.iteration,
                "learner/version": self.version}))

    def state(self) -> dict:
        return {"algorithm": self.alg.checkpoint_state(), "version": self.version,
                "epoch": self.epoch, "iteration": self.iteration, "env_steps": self.env_steps}

    def restore(self, state: dict) -> None:
        """Continue from ``state``; the next parameters published are one version newer."""
        self.alg.load_checkpoint_state(state["algorithm"])
        self.version = int(state["version"]) + 1
        self.iteration = int(state["iteration"])
        self.env_steps = int(state["env_steps"])

    async def take_over(self) -> bool:
        """Ask a running predecessor (a swap) for its state; False if there is none."""
        # Only where the graph entry lists it (calls: [..., learner_state]): the graph says
        # what connects to what, a handover included.
        if "learner_state" not in (self.bus.listed.get("calls") or ()):
            return False
        own = self.bus.bound_endpoints()["learner_state"]
        client = self.bus.client("learner_state")
        others = [endpoint for endpoint in client.connections if endpoint != own]
        if not others:
            return False
        client.set_endpoints(others)  # never ask ourselves; the next peer update restores it
        log.info("asking the running learner at %s for its state", others)
        try:
            reply = await client.request(StateRequest(HANDOVER), self.config.handover_timeout_s)
        except TimeoutError as exc:
            log.warning("no handover from the running learner (%s): restoring a checkpoint", exc)
            return False
        state = as_torch(reply.message.state)
        self.restore(state)
        self.epoch = int(state.get("epoch", self.epoch))  # the same line of versions, continued
        self.node.status["took_over_version"] = self.version - 1
        log.info("took over from the running learner: version %d, env_steps %d",
                 self.version, self.env_steps)
        return True

    async def hand_over(self, reason: str) -> None:
        """Before a state reply: on a handover, stop training so the state given is final."""
        if reason == HANDOVER:
            self.handed_over.set()
            await self.not_training.wait()

    async def train_off_policy(self) -> None:
        config = self.config
        client = self.bus.client("sample")
        priorities = self.bus.publisher("priorities") if config.prioritized else None
        length = config.mini_batch_length or getattr(self.alg, "mini_batch_length", 2)
        pending: collections.deque = collections.deque()  # sample requests in flight, FIFO
        self.shards = ShardedSampler(client, config.prioritized, config.seed)
        try:
            await self._sample_and_train(client, priorities, length, pending)
        finally:  # also on a handover, which cancels training
            for request in pending:
                request.cancel()
            # Tell the replay stores we stopped sampling, so they stop holding back inserts.
            for endpoint in list(client.connections) or [None]:
                with contextlib.suppress(TimeoutError):
                    client.submit(SampleRequest(0, 0, self.iteration), 5.0, endpoint
                                  ).add_done_callback(lambda f: f.cancelled() or f.exception())

    async def _sample_and_train(self, client, priorities, length: int,
                                pending: collections.deque) -> None:
        config = self.config
        turned = time.perf_counter()  # when the event loop last ran its other tasks
        while not self.node.stopping.is_set() and not self.handed_over.is_set() and \
                self.env_steps < config.num_env_steps:
            while len(pending) < config.prefetch:  # the next batches come while we train
                pending.append(await self._submit(client, length))
            waited = time.perf_counter()
            if waited - turned > _LOOP_TURN_S:
                # Awaiting a reply that drain() completed does not yield: with every reply
                # there in time the loop would never run the heartbeats, stop requests or
                # params sends (the supervisor killed such a learner for its silence).
                await asyncio.sleep(0)
                turned = time.perf_counter()
            client.drain()  # the reply that came while we trained: ready now, not next round
            try:
                # Kept on stop: cancelled below with the other requests in flight.
                envelope = await self.node.wait_or_stop(pending[0], cancel=False)
            except TimeoutError as exc:  # replay store restarting: ask again
                pending.popleft()
                log.warning("%s; asking again", exc)
                continue
            finally:
                self._wait_s += time.perf_counter() - waited
            if envelope is None:  # stopping; the rate limiter may hold this one forever
                break
            pending.popleft()
            reply = envelope if isinstance(envelope, ShardedBatch) else envelope.message
            shards = getattr(reply, "shards", None)  # each row's replay shard, if sharded
            self.env_steps = max(self.env_steps, reply.env_steps)
            exp = self.experience(reply.experience, getattr(envelope, "sender", ""))
            weights = torch.as_tensor(reply.importance_weights) if config.prioritized else None
            updates = self.alg.train_on_mini_batches(exp, config.mini_batch_size, weights)
            try:
                for rows in mini_batch_rows(exp, config.mini_batch_size):
                    started = time.perf_counter()
                    result = next(updates)
                    self._train_s += time.perf_counter() - started
                    if priorities is not None and result.priorities is not None:
                        await self._send_priorities(priorities, reply, rows, result.priorities,
                                                    shards)
                    await self.after_update(result.metrics)
            finally:  # a handover cancels training between two updates
                updates.close()

    @staticmethod
    async def _send_priorities(priorities, reply, rows: slice, values, shards) -> None:
        """New priorities of the rows trained on, each back to the shard that holds it."""
        if shards is None:
            await priorities.send(Priorities(reply.env_ids[rows], reply.positions[rows], values))
            return
        for shard, (env_ids, positions, part) in split_by_shard(
                shards[rows], reply.env_ids[rows], reply.positions[rows], values).items():
            await priorities.send(Priorities(env_ids, positions, part), key=shard)

    async def _submit(self, client, length: int):
        if not client.connections:
            # asyncio.timeout, not wait_for: before 3.12 wait_for can swallow the
            # cancellation a handover sends, and training would go on after it.
            async with asyncio.timeout(self.config.request_timeout_s):
                await client.wait_connected()
        size = self.config.mini_batch_size * self.config.batches_per_request
        request = SampleRequest(size, length, self.iteration, self.version)
        # Replay shards: one request drawn across them all; also while one of them restarts
        # (balances are exchanged with whichever shards are there, see ShardedSampler).
        if len(client.connections) > 1 or self.shards.masses:
            if self.shards.exchanges:
                self.node.status["balance_exchanges"] = self.shards.exchanges
            return self.shards.submit(request, self.config.request_timeout_s)
        return client.submit(request, self.config.request_timeout_s)

    def experience(self, rows: dict, sender: str) -> Experience:
        """A received batch as the algorithm's ``Experience``, checked at the first batch of
        each sender; the replay store's extras set apart (named in the status)."""
        self.check_rows(rows, sender)
        rows, extras = self.schema.without_extras(rows)
        if extras and "replay_extras" not in self.node.status:
            self.node.status["replay_extras"] = extras
            log.info("%s: replay extras %s are not used by %s", self.node.info.instance,
                     extras, self.config.agent.algorithm.name)
        return Experience.from_dict(to_torch(rows))

    def admit(self, msg: Trajectory, sender: str) -> bool:
        """Measure the unroll's policy lag; False when ``max_policy_lag`` drops it."""
        rows = msg.versions[:-1] if msg.versions else None  # the last row only bootstraps
        steps = len(rows) * len(msg.experience["step_type"][0]) if rows else 0
        admitted = self.lag.admit(rows, self.version, self.iteration, steps,
                                  f"{self.node.info.instance}: unroll from {sender}")
        self.node.status.update(self.lag.status())
        return admitted

    async def train_on_policy(self) -> None:
        trajectories = self.bus.subscriber("trajectories")
        async for envelope in trajectories:
            msg = envelope.message
            self.env_steps = max(self.env_steps, msg.env_steps)
            if not self.admit(msg, envelope.sender):
                continue
            started = time.perf_counter()
            exp = self.experience(msg.experience, envelope.sender)
            cancelled = False
            if self.config.publish_between_epochs:
                result, cancelled = await self._train_publishing_epochs(exp, started)
            else:
                result = self.alg.train_on(exp)
            took = time.perf_counter() - started
            self._train_s += took
            self._batch_s = took if self._batch_s is None else 0.7 * self._batch_s + 0.3 * took
            await self.after_update(result.metrics)
            if cancelled:  # a stop or a handover came mid-batch: the batch is whole first
                raise asyncio.CancelledError
            if self.env_steps >= self.config.num_env_steps:
                return

    async def _train_publishing_epochs(self, exp: Experience, started: float
                                       ) -> tuple[TrainResult, bool]:
        """``train_on`` with the parameters published between its epochs (each a version,
        with the seconds the batch is expected to go on for); ``(result, cancelled)``. A
        cancellation at a publish is held until the batch is trained whole, as it would be
        with ``train_on``: no state is handed over or checkpointed mid-batch."""
        stages, cancelled = self.alg.train_in_stages(exp), False
        while True:
            try:
                next(stages)
            except StopIteration as done:
                return done.value, cancelled
            if cancelled:
                continue
            elapsed = time.perf_counter() - started
            self.version += 1
            try:
                await self.publish_params(
                    eta_s=max(self._batch_s - elapsed, 0.0) if self._batch_s else 0.0)
            except asyncio.CancelledError:
                cancelled = True


async def run(config: Config, node, ready) -> dict:
    bus = node.bus
    learner = Learner(config, node)
    if not await learner.take_over():
        restore_from_checkpoint(learner, "learner", node.info.resume)
    discard_left_state(node, "learner_state")
    helper = start_state_server(bus, "learner_state", "learner", learner, learner.hand_over)
    await learner.publish_params()
    ready()
    try:
        while not await _train_until_handover(learner):
            # Handed over, and not stopped within the timeout: the swap failed, train on.
            try:
                async with asyncio.timeout(config.handover_timeout_s):
                    await node.stopping.wait()
                break
            except TimeoutError:
                log.warning("handed over but not stopped within %.0fs: training again",
                            config.handover_timeout_s)
                learner.handed_over.clear()
                learner.epoch = time.time_ns()
    finally:
        if helper is not None:
            helper.cancel()
    if learner.env_steps >= config.num_env_steps:  # finished: the final checkpoint is next
        leave_state(node, "learner_state", "learner", learner)
    return {"iteration": learner.iteration, "version": learner.version,
            "env_steps": learner.env_steps}


async def _train_until_handover(learner: Learner) -> bool:
    """Train until the budget or a stop (True), or until the state was handed over (False)."""
    learner.not_training.clear()
    training = asyncio.ensure_future(learner.train_on_policy() if learner.alg.on_policy
                                     else learner.train_off_policy())
    handover = asyncio.ensure_future(learner.handed_over.wait())
    try:
        await asyncio.wait({training, handover}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        handover.cancel()
        if not training.done():
            training.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await training
        learner.not_training.set()  # the state is final: a handover may snapshot it now
    if not training.cancelled():
        training.result()
    return not learner.handed_over.is_set()
