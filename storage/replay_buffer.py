"""ALF's ``RingBuffer`` and ``ReplayBuffer``: a thin composition of the storage parts.

``RingStorage`` (where the bytes are), ``RingWriter`` (which slot is written next),
``SlotSampler`` (which slots are read; the trees live there), ``EpisodeIndex`` (episode
bookkeeping) and ``BufferControl``s (DI-engine's eviction and monitoring) do the work;
the classes here wire them behind ALF's names, arguments and semantics.

Deliberate differences from ALF, each fixing a defect our asynchronous feeders hit:

* ``clear()`` (all or some environments) forgets priorities, evictions and use counts,
  and keeps positions growing, so a late ``update_priority`` for cleared data is
  recognised as stale and ignored;
* environments holding fewer than ``batch_length`` steps are simply not sampled (ALF
  asserted that every environment had enough) and sampling is uniform over valid steps;
* the sampling mask is kept apart from learned priorities (see ``sampler.py``), so
  changing ``batch_length`` or restoring a checkpoint loses no priority and gives the
  same importance weights;
* ``update_priority`` ignores positions already overwritten and rejects positions never
  written; duplicate indices count once in the trees;
* ``gather_all`` on an empty buffer returns empty ``[B, 0, ...]`` tensors.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from storage.controls import BufferControl
from storage.episodes import EpisodeIndex
from storage.nest import get_field, has_field, map_structure
from storage.ring_buffer import BatchInfo, RingBuffer, SlotInfo, _batch_size
from storage.sampler import PER


class ReplayBuffer(RingBuffer):
    """ALF's replay buffer (see the module docstring for where it deliberately differs).

    Arguments are ALF's, plus keyword-only components:

    Args:
        per: a ``PER(alpha, beta, epsilon)`` for pytorchrl-style proportional priorities
            (default: ALF's plain priorities).
        controls: ``BufferControl``s (``MaxUse``, ``MaxStaleness``, ``SampleStatistics``,
            ``ThroughputMonitor``...).
        storage_dir: memory-mapped storage directory (see ``RingBuffer``).
        seed: seed of the buffer's own random generator (saved in ``state_dict``).
        backend: ``"fused"`` or ``"reference"`` (see ``storage.backend``); the default
            is fused wherever it can run.
        tree_backend: force a segment-tree kernel (``"numba"`` or ``"torch"``); the
            default follows the device (torch trees run the reference backend).

    ``enable_checkpoint`` defaults to True here (ALF: False), since a graph resumes from
    checkpoints; with False, ``state_dict()`` holds no contents and loading it leaves
    the buffer as it is (ALF's checkpointer skipped such a buffer).
    ``allow_multiprocess=True`` raises (see ``RingBuffer``).
    """

    ONE_MINUS = 1.0 - torch.finfo(torch.float32).eps

    def __init__(
        self,
        data_spec,
        num_environments: int,
        max_length: int = 1024,
        num_earliest_frames_ignored: int = 0,
        prioritized_sampling: bool = False,
        initial_priority: float = 1.0,
        recent_data_steps: int = 1,
        recent_data_ratio: float = 0.0,
        with_replacement: bool = False,
        device="cpu",
        allow_multiprocess: bool = False,
        keep_episodic_info: bool | None = None,
        record_episodic_return: bool = False,
        default_return: float = -1000.0,
        gamma: float = 0.99,
        reward_clip=None,
        enable_checkpoint: bool = True,
        name: str = "ReplayBuffer",
        *,
        per: PER | None = None,
        controls: tuple[BufferControl, ...] = (),
        storage_dir: str | None = None,
        seed: int | None = None,
        backend: str | None = None,
        tree_backend: str | None = None,
    ):
        super().__init__(
            data_spec,
            num_environments,
            max_length,
            device,
            allow_multiprocess,
            name=name,
            storage_dir=storage_dir,
            backend=backend,
            tree_backend=tree_backend,
        )
        for required in ("step_type", "reward", "discount"):
            if (keep_episodic_info or record_episodic_return) and not has_field(
                data_spec, required
            ):
                raise ValueError(f"episodic info needs a top-level {required!r} in data_spec")
        if keep_episodic_info is None:
            keep_episodic_info = num_earliest_frames_ignored > 0 or record_episodic_return
        if record_episodic_return and not keep_episodic_info:
            raise ValueError("record_episodic_return needs keep_episodic_info")
        self._num_earliest_frames_ignored = int(num_earliest_frames_ignored)
        self._prioritized_sampling = bool(prioritized_sampling)
        self._recent_data_steps = int(recent_data_steps)
        self._recent_data_ratio = float(recent_data_ratio)
        self._with_replacement = bool(with_replacement)
        self._keep_episodic_info = bool(keep_episodic_info)
        self._record_episodic_return = bool(record_episodic_return)
        self._enable_checkpoint = bool(enable_checkpoint)
        self.sampler = self.backend.sampler(
            self.writer,
            prioritized=self._prioritized_sampling,
            per=per,
            initial_priority=initial_priority,
            num_earliest_frames_ignored=num_earliest_frames_ignored,
            allocator=self._allocator,
            device=self._device,
            tree_backend=self.backend.tree_backend,
        )
        self.slot_info = SlotInfo(self._num_envs * self._max_length, self._allocator)
        self.episodes = None
        if self._keep_episodic_info:
            self.episodes = EpisodeIndex(
                self.writer,
                self._allocator,
                record_episodic_return=record_episodic_return,
                default_return=default_return,
                gamma=gamma,
                reward_clip=reward_clip,
            )
            self.episodes.attach_storage(self.storage)
        self.controls = tuple(controls)
        self._generator = torch.Generator(device=self._device)
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())
        self._generator.manual_seed(seed)

    # ------------------------------------------------------------------ ALF API
    @property
    def initial_priority(self) -> torch.Tensor:
        """Priority given to new steps: max(configured initial priority, current max)."""
        return torch.tensor(self.sampler.initial_priority, dtype=torch.float32)

    @property
    def prioritized_sampling(self) -> bool:
        return self._prioritized_sampling

    @property
    def num_earliest_frames_ignored(self) -> int:
        return self._num_earliest_frames_ignored

    @property
    def num_sampleable(self) -> int:
        """Start positions that may be sampled for the current ``batch_length``."""
        return self.sampler.num_valid()

    def add_batch(self, batch, env_ids=None, blocking: bool = False, *, version: int = 0):
        """Append one step per environment in ``env_ids`` (distinct ids). The batch's
        arrays may be tensors or numpy arrays (read-only ones too: they are copied in).

        ``version`` is the policy version that collected the steps (read by
        ``MaxStaleness`` and ``SampleStatistics``).
        """
        claim = self.writer.claim(env_ids, _batch_size(batch), blocking)
        # Everything about the new steps is written before the cursors move (commit), so
        # a process killed in between leaves a re-attached buffer without them.
        self.storage.write_slots(claim.slots, batch)
        self.slot_info.on_write(claim.slots, version)
        if self.episodes is not None:
            self.episodes.on_write(
                claim.env_ids,
                claim.positions,
                get_field(batch, "step_type"),
                get_field(batch, "discount"),
                get_field(batch, "reward"),
            )
        self.sampler.prepare(claim.slots)
        self.writer.commit(claim)
        self.sampler.on_write(claim.env_ids, claim.positions)
        pos = claim.positions
        pos = torch.from_numpy(pos) if isinstance(pos, np.ndarray) else pos
        if not self.controls:
            return pos
        env_ids, overwritten = torch.as_tensor(claim.env_ids), claim.overwritten
        for control in self.controls:
            control.on_add(self, env_ids, pos, version)
            if overwritten:
                control.on_remove(self, overwritten)
        return pos

    def get_batch(
        self, batch_size: int, batch_length: int, *, sample_range=None, learner_iter=None
    ):
        """Sample ``batch_size`` sequences of ``batch_length`` steps.

        Returns ``(data, info)``: data nest ``[batch_size, batch_length, ...]`` and a
        ``BatchInfo`` of shape ``[batch_size]``. Without replacement (ALF's default) the
        draws are stratified and come out ordered by environment.

        Args:
            sample_range: a ``slice`` over each environment's stored steps that the
                sequence must start in (DI-engine's ``sample_range``; ERE uses it).
            learner_iter: the learner's iteration, for staleness controls and stats.
        """
        self.sampler.set_batch_length(batch_length)
        for control in self.controls:
            control.before_sample(self, learner_iter)
        recent_batch_size = 0
        if self._recent_data_ratio > 0 and sample_range is None:
            d = batch_length - 1 + self._num_earliest_frames_ignored
            avg_size = float(self.total_size) / self._num_envs - d
            if avg_size * self._recent_data_ratio > self._recent_data_steps:
                # Otherwise plain sampling already draws recent data often enough.
                recent_batch_size = math.ceil(batch_size * self._recent_data_ratio)
        normal_size = batch_size - recent_batch_size
        g = self._generator
        if sample_range is not None:
            lo, hi = self._range_bounds(sample_range)
            slots = self.sampler.sample_in_windows(normal_size, g, lo, hi)
        else:
            slots = self.sampler.sample(normal_size, g, self._with_replacement)
        if recent_batch_size:
            newest_start = self.writer.current_pos - batch_length + 1
            recent = self.sampler.sample_in_windows(
                recent_batch_size, g, newest_start - self._recent_data_steps, newest_start
            )
            slots = torch.cat([recent, slots])
        return self._batch_from_slots(slots, batch_length, learner_iter)

    def _range_bounds(self, sample_range: slice):
        if not isinstance(sample_range, slice) or sample_range.step not in (None, 1):
            raise ValueError("sample_range must be a slice with step 1")
        size = self.writer.current_size
        earliest = self.writer.current_pos - size

        def bound(x, default):
            if x is None:
                return default
            x = torch.full_like(size, int(x))
            return torch.clamp(torch.where(x < 0, x + size, x), min=0) + 0

        lo = earliest + torch.minimum(bound(sample_range.start, torch.zeros_like(size)), size)
        hi = earliest + torch.minimum(bound(sample_range.stop, size), size)
        return lo, hi

    def _batch_from_slots(self, slots, batch_length, learner_iter):
        # Index arithmetic runs on the sampler's array type (numpy views on a CPU).
        sampler = self.sampler
        env_a, idx0_a, positions_a = sampler.locate(sampler._arr(slots))
        env_ids, idx0 = sampler._tensor(env_a), sampler._tensor(idx0_a)
        positions = sampler._tensor(positions_a)
        length = self._max_length
        if batch_length == 1:
            flat = slots
        else:
            steps = torch.arange(batch_length, device=self._device)
            idx = (positions[:, None] + steps[None, :]) % length
            flat = (env_ids[:, None] * length + idx).reshape(-1)
        data = self.storage.read_slots(flat, (slots.shape[0], batch_length))
        weights = self.sampler.importance_weights(slots)
        discounted_return = ()
        if self._record_episodic_return:
            discounted_return = self.episodes.discounted_return[env_ids, idx0]
        info = BatchInfo(env_ids, positions, weights, self, discounted_return)
        self.slot_info.use_count.index_add_(0, slots, torch.ones_like(slots))
        for control in self.controls:
            control.on_sample(self, slots, learner_iter)
        return data, info

    def sampling_mass(self) -> tuple[float, int, float, float | None]:
        """``(total, count, smallest, beta)`` of the sampling distribution as it stands (for
        the batch length last sampled): the sum of the sampling weights, how many slots have
        one, the smallest non-zero one (1.0 without a min tree) and the IS exponent (None
        when the weights do not use one). What a shard tells the learner to merge draws."""
        sampler = self.sampler
        min_tree = getattr(sampler, "min_tree", None)
        smallest = float(min_tree.total()) if min_tree is not None else 1.0
        beta = getattr(sampler, "beta", None)
        return (float(sampler.sum_tree.total()), int(sampler.sum_tree.nnz), smallest,
                None if beta is None else float(beta))

    def update_priority(self, env_ids, positions, priorities) -> torch.Tensor:
        """Set priorities of sampled steps; returns which updates were applied.

        Updates for positions overwritten since sampling are ignored; positions never
        written raise ``ValueError``.
        """
        if not self._prioritized_sampling:
            raise ValueError("update_priority needs prioritized_sampling=True")
        return self.sampler.update_priority(env_ids, positions, priorities)

    def evict(self, slots) -> None:
        """Make ``slots`` unsampleable until rewritten (what the controls call)."""
        slots = torch.as_tensor(slots, dtype=torch.int64, device=self._device).reshape(-1)
        if slots.numel() == 0:
            return
        before = self.sampler.num_valid()
        self.sampler.evict(slots)
        removed = before - self.sampler.num_valid()
        if removed:
            for control in self.controls:
                control.on_remove(self, removed)

    def get_field(self, field_name, env_ids, positions):
        """Stored ``field_name`` (dotted path) at (env_ids, positions)."""
        env_ids = self._env_ids(env_ids)
        positions = torch.as_tensor(positions, dtype=torch.int64, device=self._device)
        current = self.writer.current_pos[env_ids]
        if bool((positions >= current).any()) or bool(
            (positions < current - self._max_length).any()
        ):
            raise ValueError("positions are not stored in the buffer")
        field = map_structure(lambda name: self.storage.field(name), field_name)
        idx = positions % self._max_length
        return map_structure(lambda t: t[env_ids, idx], field)

    def get_episode_begin_position(self, pos, env_ids):
        """Position of the FIRST step of each step's episode (it may be overwritten)."""
        self._need_episodes()
        return self.episodes.begin_position(self._env_ids(env_ids), torch.as_tensor(pos))

    def steps_to_episode_end(self, pos, env_ids):
        """Distance to the episode's LAST step, or to the newest step if still running."""
        self._need_episodes()
        return self.episodes.steps_to_episode_end(self._env_ids(env_ids), torch.as_tensor(pos))

    def _need_episodes(self):
        if self.episodes is None:
            raise ValueError("episode queries need keep_episodic_info=True")

    def clear(self, env_ids=None) -> None:
        """Empty all or some environments: data, priorities, evictions, counters."""
        env_ids = self._env_ids(env_ids)
        removed = int(self.writer.current_size[env_ids].sum())
        super().clear(env_ids)
        self.sampler.clear(env_ids)
        slots = (
            env_ids[:, None] * self._max_length
            + torch.arange(self._max_length, device=self._device)
        ).reshape(-1)
        self.slot_info.use_count[slots] = 0
        self.slot_info.version[slots] = 0
        if self.episodes is not None:
            self.episodes.clear(env_ids)
        for control in self.controls:
            control.on_clear(self, env_ids)
            if removed:
                control.on_remove(self, removed)

    def _after_remove(self, env_ids, count: int) -> None:
        self.sampler.rebuild()
        for control in self.controls:
            control.on_remove(self, count)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """Copies of everything that decides future samples, safe to save in a thread
        (with ``enable_checkpoint=False``: nothing)."""
        if not self._enable_checkpoint:
            return {"enable_checkpoint": False}
        state = super().state_dict()
        state.update(
            sampler=self.sampler.state_dict(),
            slot_info=self.slot_info.state_dict(),
            rng=self._generator.get_state(),
            controls=[c.state_dict() for c in self.controls],
        )
        if self.episodes is not None:
            state["episodes"] = self.episodes.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if state.get("enable_checkpoint") is False:
            return
        if len(state["controls"]) != len(self.controls):
            raise ValueError(
                f"the saved buffer had {len(state['controls'])} controls and this one has "
                f"{len(self.controls)}: restore it with the same replay controls"
            )
        super().load_state_dict(state)
        self.slot_info.load_state_dict(state["slot_info"])
        if self.episodes is not None:
            self.episodes.load_state_dict(state["episodes"])
        self._generator.set_state(state["rng"])
        for control, control_state in zip(self.controls, state["controls"], strict=True):
            control.load_state_dict(control_state)
        self.sampler.load_state_dict(state["sampler"])
