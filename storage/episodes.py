"""Episode bookkeeping over the rings (ALF's ``keep_episodic_info``).

For every stored step we keep the position of its episode's FIRST step (``begin``) and,
once the episode has ended, of its LAST step (``end``; -1 while the episode is open).
When a LAST arrives, the ``end`` of the episode's steps still stored is written in one
vectorized scatter; each step is written once, so the cost is O(1) per step. With
``record_episodic_return``, a step with discount 0 (termination) back-fills the
discounted return of every stored step since the previous FIRST or discount-0 step;
steps of episodes that have not terminated hold ``default_return`` (ALF's rule, which
also gives the newest step the default).
"""

from __future__ import annotations

import numpy as np
import torch

from storage import arrays
from storage.allocator import MemoryAllocator
from storage.nest import StepType
from storage.ring import host_array


class EpisodeIndex:
    def __init__(
        self,
        writer,
        allocator=None,
        record_episodic_return: bool = False,
        default_return: float = -1000.0,
        gamma: float = 0.99,
        reward_clip=None,
    ):
        allocator = allocator or MemoryAllocator()
        self.writer = writer
        self.num_envs, self.max_length = writer.num_envs, writer.max_length
        shape = (self.num_envs, self.max_length)
        self.begin = allocator.tensor("episodes.begin", shape, torch.int64)
        self.end = allocator.tensor("episodes.end", shape, torch.int64, -1)
        self.open_begin = allocator.tensor("episodes.open_begin", (self.num_envs,), torch.int64, -1)
        self.segment_begin = allocator.tensor(
            "episodes.segment_begin", (self.num_envs,), torch.int64
        )
        self.record_episodic_return = record_episodic_return
        self.default_return = float(default_return)
        self.gamma = float(gamma)
        self.reward_clip = reward_clip
        self.discounted_return = (
            allocator.tensor("episodes.return", shape, torch.float32, self.default_return)
            if record_episodic_return
            else None
        )
        self.device = self.begin.device
        self._bind_arrays()

    def _bind_arrays(self) -> None:
        # numpy views on a CPU (storage.arrays: torch's per-operation cost made the per-step
        # bookkeeping ~75 us per batch), the tensors elsewhere. The rare parts (an episode's
        # end, a return back-fill) stay torch.
        on_cpu = arrays.numpy_views(self.device)
        self._xp = np if on_cpu else torch
        view = (lambda t: t.numpy()) if on_cpu else (lambda t: t)
        self._begin, self._end = view(self.begin), view(self.end)
        self._open_begin, self._segment_begin = view(self.open_begin), view(self.segment_begin)
        self._return = None if self.discounted_return is None else view(self.discounted_return)

    def _arr(self, x):
        if self._xp is np:
            return np.asarray(host_array(x))
        return torch.as_tensor(x, device=self.device)

    def _tensor(self, a) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)) if self._xp is np else a

    def on_write(self, env_ids, pos, step_type, discount, reward) -> None:
        """Book the steps at (env_ids, pos): their data is written, the writer's cursors
        may or may not include them yet. Arrays may be tensors or numpy arrays."""
        xp, tensor = self._xp, self._tensor
        env_ids, pos = self._arr(env_ids), self._arr(pos)
        step_type = self._arr(step_type).reshape(-1)
        idx = pos % self.max_length
        first = step_type == int(StepType.FIRST)
        # Data that starts mid-episode (no FIRST seen) opens an episode at its first step.
        opened = self._open_begin[env_ids]
        fresh = first | (opened < 0)
        begin = xp.where(fresh, pos, opened)
        self._begin[env_ids, idx] = begin
        self._end[env_ids, idx] = -1
        self._open_begin[env_ids] = begin
        seg = xp.where(fresh, pos, self._segment_begin[env_ids])
        self._segment_begin[env_ids] = seg

        last = step_type == int(StepType.LAST)
        if bool(last.any()):
            e, p = tensor(env_ids[last]), tensor(pos[last])
            lo = torch.maximum(tensor(begin[last]), self._earliest(e, p))
            self._scatter_range(self.end, e, lo, p, p)
            self._open_begin[env_ids[last]] = -1

        if self._return is not None:
            self._return[env_ids, idx] = self.default_return
            discount = self._arr(discount)
            terminal = discount.reshape(discount.shape[0], -1)[:, 0] == 0
            if bool(terminal.any()):
                e, p = tensor(env_ids[terminal]), tensor(pos[terminal])
                self._backfill_returns(
                    e, torch.maximum(tensor(seg[terminal]), self._earliest(e, p)), p
                )
                self._segment_begin[env_ids[terminal]] = pos[terminal] + 1

    def _earliest(self, env_ids, pos):
        """The earliest position stored once ``pos`` is: ``on_write`` runs before the
        writer commits ``pos`` (so a kill never leaves a stored step unbooked)."""
        return torch.maximum(self.writer.earliest(env_ids), pos + 1 - self.max_length)

    def _scatter_range(self, target, env_ids, lo, hi_inclusive, values):
        """``target[e, pos % L] = value`` for lo <= pos <= hi, per environment."""
        counts = (hi_inclusive - lo + 1).clamp(min=0)
        if int(counts.sum()) == 0:
            return
        rep_env = env_ids.repeat_interleave(counts)
        starts = torch.cumsum(counts, 0) - counts
        offset = torch.arange(int(counts.sum()), device=self.device) - starts.repeat_interleave(
            counts
        )
        rep_pos = lo.repeat_interleave(counts) + offset
        target[rep_env, rep_pos % self.max_length] = values.repeat_interleave(counts)

    def _backfill_returns(self, env_ids, lo, terminal_pos):
        """G_j = sum_{i=j}^{T-1} gamma^(i-j) * discount_i * reward_{i+1}, for lo <= j < T."""
        storage = self._storage
        length = int((terminal_pos - lo).max()) + 1
        steps = torch.arange(length, device=self.device)
        pos = lo[:, None] + steps[None, :]
        inside = pos <= terminal_pos[:, None]
        idx = torch.where(inside, pos, terminal_pos[:, None]) % self.max_length
        rewards = storage.field("reward")[env_ids[:, None], idx].to(torch.float64)
        rewards = rewards.reshape(rewards.shape[0], length, -1).sum(-1)
        if self.reward_clip is not None:
            rewards = rewards.clamp(*self.reward_clip)
        discounts = storage.field("discount")[env_ids[:, None], idx].to(torch.float64)
        discounts = discounts.reshape(discounts.shape[0], length, -1)[..., 0]
        # term_j = discount_j * reward_{j+1}; zero past the terminal step.
        term = torch.zeros_like(rewards)
        term[:, :-1] = discounts[:, :-1] * rewards[:, 1:]
        term = torch.where(inside & (pos < terminal_pos[:, None]), term, torch.zeros_like(term))
        powers = self.gamma ** steps.to(torch.float64)
        scaled = term * powers
        returns = scaled.flip(1).cumsum(1).flip(1) / powers
        write = inside & (pos < terminal_pos[:, None])
        self.discounted_return[env_ids[:, None].expand_as(idx)[write], idx[write]] = returns[
            write
        ].to(torch.float32)

    def attach_storage(self, storage) -> None:
        self._storage = storage

    def begin_position(self, env_ids, pos):
        return self.begin[env_ids, pos % self.max_length]

    def steps_to_episode_end(self, env_ids, pos):
        end = self.end[env_ids, pos % self.max_length]
        newest = self.writer.current_pos[env_ids] - 1
        return torch.where(end >= 0, end, newest) - pos

    def clear(self, env_ids) -> None:
        self.begin[env_ids] = 0
        self.end[env_ids] = -1
        self.open_begin[env_ids] = -1
        self.segment_begin[env_ids] = 0
        if self.discounted_return is not None:
            self.discounted_return[env_ids] = self.default_return

    def state_dict(self) -> dict:
        state = {
            "begin": self.begin.clone(),
            "end": self.end.clone(),
            "open_begin": self.open_begin.clone(),
            "segment_begin": self.segment_begin.clone(),
        }
        if self.discounted_return is not None:
            state["discounted_return"] = self.discounted_return.clone()
        return state

    def load_state_dict(self, state: dict) -> None:
        for name, value in state.items():
            getattr(self, name).copy_(value)
