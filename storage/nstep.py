"""n-step returns read from the rings (pytorchrl's NStepReplayBuffer, ALF's conventions).

The TimeStep stored at position t carries the reward and discount of the transition that
led *into* t. So from a start t:

    G = sum_{k=1..m} gamma^(k-1) * (prod_{j=1..k-1} discount_{t+j}) * reward_{t+k}
    bootstrap_discount = gamma^m * prod_{j=1..m} discount_{t+j}

where m <= n stops early at the end of the episode (the first LAST step at or after t+1
is the last one used: a terminal LAST has discount 0 and kills the bootstrap, a
truncated LAST keeps it) or at the newest stored step. A start that is itself LAST has
m = 0: the step after it belongs to the next episode.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from storage.nest import StepType


class NStepResult(NamedTuple):
    returns: torch.Tensor  # [B, *reward_shape] float32
    bootstrap_discount: torch.Tensor  # [B] float32, multiplies V(bootstrap_position)
    bootstrap_positions: torch.Tensor  # [B] int64, t + steps
    steps: torch.Tensor  # [B] int64, m


def nstep_returns(buffer, env_ids, positions, n: int, gamma: float) -> NStepResult:
    """n-step returns from (env_ids, positions) of a ``ReplayBuffer``."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    env_ids = torch.as_tensor(env_ids, device=buffer.device)
    positions = torch.as_tensor(positions, device=buffer.device)
    offsets = torch.arange(n + 1, device=buffer.device)
    pos = positions[:, None] + offsets[None, :]  # [B, n+1]
    newest = buffer.writer.current_pos[env_ids][:, None] - 1
    stored = pos <= newest
    idx = torch.where(stored, pos, positions[:, None]) % buffer.max_length
    e = env_ids[:, None]
    step_type = buffer.storage.field("step_type")[e, idx]
    reward = buffer.storage.field("reward")[e, idx].to(torch.float64)
    discount = buffer.storage.field("discount")[e, idx].to(torch.float64)
    # usable[:, k] (k >= 1): step t+k is stored and no step in t..t+k-1 was LAST.
    is_last = (step_type == int(StepType.LAST)).to(torch.int64)
    last_before = torch.cumsum(is_last, 1) - is_last  # LASTs among t..t+k-1
    usable = stored & (last_before == 0)
    usable[:, 0] = False
    steps = usable.to(torch.int64).sum(1)
    # Products of discounts over steps 1..k-1 (for rewards) and 1..k (for bootstrap).
    d = torch.where(usable, discount, torch.ones_like(discount))
    d[:, 0] = 1.0
    cum_d = torch.cumprod(d, 1)  # prod_{j=1..k} d_{t+j}
    powers = gamma ** offsets.to(torch.float64)
    reward_weight = torch.zeros_like(cum_d)
    reward_weight[:, 1:] = powers[None, :-1] * cum_d[:, :-1]
    reward_weight = torch.where(usable, reward_weight, torch.zeros_like(reward_weight))
    extra = reward.dim() - 2
    rw = reward_weight.reshape(reward_weight.shape + (1,) * extra)
    returns = (rw * reward).sum(1)
    rows = torch.arange(env_ids.shape[0], device=buffer.device)
    bootstrap = powers[steps] * cum_d[rows, steps]
    bootstrap = torch.where(steps > 0, bootstrap, torch.zeros_like(bootstrap))
    return NStepResult(
        returns.to(torch.float32), bootstrap.to(torch.float32), positions + steps, steps
    )
