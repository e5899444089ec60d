"""Sampling across shards has the distribution of one store holding everything (chi-square)."""

from __future__ import annotations

import math
from collections import Counter, namedtuple

import pytest
import torch

from storage import PER, ReplayBuffer, TensorSpec
from storage.sharding import (
    ShardMass,
    global_importance_weights,
    leaf_values,
    shard_for_env,
    shard_mass,
    split_batch,
    split_by_shard,
)

Step = namedtuple("Step", ["observation"])
SPEC = Step(TensorSpec((), torch.int64))
LENGTH = 8
# Three shards of 1, 2 and 3 environments, filled to different levels (steps per env).
SHARD_FILL = [[8], [3, 6], [5, 2, 7]]


def chi_square_p_value(observed, expected):
    """Upper tail of chi-square (Wilson-Hilferty)."""
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
    k = len(observed) - 1
    z = ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


def build(fills, prioritized, seed, priorities):
    per = PER(alpha=0.6, beta=0.5, epsilon=0.01) if prioritized else None
    rb = ReplayBuffer(SPEC, len(fills), LENGTH, prioritized_sampling=prioritized, per=per,
                      seed=seed, with_replacement=True)
    for env, steps in enumerate(fills):
        for t in range(steps):
            rb.add_batch(Step(torch.tensor([100 * env + t])), torch.tensor([env]))
        if prioritized:
            p = torch.tensor([priorities[(env, t)] for t in range(steps)])
            rb.update_priority(torch.full((steps,), env), torch.arange(steps), p)
    return rb


def setup(prioritized):
    gen = torch.Generator().manual_seed(7)
    shards, everything_fills, priorities = [], [], []
    for i, fills in enumerate(SHARD_FILL):
        prio = {(e, t): float(torch.rand(1, generator=gen)) * 5 for e, n in enumerate(fills)
                for t in range(n)}
        priorities.append(prio)
        shards.append(build(fills, prioritized, seed=10 + i, priorities=prio))
        everything_fills += fills
    merged = {}
    offset = 0
    for fills, prio in zip(SHARD_FILL, priorities, strict=True):
        merged.update({(offset + e, t): p for (e, t), p in prio.items()})
        offset += len(fills)
    one_store = build(everything_fills, prioritized, seed=0, priorities=merged)
    return shards, one_store


def global_env(shard: int, env: int) -> int:
    return sum(len(f) for f in SHARD_FILL[:shard]) + env


@pytest.mark.parametrize("prioritized", [False, True])
@pytest.mark.parametrize("batch_length", [1, 2])
def test_sharded_sampling_matches_one_store(prioritized, batch_length):
    shards, one_store = setup(prioritized)
    for rb in (*shards, one_store):
        rb.sampler.set_batch_length(batch_length)
    # The one store's exact probability of every (global env, position).
    leaves = one_store.sampler.sum_tree.leaves()
    total = float(leaves.sum())
    expected = {}
    for slot in torch.nonzero(leaves).reshape(-1).tolist():
        env, idx = divmod(slot, LENGTH)
        expected[env, idx] = float(leaves[slot]) / total
    gen = torch.Generator().manual_seed(1)
    counts = Counter()
    draws = 0
    for _ in range(400):
        masses = [shard_mass(rb) for rb in shards]
        split = split_batch(64, masses, gen)
        assert int(split.sum()) == 64
        for i, (rb, n) in enumerate(zip(shards, split.tolist(), strict=True)):
            if n == 0:
                continue
            _, info = rb.get_batch(n, batch_length)
            for env, pos in zip(info.env_ids.tolist(), info.positions.tolist(), strict=True):
                counts[global_env(i, env), pos] += 1
        draws += 64
    assert set(counts) <= set(expected)
    keys = sorted(expected)
    p = chi_square_p_value([counts[k] for k in keys], [draws * expected[k] for k in keys])
    assert p > 1e-3, p


def test_global_weights_equal_the_one_store_weights():
    shards, one_store = setup(prioritized=True)
    masses = [shard_mass(rb) for rb in shards]
    count, total = sum(m.count for m in masses), sum(m.total for m in masses)
    for i, rb in enumerate(shards):
        _, info = rb.get_batch(16, 1)
        leaves = leaf_values(rb, info.env_ids, info.positions)
        got = global_importance_weights(leaves, masses, beta=0.5)
        # The same items' weights in the one store (its own PER weights, beta 0.5).
        envs = torch.tensor([global_env(i, e) for e in info.env_ids.tolist()])
        slots = envs * LENGTH + info.positions % LENGTH
        want = one_store.sampler.importance_weights(slots)
        assert torch.allclose(got, want, rtol=1e-5)
        # ALF's N * P(i) as well.
        alf = global_importance_weights(leaves, masses, beta=None)
        assert torch.allclose(alf.double(), leaves * count / total, rtol=1e-6)


def test_split_and_shard_choice_rules():
    assert split_batch(0, [1.0, 2.0]).tolist() == [0, 0]
    assert split_batch(10, [0.0, 3.0]).tolist() == [0, 10]  # an empty shard draws nothing
    assert split_batch(5, [ShardMass(0.0, 0, math.inf), ShardMass(2.0, 2, 1.0)]).tolist() == \
        [0, 5]
    with pytest.raises(ValueError, match="nothing to sample"):
        split_batch(4, [0.0, 0.0])
    with pytest.raises(ValueError, match="finite"):
        split_batch(4, [1.0, -1.0])
    # A runner's environments stay together; runners are dealt round-robin.
    assert shard_for_env(range(8), 2, envs_per_runner=2).tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    assert shard_for_env([5], 3).tolist() == [2]


def test_priority_updates_go_back_to_the_shard_that_holds_each_item():
    shards, _ = setup(prioritized=True)
    # A combined batch: rows from shards 2, 0, 2, 1 with their local env ids and positions.
    shard_ids = [2, 0, 2, 1]
    env_ids = torch.tensor([1, 0, 2, 0])
    positions = torch.tensor([1, 7, 6, 2])
    priorities = torch.tensor([4.0, 3.0, 2.0, 1.0])
    groups = split_by_shard(shard_ids, env_ids, positions, priorities)
    assert sorted(groups) == [0, 1, 2]
    assert groups[2][0].tolist() == [1, 2] and groups[2][2].tolist() == [4.0, 2.0]
    for shard, (e, p, prio) in groups.items():
        assert bool(shards[shard].update_priority(e, p, prio).all())
        assert shards[shard].sampler.priority[e * LENGTH + p % LENGTH].tolist() == prio.tolist()
    with pytest.raises(ValueError, match="3 rows for 4 shard ids"):
        split_by_shard(shard_ids, env_ids[:3])
