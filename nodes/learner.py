"""learner: ALF's training iterations, fed by the replay store (off-policy) or by unrolls.

Off-policy: it asks the ``sample`` service for ``[mini_batch_size, mini_batch_length]`` batches,
keeping the next ``prefetch`` requests in flight while it trains on the current batch, runs
``train_on`` with the importance weights when replay is prioritized, publishes the new
priorities, and every ``publish_params_every`` updates publishes the policy parameters with a
version that only grows. How many updates per environment step is the replay store's rate
limiter's business (``samples_per_insert``), as in Reverb.

On-policy: it trains on each ``[T + 1, B]`` unroll from ``trajectories`` and publishes new
parameters after every one (the unroller bounds the policy lag).

The run's env-step budget is counted here: at ``num_env_steps`` the learner finishes, which ends
a graph that lists it in ``run.stop_when``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import time
from dataclasses import dataclass, field

import torch

from algorithms.data import Experience
from nodes._common import AlgorithmConfig, make_algorithm, to_torch
from nodes.messages import Metrics, Params, Priorities, SampleRequest, StateReply

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Config(AlgorithmConfig):
    num_env_steps: int = field(default=100_000, metadata={"doc": "env-step budget of the run"})
    mini_batch_size: int = field(default=256, metadata={"doc": "replay batch size B"})
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
    request_timeout_s: float = field(default=120.0, metadata={"doc": "sample reply timeout"})
    seed: int = field(default=0, metadata={"doc": "torch seed"})
    num_threads: int = field(default=1, metadata={"doc": "torch threads"})


class Learner:
    def __init__(self, config: Config, node):
        bus = node.bus
        torch.manual_seed(config.seed)
        torch.set_num_threads(config.num_threads)
        self.config, self.node, self.bus = config, node, bus
        self.alg = make_algorithm(config.env_id, config.algorithm, node.info.device,
                                  config.env_kwargs)
        self.params = bus.publisher("params")
        self.metrics = bus.publisher("metrics") if bus.publishes("metrics") else None
        self.version = 0
        self.iteration = 0
        self.env_steps = 0
        self.last_metrics: dict = {}
        self._report_at = time.monotonic() + config.metrics_interval_s
        self._updates_at_report = 0
        # Where the learner's time goes between reports: training vs waiting for data.
        self._train_s = 0.0
        self._wait_s = 0.0

    async def publish_params(self) -> None:
        await self.params.send(Params(self.version, self.env_steps,
                                      self.alg.policy_state_dict()))
        self.node.status["version"] = self.version

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
            await self.metrics.send(Metrics(self.node.info.instance, self.env_steps, {
                **metrics, **timing, "learner/iteration": self.iteration,
                "learner/version": self.version}))

    def state(self) -> dict:
        return {"algorithm": self.alg.checkpoint_state(), "version": self.version,
                "iteration": self.iteration, "env_steps": self.env_steps}

    def restore(self, state: dict) -> None:
        self.alg.load_checkpoint_state(state["algorithm"])
        self.version = int(state["version"])
        self.iteration = int(state["iteration"])
        self.env_steps = int(state["env_steps"])

    async def train_off_policy(self) -> None:
        config = self.config
        client = self.bus.client("sample")
        priorities = self.bus.publisher("priorities") if config.prioritized else None
        length = config.mini_batch_length or getattr(self.alg, "mini_batch_length", 2)
        pending: collections.deque = collections.deque()  # sample requests in flight, FIFO
        while not self.node.stopping.is_set() and self.env_steps < config.num_env_steps:
            while len(pending) < config.prefetch:  # the next batches come while we train
                pending.append(await self._submit(client, length))
            waited = time.perf_counter()
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
            reply = envelope.message
            self.env_steps = max(self.env_steps, reply.env_steps)
            batch = to_torch(reply.experience)
            size = config.mini_batch_size
            for first in range(0, size * config.batches_per_request, size):
                rows = slice(first, first + size)
                exp = Experience.from_dict({k: v[rows] for k, v in batch.items()})
                weights = torch.as_tensor(reply.importance_weights[rows]) \
                    if config.prioritized else None
                started = time.perf_counter()
                result = self.alg.train_on(exp, weights)
                self._train_s += time.perf_counter() - started
                if priorities is not None and result.priorities is not None:
                    await priorities.send(Priorities(reply.env_ids[rows], reply.positions[rows],
                                                     result.priorities))
                await self.after_update(result.metrics)
        for request in pending:
            request.cancel()
        # Tell the replay store we stopped sampling, so it stops holding back inserts.
        with contextlib.suppress(TimeoutError):
            client.submit(SampleRequest(0, 0, self.iteration), 5.0).add_done_callback(
                lambda f: f.exception())

    async def _submit(self, client, length: int):
        await asyncio.wait_for(client._available.wait(), self.config.request_timeout_s)
        size = self.config.mini_batch_size * self.config.batches_per_request
        return client.submit(SampleRequest(size, length, self.iteration, self.version),
                             self.config.request_timeout_s)

    async def train_on_policy(self) -> None:
        trajectories = self.bus.subscriber("trajectories")
        async for envelope in trajectories:
            msg = envelope.message
            self.env_steps = max(self.env_steps, msg.env_steps)
            started = time.perf_counter()
            result = self.alg.train_on(Experience.from_dict(to_torch(msg.experience)))
            self._train_s += time.perf_counter() - started
            await self.after_update(result.metrics)
            if self.env_steps >= self.config.num_env_steps:
                return


async def run(config: Config, node, ready) -> dict:
    bus = node.bus
    learner = Learner(config, node)
    if node.info.resume:
        path = os.path.join(node.info.resume, "learner.pt")
        if os.path.exists(path):
            learner.restore(torch.load(path, weights_only=True))
            log.info("learner restored from %s: version %d, env_steps %d", path,
                     learner.version, learner.env_steps)
    state_server = bus.server("learner_state") if bus.publishes("learner_state") else None

    async def serve_state():
        async for request in state_server:
            await request.reply(StateReply("learner", learner.env_steps, learner.state()))

    helper = asyncio.ensure_future(serve_state()) if state_server else None
    await learner.publish_params()
    ready()
    try:
        if learner.alg.on_policy:
            await learner.train_on_policy()
        else:
            await learner.train_off_policy()
    finally:
        if helper is not None:
            helper.cancel()
    return {"iteration": learner.iteration, "version": learner.version,
            "env_steps": learner.env_steps}
