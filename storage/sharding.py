"""Sampling several replay shards as if one store held everything (Ape-X's sharded replay).

Experience is sharded by environment: every environment's steps live in one shard, chosen
stably (``shard_for_env``). A shard's sum tree holds each slot's sampling mass (1 per valid
start when sampling uniformly, ``(priority + eps) ** alpha`` with PER), so its total is the
shard's share of the whole. A batch of ``B`` is split across shards by a multinomial draw
over those totals (``split_batch``) and each shard draws its part by its own leaves, so any
draw picks slot i with probability ``mass_i / sum of all masses``: the distribution of one
store holding everything. Importance weights must then use the global count, total and
smallest leaf (``global_importance_weights``), and a priority update goes back to the shard
that holds the item (the shard index travels with the sample).

Pure functions over ``ReplayBuffer``s and numbers: where the shards live (processes,
machines) is the caller's business.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch


class ShardMass(NamedTuple):
    """What a shard tells the sampler: its total mass, valid slots and smallest leaf."""

    total: float
    count: int
    min_leaf: float


def shard_for_env(env_ids, num_shards: int, envs_per_runner: int = 1):
    """The shard of each global env id: a runner's environments (``envs_per_runner``
    consecutive ids) all land in one shard, runners dealt round-robin."""
    if num_shards < 1 or envs_per_runner < 1:
        raise ValueError("num_shards and envs_per_runner must be positive")
    env_ids = np.asarray(env_ids)
    if env_ids.size and env_ids.min() < 0:
        raise ValueError("env ids must be >= 0")
    return (env_ids // envs_per_runner) % num_shards


def shard_mass(buffer) -> ShardMass:
    """A ``ReplayBuffer``'s sampling mass for the current ``batch_length`` (set it first
    with ``buffer.sampler.set_batch_length``)."""
    tree = buffer.sampler.sum_tree
    count = tree.nnz
    leaves = tree.leaves()
    min_leaf = float(leaves[leaves > 0].min()) if count else float("inf")
    return ShardMass(float(tree.total()), int(count), min_leaf)


def split_batch(batch_size: int, masses, generator: torch.Generator | None = None):
    """How many of a batch each shard draws: multinomial over the shards' total masses.

    ``masses`` are ``ShardMass``es or plain totals. Returns an int64 tensor, one count per
    shard, summing to ``batch_size``; an empty shard (mass 0) draws nothing.
    """
    totals = torch.tensor([float(getattr(m, "total", m)) for m in masses], dtype=torch.float64)
    if batch_size < 0:
        raise ValueError(f"batch_size must be >= 0, got {batch_size}")
    if bool((totals < 0).any()) or not bool(torch.isfinite(totals).all()):
        raise ValueError("shard masses must be finite and >= 0")
    if batch_size == 0:
        return torch.zeros(len(totals), dtype=torch.int64)
    if not float(totals.sum()) > 0:
        raise ValueError("nothing to sample in any shard")
    draws = torch.multinomial(totals, batch_size, replacement=True, generator=generator)
    return torch.bincount(draws, minlength=len(totals))


def leaf_values(buffer, env_ids, positions) -> torch.Tensor:
    """The sampling mass of stored (env, position) pairs of one shard (float64)."""
    env_ids = torch.as_tensor(env_ids, dtype=torch.int64)
    positions = torch.as_tensor(positions, dtype=torch.int64)
    slots = env_ids * buffer.max_length + positions % buffer.max_length
    return buffer.sampler.sum_tree.leaves()[slots.to(buffer.device)].cpu()


def global_importance_weights(leaves, masses, beta: float | None) -> torch.Tensor:
    """Importance weights of items drawn across shards, as one store would give them.

    ``leaves``: each drawn item's mass (``leaf_values``); ``masses``: every shard's
    ``ShardMass``. With ``beta=None``: ALF's ``N * P(i)``; else PER's ``(N * P(i)) ** -beta``
    over its largest value (at the smallest leaf of all shards).
    """
    leaves = torch.as_tensor(leaves, dtype=torch.float64)
    total = sum(m.total for m in masses)
    count = sum(m.count for m in masses)
    ratio = leaves * (count / total)
    if beta is None:
        return ratio.to(torch.float32)
    smallest = min(m.min_leaf for m in masses) * (count / total)
    return ((ratio / smallest) ** (-beta)).to(torch.float32)


def rescale_importance_weights(weights, shard: ShardMass, masses, beta: float | None):
    """Weights a shard computed from its own distribution, made global (what
    ``global_importance_weights`` gives) without the leaves: PER's ``(leaf / min) ** -beta``
    changes only by ``(min_shard / min_all) ** -beta``, ALF's ``N * P(i)`` by the ratio of
    the mean leaves ``(count / total)``."""
    weights = torch.as_tensor(weights, dtype=torch.float64)
    if beta is None:
        total = sum(m.total for m in masses)
        count = sum(m.count for m in masses)
        factor = (count / total) / (shard.count / shard.total)
    else:
        factor = (shard.min_leaf / min(m.min_leaf for m in masses)) ** (-beta)
    return (weights * factor).to(torch.float32)


def split_by_shard(shard_ids, *arrays) -> dict[int, tuple]:
    """Rows of ``arrays`` grouped by the shard each came from (``shard_ids``, one per row),
    in their original order: how a priority update goes back to the shards that hold the
    items. Returns ``{shard: (rows of each array...)}`` for the shards present."""
    shard_ids = np.asarray(shard_ids).reshape(-1)
    for a in arrays:
        if len(a) != shard_ids.shape[0]:
            raise ValueError(f"{len(a)} rows for {shard_ids.shape[0]} shard ids")
    groups = {}
    for shard in np.unique(shard_ids).tolist():
        rows = np.nonzero(shard_ids == shard)[0]
        groups[shard] = tuple(
            a[torch.from_numpy(rows)] if isinstance(a, torch.Tensor) else np.asarray(a)[rows]
            for a in arrays
        )
    return groups
