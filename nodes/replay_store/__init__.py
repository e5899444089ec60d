"""replay_store: owns the ALF-compatible ReplayBuffer and serves samples from it.

A package: ``store`` (the state and handlers), ``config`` (the keys and the buffer's controls),
``rate_limiter``, ``continuity`` (exactly once through restarts and swaps), ``shard`` (one
shard of several), ``offline`` (datasets served beside or instead of the experience); this
module runs the node's tasks in one ``TaskGroup``.

Ingests ``experience`` (reliable), answers ``sample`` requests, applies ``priorities``, and
rate-limits sampling against insertion like Reverb's rate limiter: with ``samples_per_insert``
set, ``inserted * spi - sampled`` must stay within ``[-spi_tolerance, +spi_tolerance]`` items;
a sample request that would go below waits for inserts, and ingestion pauses (backpressure on
the unroller, nothing dropped) when it would go above. Nothing is sampled before
``min_size_to_sample`` steps are stored. A sample request of size 0 means the learner left:
inserts are no longer held back (so producers can drain at the end of a run).

Replay controls from the config reach the buffer as its components (``storage``): ``max_use``
and ``max_staleness`` (in learner parameter versions: experience carries the version of the
policy that produced it, a sample request the learner's newest version), sampled-attribute
statistics and the throughput monitor (published as ``replay/...`` metrics), ERE or a fixed
``sample_range``, ``num_earliest_frames_ignored``, n-step returns and episodic information
added to each sample (``nstep.*``, ``episode.*`` fields, ``[B]``, of each sequence's first
step), prioritized replay whose IS exponent is annealed from ``beta_start`` to 1.0, and
frames stored once (``frame_stack``: stacks of the last k frames rebuilt per sample). A
sample request that finds nothing to sample (everything evicted or stale) waits for inserts,
and inserts are not held back meanwhile.

All of this runs on one event loop, so the buffer needs no lock; a checkpoint gets a copy of
the buffer's state (``state_dict`` clones), so ingest and sampling go on while the checkpointer
writes it.
"""

from __future__ import annotations

import asyncio
import logging

import torch

from nodes._common import restore_from_checkpoint, serve_state
from nodes.messages import (
    ExperienceBatch,
    Metrics,
    Priorities,
    SampleBatch,
    SampleRequest,
    StateReply,
    StateRequest,
)
from nodes.replay_store.config import Config
from nodes.replay_store.continuity import (
    handover_path,
    leave_handover,
    lost_at_restart,
    take_handover,
)
from nodes.replay_store.rate_limiter import RateLimiter
from nodes.replay_store.store import ReplayStore
from pipeline.ports import Port, Ports, Service

__all__ = ["PORTS", "Config", "RateLimiter", "ReplayStore", "exclusive", "run"]

log = logging.getLogger(__name__)


def exclusive(config: Config) -> bool:
    """Its replacement takes over what it holds: a memory-mapped store's files (one writer at a
    time, ``storage.allocator``), or an in-memory store's contents, left in a file when it is
    stopped for a replacement. So a swap or restart stops it first (``pipeline.kinds``)."""
    return True


def PORTS(config: Config) -> Ports:  # noqa: N802 - the name the pipeline looks for
    """What the graph entry may list (pipeline.ports), checked at load. A store loaded with
    datasets may go without ``experience``: an offline graph has no runners."""
    return Ports(subscribes={"experience": Port(ExperienceBatch,
                                                required=not config.datasets),
                             "priorities": Port(Priorities, required=False)},
                 serves={"sample": Service(SampleRequest, SampleBatch),
                         "replay_state": Service(StateRequest, StateReply, required=False)},
                 publishes={"metrics": Port(Metrics, required=False)})


