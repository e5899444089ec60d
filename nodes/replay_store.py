"""replay_store: owns the ALF-compatible ReplayBuffer and serves samples from it.

Ingests ``experience`` (reliable), answers ``sample`` requests, applies ``priorities``, and
rate-limits sampling against insertion like Reverb's rate limiter: with ``samples_per_insert``
set, ``inserted * spi - sampled`` must stay within ``[-spi_tolerance, +spi_tolerance]`` items;
a sample request that would go below waits for inserts, and ingestion pauses (backpressure on
the unroller, nothing dropped) when it would go above. Nothing is sampled before
``min_size_to_sample`` steps are stored. A sample request of size 0 means the learner left:
inserts are no longer held back (so producers can drain at the end of a run).

All of this runs on one event loop, so the buffer needs no lock; a checkpoint gets a copy of
the buffer's state (``state_dict`` clones), so ingest and sampling go on while the checkpointer
writes it.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
from dataclasses import dataclass, field

import numpy as np
import torch

from nodes._common import resolve_device, to_torch
from nodes.messages import ExperienceBatch, Metrics, SampleBatch, StateReply
from storage import PER, ReplayBuffer, TensorSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Config:
    num_environments: int = field(metadata={"doc": "env ids are 0 .. num_environments - 1"})
    max_length: int = field(default=100_000, metadata={"doc": "steps kept per environment"})
    prioritized_sampling: bool = field(default=False, metadata={"doc": "segment-tree PER"})
    priority_replay_alpha: float = field(default=0.6, metadata={"doc": "priority exponent"})
    priority_replay_beta: float = field(default=0.4, metadata={"doc": "IS-weight exponent"})
    priority_replay_eps: float = field(default=1e-6, metadata={"doc": "added to priorities"})
    initial_priority: float = field(default=1.0, metadata={"doc": "priority of new steps"})
    recent_data_ratio: float = field(default=0.0, metadata={"doc": "share of recent samples"})
    recent_data_steps: int = field(default=1, metadata={"doc": "what counts as recent"})
    min_size_to_sample: int = field(default=1000, metadata={"doc": "steps before sampling"})
    samples_per_insert: float | None = field(default=None, metadata={"doc": "rate limit"})
    spi_tolerance: float = field(default=10_000.0, metadata={"doc": "rate limit slack, items"})
    seed: int = field(default=0, metadata={"doc": "sampling seed"})
    storage_dir: str | None = field(default=None, metadata={
        "doc": "memory-map the buffer here (relative to the run directory): a restarted store "
               "re-attaches to it and loses nothing, instead of going back to a checkpoint"})
    metrics_interval_s: float = field(default=5.0, metadata={"doc": "metrics period"})


class RateLimiter:
    """Reverb-style samples-per-insert limiter (disabled when ``spi`` is None)."""

    def __init__(self, spi: float | None, tolerance: float, min_size: int):
        self.spi, self.tolerance, self.min_size = spi, tolerance, min_size
        self.inserted = 0
        self.sampled = 0
        self.sampler_active = True  # False once the learner said it left: stop holding inserts
        self.changed = asyncio.Event()

    def _diff(self) -> float:
        return max(0, self.inserted - self.min_size) * self.spi - self.sampled

    def can_sample(self, items: int) -> bool:
        if self.inserted < self.min_size:
            return False
        return self.spi is None or self._diff() - items >= -self.tolerance

    def can_insert(self, items: int) -> bool:
        if self.spi is None or not self.sampler_active or self.inserted + items <= self.min_size:
            return True
        return self._diff() + items * self.spi <= self.tolerance

    def on_insert(self, items: int) -> None:
        self.inserted += items
        self.changed.set()

    def on_sample(self, items: int) -> None:
        self.sampled += items
        self.changed.set()


def _write_spec(path: str, spec: dict) -> None:
    data = {k: {"shape": list(s.shape), "dtype": str(s.dtype).replace("torch.", "")}
            for k, s in spec.items()}
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


class ReplayStore:
    def __init__(self, config: Config, node):
        bus = node.bus
        self.config, self.node, self.bus = config, node, bus
        self.device = resolve_device(node.info.device)
        self.buffer: ReplayBuffer | None = None
        self.limiter = RateLimiter(config.samples_per_insert, config.spi_tolerance,
                                   config.min_size_to_sample)
        self.pending: collections.deque = collections.deque()  # sample requests that wait
        self.rejected_priorities = 0
        self.priority_updates = 0  # messages applied (rows of overwritten steps are ignored)

    @property
    def storage_dir(self) -> str | None:
        if self.config.storage_dir is None:
            return None
        return os.path.join(self.node.info.run_dir, self.config.storage_dir)

    def make_buffer(self, experience: dict) -> None:
        spec = {k: TensorSpec(tuple(np.shape(v))[1:], torch.from_numpy(np.array(v[:1])).dtype)
                for k, v in experience.items()}
        if self.storage_dir is not None:
            os.makedirs(self.storage_dir, exist_ok=True)
            _write_spec(os.path.join(self.storage_dir, "spec.json"), spec)
        per = PER(self.config.priority_replay_alpha, self.config.priority_replay_beta,
                  self.config.priority_replay_eps) if self.config.prioritized_sampling else None
        self.buffer = ReplayBuffer(
            spec, self.config.num_environments, self.config.max_length,
            prioritized_sampling=self.config.prioritized_sampling,
            initial_priority=self.config.initial_priority,
            recent_data_ratio=self.config.recent_data_ratio,
            recent_data_steps=self.config.recent_data_steps,
            device=self.device, per=per, seed=self.config.seed, storage_dir=self.storage_dir)

    def reattach(self) -> bool:
        """Map the buffer a previous incarnation left in ``storage_dir``; True if there was one.

        The insert counter is the sum of the per-environment write positions (positions only
        grow), so it survives with the data."""
        path = os.path.join(self.storage_dir or "", "spec.json")
        if self.storage_dir is None or not os.path.exists(path):
            return False
        with open(path) as f:
            spec = json.load(f)
        self.make_buffer({k: np.zeros((1, *s["shape"]), dtype=s["dtype"])
                          for k, s in spec.items()})
        self.limiter.inserted = int(self.buffer.writer.current_pos.sum())
        self.limiter.sampled = int(self.limiter.inserted * (self.limiter.spi or 0))
        return True

    def insert(self, msg: ExperienceBatch) -> None:
        env_ids = np.asarray(msg.env_ids)
        if env_ids.size and (env_ids.min() < 0 or env_ids.max() >= self.config.num_environments):
            raise ValueError(f"experience for env id {int(env_ids.max())} but replay_store "
                             f"num_environments is {self.config.num_environments}")
        if self.buffer is None:
            self.make_buffer(msg.experience)
        self.buffer.add_batch(to_torch(msg.experience), torch.from_numpy(env_ids.copy()),
                              version=msg.version)
        self.limiter.on_insert(len(env_ids))

    def sample(self, req) -> SampleBatch:
        data, info = self.buffer.get_batch(req.batch_size, req.batch_length,
                                           learner_iter=req.learner_iter)
        self.limiter.on_sample(req.batch_size)
        return SampleBatch({k: v.cpu() for k, v in data.items()}, info.env_ids.cpu(),
                           info.positions.cpu(), info.importance_weights.cpu(),
                           self.limiter.inserted)

    async def serve_pending(self) -> None:
        """Answer the waiting sample requests the rate limiter now allows, in order."""
        while self.pending:
            request = self.pending[0]
            msg = request.message
            if not self.limiter.can_sample(msg.batch_size):
                return
            self.pending.popleft()
            await request.reply(self.sample(msg))

    def update_priorities(self, msg) -> None:
        if self.buffer is None or not self.config.prioritized_sampling:
            return
        self.priority_updates += 1
        applied = self.buffer.update_priority(
            torch.as_tensor(np.asarray(msg.env_ids)), torch.as_tensor(np.asarray(msg.positions)),
            torch.as_tensor(np.asarray(msg.priorities), dtype=torch.float32))
        self.rejected_priorities += int((~applied).sum()) if isinstance(applied, torch.Tensor) \
            else 0

    def state(self) -> dict:
        return {"buffer": self.buffer.state_dict() if self.buffer is not None else None,
                "spec": None if self.buffer is None else {
                    k: {"shape": list(s.shape), "dtype": str(s.dtype).replace("torch.", "")}
                    for k, s in self.buffer.data_spec.items()},
                "inserted": self.limiter.inserted, "sampled": self.limiter.sampled}

    def restore(self, state: dict) -> None:
        if state["buffer"] is not None:
            example = {k: np.zeros((1, *s["shape"]), dtype=s["dtype"])
                       for k, s in state["spec"].items()}
            self.make_buffer(example)
            self.buffer.load_state_dict(state["buffer"])
        self.limiter.inserted, self.limiter.sampled = state["inserted"], state["sampled"]


async def run(config: Config, node, ready) -> dict:
    bus = node.bus
    torch.set_num_threads(1)
    store = ReplayStore(config, node)
    if store.reattach():
        log.info("replay re-attached to %s: %d steps inserted", store.storage_dir,
                 store.limiter.inserted)
    elif node.info.resume:
        path = os.path.join(node.info.resume, "replay_store.pt")
        if os.path.exists(path):
            store.restore(torch.load(path, weights_only=True))
            log.info("replay restored from %s: %d steps inserted", path, store.limiter.inserted)
    experience = bus.subscriber("experience")
    priorities = bus.subscriber("priorities") if bus.subscribes("priorities") else None
    sampler = bus.server("sample")
    state_server = bus.server("replay_state") if bus.publishes("replay_state") else None
    metrics = bus.publisher("metrics") if bus.publishes("metrics") else None
    ready()

    async def ingest():
        while True:
            # Backpressure: the learner must catch up. When the run stops, drain regardless,
            # so the unroller's last experience is stored, not lost.
            while not (store.limiter.can_insert(config.num_environments)
                       or node.stopping.is_set()):
                store.limiter.changed.clear()
                await store.limiter.changed.wait()
            envelope = await experience.recv()
            if envelope is None:
                return
            store.insert(envelope.message)
            node.status["inserted"] = store.limiter.inserted
            await store.serve_pending()

    async def serve_samples():
        async for request in sampler:
            if request.message.batch_size == 0:  # the learner is leaving: release inserts
                store.limiter.sampler_active = False
                store.limiter.changed.set()
                await request.reply(request.message)
                continue
            store.limiter.sampler_active = True
            store.pending.append(request)
            await store.serve_pending()
            node.status["sampled"] = store.limiter.sampled

    async def apply_priorities():
        async for envelope in priorities:
            store.update_priorities(envelope.message)

    async def serve_state():
        async for request in state_server:
            await request.reply(StateReply("replay_store", store.limiter.inserted, store.state()))

    async def report():
        while True:
            await asyncio.sleep(config.metrics_interval_s)  # a reporting period
            size = int(store.buffer.total_size) if store.buffer is not None else 0
            await metrics.send(Metrics(node.info.instance, store.limiter.inserted, {
                "replay/size": size, "replay/inserted": store.limiter.inserted,
                "replay/sampled": store.limiter.sampled,
                "replay/stale_priority_updates": store.rejected_priorities}))

    async def wake_on_stop():
        await node.stopping.wait()
        store.limiter.changed.set()

    helpers = [asyncio.ensure_future(serve_samples()), asyncio.ensure_future(wake_on_stop())]
    if priorities is not None:
        helpers.append(asyncio.ensure_future(apply_priorities()))
    if state_server is not None:
        helpers.append(asyncio.ensure_future(serve_state()))
    if metrics is not None:
        helpers.append(asyncio.ensure_future(report()))
    main = asyncio.ensure_future(ingest())
    try:
        # Ends when the input is drained after a stop; any helper's error ends it too.
        done, _ = await asyncio.wait([main, *helpers[:1]], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
    finally:
        for task in [main, *helpers]:
            task.cancel()
    return {"inserted": store.limiter.inserted, "sampled": store.limiter.sampled,
            "priority_updates": store.priority_updates}
