"""The learner's side of sharded replay: one sample request drawn across every replay shard.

With several servers of ``sample`` (a ``replay_store`` with replicas on a partitioned
``experience`` topic), a request of ``B`` items is split across the shards by a multinomial
draw over their sampling masses (``storage.sharding.split_batch``), each shard draws its part,
and the parts come back as one batch in random order: every item is then drawn with the
probability one store holding everything would give it. Masses are those each shard reported
with its last reply (one request old; a shard not heard from yet counts as the mean of the
others), and prioritized importance weights are rescaled to the global distribution. Each row
keeps the replica index of its shard, so priority updates go back where the item lives.

Each shard's samples-per-insert limiter counts the others' balance too (``others_credit``, as
last reported): the limit holds for the shards together, like one store's. Per shard it
deadlocks: under prioritized replay a shard with larger priorities is drawn from more than it
is filled, waits for inserts, and the learner's request waits on it, while a shard drawn from
less holds back inserts, and the unroller, blocked on it, feeds neither.

Balances learned with replies go stale, and stale ones deadlock the same way: a shard that got
no part of the last requests (or came back from a checkpoint) holds inserts on an old, high
balance of the others, while the shard the learner waits on counts an old, low one. So while a
request waits longer than ``EXCHANGE_S``, the learner exchanges balances with every shard
(``credit_only`` requests, answered at once) each ``EXCHANGE_S``: the first round hands out
what it knows and collects fresh balances, the next hands those out. Each shard then decides
on the same sum, which one store's limiter would: either the waiting part may be drawn, or
the held inserts may go.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from nodes.messages import SampleRequest
from storage.sharding import ShardMass, rescale_importance_weights, split_batch

# How long a sharded request waits before the learner exchanges balances with the shards
# (above any draw's time; only a rate limiter holds a part this long).
EXCHANGE_S = 0.25


@dataclass
class ShardedBatch:
    """What a ``SampleBatch`` holds, merged from several shards, plus each row's shard."""

    experience: dict
    env_ids: Any
    positions: Any
    importance_weights: Any
    env_steps: int
    shards: np.ndarray  # replica index of the shard each row came from


def shard_replica(sender: str) -> int:
    """Replica index of a reply's sender incarnation ("replay_store.1~3" -> 1)."""
    return int(sender.partition("~")[0].rpartition(".")[2])


class ShardedSampler:
    def __init__(self, client, prioritized: bool, seed: int = 0):
        self.client, self.prioritized = client, prioritized
        self.masses: dict[str, list] = {}  # endpoint -> its last [total, count, min, beta]
        self.steps: dict[str, int] = {}  # endpoint -> env steps it had inserted
        self.generator = torch.Generator().manual_seed(seed)
        self.rng = np.random.default_rng(seed)
        self.exchanges = 0  # rounds of balance exchanges (a request waited on a limiter)

    def submit(self, request, timeout: float) -> asyncio.Future:
        """Split ``request`` across the connected shards; a future of the merged batch."""
        endpoints = list(self.client.connections)
        known = [self.masses[e][0] for e in endpoints if e in self.masses]
        default = float(np.mean(known)) if known else 1.0
        counts = split_batch(request.batch_size,
                             [self.masses[e][0] if e in self.masses else default
                              for e in endpoints], self.generator).tolist()
        others = self._others(endpoints)
        parts = [(e, self.client.submit(replace(request, batch_size=k, others_credit=others[e]),
                                        timeout, endpoint=e))
                 for e, k in zip(endpoints, counts, strict=True) if k > 0]
        return asyncio.ensure_future(self._merge(parts))

    def _others(self, endpoints: list) -> dict:
        """Per shard, the sum of the other shards' rate-limiter balances as last reported."""
        credits = {e: self.masses[e][4] for e in endpoints if e in self.masses}
        everyone = sum(credits.values())
        return {e: everyone - credits.get(e, 0.0) for e in endpoints}

    async def _merge(self, parts: list) -> ShardedBatch:
        futures = [future for _, future in parts]
        try:
            while True:
                done, waiting = await asyncio.wait(futures, timeout=EXCHANGE_S,
                                                   return_when=asyncio.FIRST_EXCEPTION)
                for future in done:
                    if future.exception() is not None:
                        raise future.exception()
                if not waiting:
                    break
                await self._exchange_balances()
        except BaseException:
            for future in futures:
                future.cancel()
            raise
        envelopes = [future.result() for future in futures]
        for (endpoint, _), envelope in zip(parts, envelopes, strict=True):
            self._learn(endpoint, envelope.message)
        for endpoint in set(self.steps) - set(self.client.connections):
            self.steps.pop(endpoint)  # a shard that went away (its steps are gone with it)
            self.masses.pop(endpoint, None)
        replies = [envelope.message for envelope in envelopes]
        order = self.rng.permutation(sum(len(r.env_ids) for r in replies))
        weights = [self._global_weights(endpoint, r) for (endpoint, _), r in zip(parts, replies, strict=True)]

        def joined(arrays):
            return np.concatenate([np.asarray(a) for a in arrays])[order]

        return ShardedBatch(
            experience={k: joined([r.experience[k] for r in replies])
                        for k in replies[0].experience},
            env_ids=joined([r.env_ids for r in replies]),
            positions=joined([r.positions for r in replies]),
            importance_weights=joined(weights),
            env_steps=sum(self.steps.values()),
            shards=joined([np.full(len(r.env_ids), shard_replica(e.sender), np.int64)
                           for e, r in zip(envelopes, replies, strict=True)]))

    def _learn(self, endpoint: str, reply) -> None:
        if reply.mass is not None:
            self.masses[endpoint] = list(reply.mass)
        self.steps[endpoint] = int(reply.env_steps)

    async def _exchange_balances(self) -> None:
        """One round: every shard gets the others' balances as known now and answers with its
        own (a shard that does not answer within the round is left out of it)."""
        self.exchanges += 1
        endpoints = list(self.client.connections)
        others = self._others(endpoints)
        probe = SampleRequest(0, 0, -1, credit_only=True)
        exchanges = [(e, self.client.submit(replace(probe, others_credit=others[e]),
                                            4 * EXCHANGE_S, endpoint=e)) for e in endpoints]
        replies = await asyncio.gather(*(f for _, f in exchanges), return_exceptions=True)
        for (endpoint, _), envelope in zip(exchanges, replies, strict=True):
            if not isinstance(envelope, BaseException):
                self._learn(endpoint, envelope.message)

    def _global_weights(self, endpoint: str, reply):
        if not self.prioritized or reply.mass is None:
            return np.asarray(reply.importance_weights)
        total, count, smallest, beta = reply.mass[:4]
        masses = [ShardMass(m[0], int(m[1]), m[2]) for m in self.masses.values()]
        return rescale_importance_weights(
            reply.importance_weights, ShardMass(total, int(count), smallest), masses,
            None if beta < 0 else beta).numpy()