def _come_back(store: ReplayStore, node) -> None:
    """Re-attach to its files, else take what a replaced predecessor left, else restore the
    newest checkpoint; then say what the ledger knows was lost with the previous process."""
    if store.reattach():
        log.info("replay re-attached to %s: %d steps inserted", store.storage_dir,
                 store.limiter.inserted)
    else:
        left = take_handover(handover_path(node.info.run_dir, node.info.instance)) \
            if node.info.run_dir else None
        if left is not None:
            store.restore(left)
        else:
            restore_from_checkpoint(store, store.component, node.info.resume)
    lost = lost_at_restart(store.ledger, store.limiter.inserted)
    if lost:
        node.status["lost_at_restart"] = lost
    node.status["inserted"] = store.limiter.inserted  # what it came back with


async def run(config: Config, node, ready) -> dict:
    bus = node.bus
    torch.set_num_threads(1)
    store = ReplayStore(config, node)
    store.ledger = node.ledger("experience", "stored")
    _come_back(store, node)
    if store.offline is not None:
        node.status["datasets"] = store.offline.describe()
    experience = bus.subscriber("experience") if bus.subscribes("experience") else None
    priorities = bus.subscriber("priorities") if bus.subscribes("priorities") else None
    sampler = bus.server("sample")
    metrics = bus.publisher("metrics") if bus.publishes("metrics") else None
    ready()

    async def ingest():
        if experience is None:  # offline: serve the datasets until the run stops
            await node.stopping.wait()
            return
        while True:
            # Backpressure: the learner must catch up. When the run stops, drain regardless,
            # so the unroller's last experience is stored, not lost.
            while not (store.limiter.can_insert(config.num_environments)
                       or node.stopping.is_set()):
                store.limiter.changed.clear()
                await store.limiter.changed.wait()
            # One wire message whole: a coalesced batch is stored together (the rate limiter
            # may be passed by the rest of it, at most COALESCE_MAX messages).
            envelopes = await experience.recv_message()
            if not envelopes:
                return
            first = envelopes[0]
            store.ingest(first.sender, first.seq, [e.message for e in envelopes])
            node.status["inserted"] = store.limiter.inserted
            if store.redelivered:
                node.status["redelivered"] = store.redelivered
            if "buffer" not in node.status:
                node.status["buffer"] = store.describe()
            await store.serve_pending()

    async def serve_samples():
        async for request in sampler:
            await store.on_sample_request(request)
            node.status["sampled"] = store.limiter.sampled

    async def apply_priorities():
        async for envelope in priorities:
            store.update_priorities(envelope.message)

    async def report():
        while True:
            await asyncio.sleep(config.metrics_interval_s)  # a reporting period
            node.status["buffer"] = store.describe()
            await metrics.send(Metrics(node.info.instance, store.limiter.inserted,
                                       store.metrics()))

    async def wake_on_stop():
        await node.stopping.wait()
        store.limiter.changed.set()

    try:
        # The run ends when the input is drained after a stop; any helper's error ends it
        # too, through the group (a priority task that died unseen once left the learner
        # blocked on a full topic).
        async with asyncio.TaskGroup() as group:
            helpers = [group.create_task(serve_samples()), group.create_task(wake_on_stop())]
            if priorities is not None:
                helpers.append(group.create_task(apply_priorities()))
            if bus.publishes("replay_state"):
                helpers.append(group.create_task(
                    serve_state(bus, "replay_state", store.component, store)))
            if metrics is not None:
                helpers.append(group.create_task(report()))
            await group.create_task(ingest())
            for task in helpers:  # they serve forever: the drained input ends them
                task.cancel()
        if node.replaced and store.storage_dir is None and store.buffer is not None \
                and node.info.run_dir:
            leave_handover(handover_path(node.info.run_dir, node.info.instance), store.state())
    finally:
        if store.buffer is not None:
            store.buffer.close()  # flush a memory-mapped buffer and release its directory
    return {"inserted": store.limiter.inserted, "sampled": store.limiter.sampled,
            "priority_updates": store.priority_updates, "buffer": store.describe()}
