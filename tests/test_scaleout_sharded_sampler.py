"""The learner's sharded sampler over real sockets (issue 12, replay sharding): two shard
servers answer ``sample`` from their own prioritized ReplayBuffers, and the items the sampler
draws across them are distributed as from one store holding everything (chi-square), with
importance weights equal to that store's and each row tagged with the shard holding it."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

import numpy as np
import pytest
import torch
import zmq
import zmq.asyncio

from nodes._sharded_sample import ShardedSampler
from nodes.messages import SampleBatch, SampleRequest
from nodes.replay_store.shard import sample_mass
from pipeline.bus import Bus
from pipeline.sockets import SocketFactory
from storage import PER, ReplayBuffer, TensorSpec
from storage.sharding import ShardMass, global_importance_weights, leaf_values
from tests.test_storage_sharding import chi_square_p_value

LENGTH = 8
FILLS = [[8, 2], [3, 6, 5]]  # steps per environment of shard 0 and shard 1
BETA = 0.5


def shard(fills, seed):
    rb = ReplayBuffer({"observation": TensorSpec((), torch.int64)}, len(fills), LENGTH,
                      prioritized_sampling=True, per=PER(alpha=0.6, beta=BETA, epsilon=0.01),
                      seed=seed, with_replacement=True)
    gen = torch.Generator().manual_seed(seed)
    for env, steps in enumerate(fills):
        for t in range(steps):
            rb.add_batch({"observation": torch.tensor([100 * env + t])}, torch.tensor([env]))
        rb.update_priority(torch.full((steps,), env), torch.arange(steps),
                           torch.rand(steps, generator=gen) * 5)
    rb.sampler.set_batch_length(1)
    return rb


async def serve(server, rb, replica):
    async for request in server:
        msg = request.message
        data, info = rb.get_batch(msg.batch_size, msg.batch_length)
        await request.reply(SampleBatch({"observation": data["observation"].numpy()},
                                        info.env_ids.numpy(), info.positions.numpy(),
                                        info.importance_weights.numpy(), 100 + replica,
                                        sample_mass(rb)))


@contextlib.asynccontextmanager
async def shard_servers(tmp_path, serve, count: int = 2):
    """``count`` replay-shard buses, each answering ``sample`` with ``serve(server, replica)``
    over real ipc sockets, and a learner's bus: yields the learner's ``sample`` client,
    connected to all of them, and their endpoints in replica order."""
    ctx = zmq.asyncio.Context()
    buses = [Bus(f"replay_store.{i}~0", "replay_store", {}, {"sample": f"ipc://{tmp_path}/s{i}"},
                 {}, sockets=SocketFactory(ctx)) for i in range(count)]
    learner = Bus("learner.0~0", "learner", {}, {}, {}, sockets=SocketFactory(ctx))
    tasks = [asyncio.ensure_future(serve(bus.server("sample"), i)) for i, bus in enumerate(buses)]
    try:
        endpoints = [bus.servers["sample"].endpoint for bus in buses]
        learner.set_peers({}, {"sample": endpoints})
        yield learner.client("sample"), endpoints
    finally:
        for task in tasks:
            task.cancel()
        for bus in (*buses, learner):
            bus.close()
        ctx.term()


async def _draw(tmp_path):
    shards = [shard(fills, seed=3 + i) for i, fills in enumerate(FILLS)]
    async with shard_servers(tmp_path, lambda server, i: serve(server, shards[i], i),
                             len(shards)) as (client, _):
        sampler = ShardedSampler(client, prioritized=True, seed=5)
        await sampler.submit(SampleRequest(64, 1, 0), 10)  # learns every shard's mass
        masses = [ShardMass(*sample_mass(rb)[:3]) for rb in shards]
        counts, draws = Counter(), 0
        for _ in range(300):
            batch = await sampler.submit(SampleRequest(64, 1, 0), 10)
            assert len(batch.env_ids) == 64 and batch.env_steps == 100 + 101
            for row, (s, env, pos) in enumerate(zip(batch.shards.tolist(), batch.env_ids.tolist(),
                                                    batch.positions.tolist(), strict=True)):
                counts[s, env, pos] += 1
                # Each row is what its shard stores there (observation 100 * env + pos).
                assert batch.experience["observation"][row, 0] == 100 * env + pos
            draws += 64
        for s, rb in enumerate(shards):  # weights as one store would give them
            rows = batch.shards == s
            leaves = leaf_values(rb, batch.env_ids[rows], batch.positions[rows])
            want = global_importance_weights(leaves, masses, beta=BETA)
            assert np.allclose(batch.importance_weights[rows], want.numpy(), rtol=1e-5)
        return counts, draws, shards


@pytest.mark.timeout(60)
def test_sampling_across_shards_is_distributed_as_one_store(tmp_path):
    counts, draws, shards = asyncio.run(asyncio.wait_for(_draw(tmp_path), 40))
    expected = {}
    total = sum(float(rb.sampler.sum_tree.total()) for rb in shards)
    for s, rb in enumerate(shards):
        leaves = rb.sampler.sum_tree.leaves()
        for slot in torch.nonzero(leaves).reshape(-1).tolist():
            env, idx = divmod(slot, LENGTH)
            expected[s, env, idx] = float(leaves[slot]) / total
    assert set(counts) <= set(expected)
    keys = sorted(expected)
    p = chi_square_p_value([counts[k] for k in keys], [draws * expected[k] for k in keys])
    assert p > 1e-3, p
    # Both shards were drawn from, in proportion to their masses.
    share0 = sum(v for k, v in counts.items() if k[0] == 0) / draws
    want0 = sum(v for k, v in expected.items() if k[0] == 0)
    assert abs(share0 - want0) < 0.03, (share0, want0)
