"""Sharded replay's rate limit with stale balances (issue 12; a deadlock CI met in the graph).

Two real ``ReplayStore`` shards answer ``sample`` over real sockets through the store's own
request handling (``on_sample_request``, as its node runs it); the learner's
``ShardedSampler`` asks them. The learner's picture of shard 1's balance is stale (shard 1
came back from an older checkpoint and was then filled, or got no part of the last requests),
so the part sent to shard 0 carries a balance too low to be drawn. Waiting on it, the learner
exchanges balances with both shards, and the part goes once the sum of the fresh ones allows
it: never before, as one store's limiter would decide.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from nodes._sharded_sample import ShardedSampler
from nodes.messages import ExperienceBatch, SampleRequest
from nodes.replay_store import Config, ReplayStore
from tests.test_scaleout_sharded_sampler import shard_servers

SPI, TOLERANCE, MIN_SIZE = 4.0, 64, 8
BATCH = 16


def _store(tmp_path, replica: int, inserted: int, sampled: int) -> ReplayStore:
    """A shard holding ``inserted`` steps of one environment, its limiter at ``sampled``."""
    config = Config(num_environments=1, max_length=1000, prioritized_sampling=True,
                    min_size_to_sample=MIN_SIZE, samples_per_insert=SPI,
                    spi_tolerance=TOLERANCE)
    node = SimpleNamespace(  # what a store reads of its node: the topic's partitioning, paths
        bus=SimpleNamespace(topics={"experience": SimpleNamespace(partitioned=True)}),
        info=SimpleNamespace(device="cpu", run_dir=str(tmp_path), replica=replica))
    store = ReplayStore(config, node)
    for _ in range(inserted):
        _insert(store, replica)
    store.limiter.sampled = sampled
    return store


def _insert(store: ReplayStore, env: int) -> None:
    store.insert(ExperienceBatch(np.array([env]), {"observation": np.zeros((1, 2), np.float32)},
                                 version=0))


async def _scenario(tmp_path, shard1_sampled: int) -> dict:
    """Shard 0 is drawn past its own share (balance -60) and holds a request for BATCH items;
    shard 1's true balance is (40 - MIN_SIZE) * SPI - ``shard1_sampled``, while the learner
    last heard -100 from it. Returns what happened."""
    stores = [_store(tmp_path / "s0", 0, 40, 188), _store(tmp_path / "s1", 1, 40, shard1_sampled)]
    exchanges: list[list] = [[], []]
    exchanged = asyncio.Event()  # shard 1 took part in an exchange

    async def serve(server, replica: int) -> None:
        async for request in server:
            if request.message.credit_only:
                exchanges[replica].append(request.message.others_credit)
                if replica == 1:
                    exchanged.set()
            await stores[replica].on_sample_request(request)

    async with shard_servers(tmp_path, serve) as (client, endpoints):
        sampler = ShardedSampler(client, prioritized=True, seed=0)
        # What the learner last heard: [total, count, smallest, beta, balance]; shard 1's
        # mass is 0, so the whole request goes to shard 0.
        sampler.masses = {endpoints[0]: [40.0, 40, 1.0, 0.4, stores[0].limiter.own_diff()],
                          endpoints[1]: [0.0, 40, 1.0, 0.4, -100.0]}
        request = sampler.submit(SampleRequest(BATCH, 1, 0), timeout=20)
        assert not stores[0].limiter.can_sample(BATCH)  # -60 + -100 - 16 < -64: it waits
        out = {"stores": stores, "exchanges": exchanges}
        if shard1_sampled > 0:
            # The fresh sum does not allow the draw either: exchanges go on, the part waits
            # for an insert into shard 0 (awaited on the shards' answers, not on time).
            while len(exchanges[1]) < 3 and not request.done():
                exchanged.clear()
                waiter = asyncio.ensure_future(exchanged.wait())
                await asyncio.wait([request, waiter], timeout=15,
                                   return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
            out["waited_through_exchanges"] = not request.done()
            for _ in range(4):  # 4 inserts * SPI = 16 items of balance
                _insert(stores[0], 0)
            await stores[0].serve_pending()  # as the store's ingest does after each insert
        batch = await asyncio.wait_for(request, 15)
        out["rows"] = len(batch.env_ids)
        out["shards"] = set(batch.shards.tolist())
        return out


@pytest.mark.timeout(60)
def test_a_part_held_on_a_stale_balance_goes_once_the_shards_exchange_them(tmp_path):
    """Shard 1's true balance is +128: the sum (+68) allows the draw. Before the exchange the
    request waited forever (the graph stalled until the request's 120 s timeout, and again)."""
    out = asyncio.run(_scenario(tmp_path, shard1_sampled=0))
    assert out["rows"] == BATCH and out["shards"] == {0}
    # Shard 0 was handed shard 1's fresh balance; shard 1 got shard 0's.
    assert 128.0 in out["exchanges"][0], out["exchanges"]
    assert out["exchanges"][1] and out["exchanges"][1][0] == pytest.approx(-60.0)
    assert out["stores"][0].limiter.sampled == 188 + BATCH


@pytest.mark.timeout(60)
def test_the_exchange_never_draws_past_the_limit_of_the_shards_together(tmp_path):
    """Shard 1's true balance is -2 (sum -62): the 16 items would take it past -64. The
    exchanges go on while the part waits; it goes only after shard 0 got inserts."""
    out = asyncio.run(_scenario(tmp_path, shard1_sampled=130))
    assert out["waited_through_exchanges"], "the part was drawn past the shards' limit"
    assert out["rows"] == BATCH and len(out["exchanges"][1]) >= 3
    assert out["stores"][0].limiter.sampled == 188 + BATCH
