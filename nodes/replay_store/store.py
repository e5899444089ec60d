"""The replay store's state and handlers: ``ReplayStore`` owns the buffer, the rate limiter and
the exactly-once bookkeeping; :mod:`nodes.replay_store` runs its tasks."""

from __future__ import annotations

import collections
import json
import logging
import os

import numpy as np
import torch

from nodes._common import (
    FirstBatchCheck,
    experience_schema,
    resolve_device,
)
from nodes.messages import (
    ExperienceBatch,
    SampleBatch,
)
from nodes.replay_store.config import Config, buffer_controls
from nodes.replay_store.continuity import applied_in_files
from nodes.replay_store.her import make_relabeler
from nodes.replay_store.offline import OfflineRows
from nodes.replay_store.rate_limiter import RateLimiter
from nodes.replay_store.shard import ShardEnvs, sample_mass
from storage import (
    ERE,
    PER,
    NothingToSample,
    ReplayBuffer,
    TensorSpec,
    nstep_returns,
)
from storage.frame_stack import check_stackable, stacked_frames

log = logging.getLogger(__name__)


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
        self.controls: dict = {}
        self.ere = ERE(config.ere_eta, config.ere_cmin) if config.ere_eta is not None else None
        # Hindsight relabeling of sampled windows (storage.her), None when off.
        self.her = make_relabeler(config)
        self.sample_requests = 0  # served, for ERE's round
        self.pretrained = 0  # offline_pretrain_batches served
        self.last_sample: dict = {}  # per-sample figures published as metrics
        self._warned = False
        self.pending: collections.deque = collections.deque()  # sample requests that wait
        self.rejected_priorities = 0
        self.priority_updates = 0  # messages applied (rows of overwritten steps are ignored)
        # One shard of several (a partitioned experience topic): local env ids, masses.
        self.shard_envs = ShardEnvs(config.num_environments, self.storage_dir) \
            if getattr(getattr(bus, "topics", {}).get("experience"), "partitioned", False) else None
        # Datasets beside the experience (hybrid) or instead of it (offline: no experience
        # input, nothing is inserted, so nothing waits for inserts; the count a learner and an
        # evaluator read as env steps is then the number of batches served).
        if config.datasets and self.shard_envs is not None:
            raise ValueError(f"{node.info.instance}: datasets in a sharded replay store are "
                             f"not supported: give them to an unsharded store")
        self.offline = OfflineRows(config, config.num_environments) if config.datasets else None
        self.offline_only = self.offline is not None and not bus.subscribes("experience")
        self.limiter = RateLimiter(config.samples_per_insert, config.spi_tolerance,
                                   0 if self.offline_only else config.min_size_to_sample)
        # Exactly once through restarts: the newest message of each sender that the buffer
        # holds (checkpointed with it), and the run's ledger of what was stored (set by run()).
        self.applied: dict[str, int] = {}
        self.check_rows = None if config.agent is None else FirstBatchCheck(
            experience_schema(config.agent), 1, f"{node.info.instance}: experience")
        self.part_in_files: tuple | None = None  # (sender, seq, steps): see applied_in_files
        self.ledger = None
        self.redelivered = 0

    @property
    def component(self) -> str:
        """Its checkpoint file's name: one per shard when it is one of several."""
        return "replay_store" if self.shard_envs is None else \
            f"replay_store.{self.node.info.replica}"

    @property
    def storage_dir(self) -> str | None:
        if self.config.storage_dir is None:
            return None
        return os.path.join(self.node.info.run_dir, self.config.storage_dir)

    def make_buffer(self, experience: dict) -> None:
        spec = {k: TensorSpec(tuple(np.shape(v))[1:], torch.from_numpy(np.array(v[:1])).dtype)
                for k, v in experience.items()}
        config = self.config
        if self.storage_dir is not None:
            os.makedirs(self.storage_dir, exist_ok=True)
            _write_spec(os.path.join(self.storage_dir, "spec.json"), spec)
        per = PER(config.priority_replay_alpha, config.beta_start,
                  config.priority_replay_eps) if config.prioritized_sampling else None
        self.controls = buffer_controls(config)
        stacking = config.frame_stack > 1  # stacks need episode starts and k - 1 older frames
        # Stacks and hindsight goals must not cross an episode's start or end.
        episodic = (config.keep_episodic_info or config.record_episodic_return or stacking
                    or self.her is not None)
        self.buffer = ReplayBuffer(
            spec, config.num_environments, config.max_length,
            num_earliest_frames_ignored=max(config.num_earliest_frames_ignored,
                                            config.frame_stack - 1),
            prioritized_sampling=config.prioritized_sampling,
            initial_priority=config.initial_priority,
            recent_data_ratio=config.recent_data_ratio,
            recent_data_steps=config.recent_data_steps,
            with_replacement=config.with_replacement,
            keep_episodic_info=episodic or None,
            record_episodic_return=config.record_episodic_return,
            default_return=config.default_return, gamma=config.episodic_gamma,
            reward_clip=tuple(config.reward_clip) if config.reward_clip else None,
            device=self.device, per=per, seed=config.seed, storage_dir=self.storage_dir,
            controls=tuple(self.controls.values()))
        if stacking:
            try:
                check_stackable(self.buffer, config.frame_field, config.frame_stack)
            except ValueError as exc:
                raise ValueError(f"replay_store frame_field: {exc}") from None

    def describe(self) -> dict:
        """What the buffer was built with, read back from the buffer itself (for status)."""
        b = self.buffer
        if b is None:
            return {"datasets": self.offline.describe()} if self.offline is not None else {}
        return {"datasets": self.offline.describe() if self.offline is not None else None,
                "backend": b.backend.name, "controls": sorted(self.controls),
                "prioritized": b.prioritized_sampling, "episodic": b.episodes is not None,
                "num_earliest_frames_ignored": b.num_earliest_frames_ignored,
                "ere": self.ere is not None, "sample_range": self.config.sample_range,
                "nstep": self.config.nstep, "frame_stack": self.config.frame_stack,
                "frame_shape": list(b.data_spec[self.config.frame_field].shape)
                if self.config.frame_field in b.data_spec else None}

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
        self.applied, self.part_in_files = applied_in_files(self.ledger, self.limiter.inserted)
        if "beta" in self.controls:  # the schedule's count is not in the files: estimate it
            self.controls["beta"].sampled = self.limiter.sampled
        return True

    def ingest(self, sender: str, seq: int, msgs: list[ExperienceBatch]) -> None:
        """Store a message once: ``msgs`` is one message as it went on the wire (one, or the
        items of a coalesced batch, which share its sequence number), stored together. One
        redelivered after our restart (we stored it and died before acknowledging it) is
        stored again only if the buffer lost it (restored from an older checkpoint, or
        killed between the ledger's record and the insert), and is recorded in the ledger
        only the first time, just before its insert."""
        if self.check_rows is not None:
            for msg in msgs:
                self.check_rows(msg.experience, sender)
        if self.ledger is not None and not self.ledger.recorded(sender, seq):
            self.ledger.record(sender, seq, sum(len(msg.env_ids) for msg in msgs))
        if seq > self.applied.get(sender, 0):
            skip = 0  # steps of this message the files already hold (see applied_in_files)
            if self.part_in_files is not None and self.part_in_files[:2] == (sender, seq):
                skip, self.part_in_files = self.part_in_files[2], None
            for msg in msgs:
                if skip > 0:
                    skip -= len(msg.env_ids)
                    continue
                self.insert(msg)
            self.applied[sender] = seq
        else:
            self.redelivered += 1

    def insert(self, msg: ExperienceBatch) -> None:
        env_ids = np.asarray(msg.env_ids)
        if self.shard_envs is not None:
            env_ids = self.shard_envs.to_local(env_ids)
        if env_ids.size and (env_ids.min() < 0 or env_ids.max() >= self.config.num_environments):
            raise ValueError(f"experience for env id {int(env_ids.max())} but replay_store "
                             f"num_environments is {self.config.num_environments}")
        if self.buffer is None:
            self.make_buffer(msg.experience)
        # The wire's arrays are copied straight into the rings (no torch copy in between).
        self.buffer.add_batch(dict(msg.experience), env_ids.astype(np.int64, copy=False),
                              version=msg.version)
        self.limiter.on_insert(len(env_ids))

    def _sample_range(self):
        config = self.config
        if self.ere is not None:
            k = self.sample_requests % config.ere_round
            window = self.ere.sample_range(self.buffer, k, config.ere_round)
            self.last_sample["ere_window"] = -window.start * self.buffer.num_environments
            return window
        if config.sample_range is not None:
            return slice(*config.sample_range)
        return None

    def sample(self, req) -> SampleBatch:
        """Draw ``req``'s batch, or raise ``NothingToSample`` (the request should wait): the
        datasets' share of it (``offline_share``) and the rest from the buffer, shuffled
        together."""
        pretraining = self.pretraining
        offline = req.batch_size if pretraining else \
            self.offline.rows_of(req.batch_size) if self.offline is not None else 0
        online = req.batch_size - offline
        if online and self.buffer is None:
            raise NothingToSample("no experience stored yet")
        parts = [self._sample_buffer(req, online)] if online else []
        if offline:
            fields, env_ids, positions = self.offline.sample(offline, req.batch_length)
            parts.append(({k: torch.from_numpy(v) for k, v in fields.items()},
                          torch.from_numpy(env_ids), torch.from_numpy(positions),
                          torch.ones(offline, dtype=torch.float32)))
        self.sample_requests += 1
        if pretraining:  # ahead of the run's own steps: not on the rate limiter's account
            self.pretrained += 1
        else:
            self.limiter.on_sample(req.batch_size)
        if len(parts) == 1:
            experience, env_ids, positions, weights = parts[0]
        else:
            (on, on_env, on_pos, on_w), (off, off_env, off_pos, off_w) = parts
            order = torch.from_numpy(self.offline.rng.permutation(req.batch_size))
            experience = {k: torch.cat([on[k], off[k].to(on[k].dtype)])[order] for k in on}
            env_ids = torch.cat([on_env.to(torch.int64), off_env])[order]
            positions = torch.cat([on_pos.to(torch.int64), off_pos])[order]
            weights = torch.cat([on_w.to(torch.float32), off_w])[order]
            self.last_sample["offline_rows"] = offline
        return SampleBatch(experience, env_ids, positions, weights, self.env_steps, self._mass())

    def _sample_buffer(self, req, count: int) -> tuple:
        """``count`` windows from the buffer: ``(fields, env_ids, positions, weights)``."""
        version = req.learner_version if req.learner_version >= 0 else None
        if version is None and self.config.max_staleness is not None and not self._warned:
            self._warned = True
            log.warning("sample requests carry no learner_version: max_staleness is not applied")
        data, info = self.buffer.get_batch(count, req.batch_length,
                                           sample_range=self._sample_range(),
                                           learner_iter=version)
        # Where the starts lie in their rings: windows and ignored frames show here.
        writer = self.buffer.writer
        newest = writer.current_pos[info.env_ids] - 1
        earliest = writer.earliest(info.env_ids)
        self.last_sample["start_age_max"] = int((newest - info.positions).max())
        self.last_sample["start_offset_min"] = int((info.positions - earliest).min())
        experience = {k: v.cpu() for k, v in data.items()}
        if self.config.frame_stack > 1:
            experience[self.config.frame_field] = stacked_frames(
                self.buffer, self.config.frame_field, info.env_ids, info.positions,
                req.batch_length, self.config.frame_stack).cpu()
        if self.her is not None:  # before the extras: they describe the stored steps
            relabeled = self.her.relabel(self.buffer, experience, info.env_ids, info.positions)
            self.last_sample["her_relabeled_share"] = float(relabeled.mean())
        experience.update(self._extras(info))
        return (experience, info.env_ids.cpu(), info.positions.cpu(),
                info.importance_weights.cpu())

    def balance(self) -> SampleBatch:
        """The reply to a ``credit_only`` request: no items, this shard's mass and balance."""
        empty = np.zeros(0, np.int64)
        return SampleBatch({}, empty, empty, np.zeros(0, np.float32), self.env_steps,
                           self._mass())

    def _mass(self):
        """What a shard of several reports with each reply (its mass and rate-limiter
        balance, ``sample_mass``); None for a store that is not a shard or has no buffer yet."""
        if self.buffer is None or self.shard_envs is None:
            return None
        return sample_mass(self.buffer,
                           self.limiter.own_diff() if self.limiter.spi is not None else 0.0)

    def _extras(self, info) -> dict:
        """n-step returns and episodic information of each sequence's first step, ``[B]``."""
        config, extras = self.config, {}
        if config.nstep > 1:
            result = nstep_returns(self.buffer, info.env_ids, info.positions, config.nstep,
                                   config.nstep_gamma)
            extras.update({"nstep.return": result.returns.cpu(),
                           "nstep.discount": result.bootstrap_discount.cpu(),
                           "nstep.steps": result.steps.cpu()})
            self.last_sample["nstep_steps_mean"] = float(result.steps.double().mean())
        if self.buffer.episodes is not None:
            begin = self.buffer.get_episode_begin_position(info.positions, info.env_ids)
            to_end = self.buffer.steps_to_episode_end(info.positions, info.env_ids)
            extras.update({"episode.begin_position": begin.cpu(),
                           "episode.steps_to_end": to_end.cpu()})
            self.last_sample["episode_steps_to_end_mean"] = float(to_end.double().mean())
        if config.record_episodic_return:
            returns = info.discounted_return
            extras["episode.discounted_return"] = returns.cpu()
            ended = returns != config.default_return
            self.last_sample["episode_ended_share"] = float(ended.double().mean())
            if bool(ended.any()):
                self.last_sample["episode_return_mean"] = float(returns[ended].double().mean())
        return extras

    async def on_sample_request(self, request) -> None:
        """Queue a sample request and answer what the rate limiter allows. A shard of several
        first takes the others' balance it carries; a ``credit_only`` one is answered at once
        with this shard's (``balance``); an empty one says the learner left."""
        msg, limiter = request.message, self.limiter
        if msg.batch_size == 0 and not msg.credit_only:  # the learner left: release inserts
            limiter.sampler_active = False
            limiter.changed.set()
            await request.reply(msg)
            return
        limiter.sampler_active = True
        if self.shard_envs is not None and limiter.spi is not None:
            limiter.others = msg.others_credit
            limiter.changed.set()  # a held insert may go now
        if msg.credit_only:
            await self.serve_pending()  # a waiting request may go now
            await request.reply(self.balance())
            return
        self.pending.append(request)
        await self.serve_pending()

    async def serve_pending(self) -> None:
        """Answer the waiting sample requests the rate limiter now allows, in order; one that
        finds nothing to sample waits for the next insert."""
        while self.pending:
            request = self.pending[0]
            msg = request.message
            if not (self.pretraining or self.limiter.can_sample(msg.batch_size)):
                return
            try:
                batch = self.sample(msg)
            except NothingToSample:
                if not self.limiter.starved:
                    log.info("nothing to sample (evicted or stale): waiting for new experience")
                self.limiter.starved = True
                self.limiter.changed.set()
                return
            self.limiter.starved = False
            self.pending.popleft()
            await request.reply(batch)

    def metrics(self) -> dict:
        """This period's ``replay/...`` figures: sizes, controls, and the period's samples'."""
        values = {"replay/size": int(self.buffer.total_size) if self.buffer is not None else 0,
                  "replay/inserted": self.limiter.inserted,
                  "replay/sampled": self.limiter.sampled,
                  "replay/stale_priority_updates": self.rejected_priorities}
        if self.offline is not None:
            values["replay/offline_size"] = self.offline.size
            values["replay/offline_pretrained"] = self.pretrained
            values.update({f"replay/{k}": v for k, v in self.last_sample.items()})
        if self.buffer is None:
            return values
        values["replay/sampleable"] = self.buffer.num_sampleable
        stats = self.controls.get("sample_statistics")
        if stats is not None:
            values.update({f"replay/{k}": v for k, v in stats.take_period().items()})
        monitor = self.controls.get("throughput")
        report = monitor.poll() if monitor is not None else None
        if report is not None:
            period = report["period_s"]
            values.update({f"replay/{k}_per_s": report[k] / period
                           for k in ("pushed", "sampled", "removed")})
            values["replay/valid"] = report["valid"]
        if "beta" in self.controls:
            values["replay/beta"] = self.controls["beta"].beta
        values.update({f"replay/{k}": v for k, v in self.last_sample.items()})
        return values

    def update_priorities(self, msg) -> None:
        if self.buffer is None or not self.config.prioritized_sampling:
            return
        self.priority_updates += 1
        env_ids = np.asarray(msg.env_ids, dtype=np.int64)
        positions = np.asarray(msg.positions, dtype=np.int64)
        if self.offline is not None:  # dataset rows keep their weight: drop theirs here
            own = env_ids < self.offline.first_env_id
            env_ids, positions = env_ids[own], positions[own]
            msg = type(msg)(env_ids, positions, np.asarray(msg.priorities)[own])
        # Updates for steps this incarnation never wrote (the learner drew them from the one
        # before a restart) are stale, not an error: the buffer would refuse the whole message.
        written = torch.as_tensor(self.buffer.writer.current_pos).cpu().numpy()
        known = (env_ids >= 0) & (env_ids < len(written)) & (positions >= 0)
        known[known] &= positions[known] < written[env_ids[known]]
        self.rejected_priorities += int((~known).sum())
        if not known.any():
            return
        applied = self.buffer.update_priority(
            torch.from_numpy(env_ids[known]), torch.from_numpy(positions[known]),
            torch.as_tensor(np.asarray(msg.priorities)[known], dtype=torch.float32))
        self.rejected_priorities += int((~applied).sum()) if isinstance(applied, torch.Tensor) \
            else 0

    @property
    def pretraining(self) -> bool:
        """Still in the ``offline_pretrain_batches`` served from the datasets alone, before
        the run's own experience is sampled (ALF's hybrid training starts RL after its
        offline updates)."""
        return (self.offline is not None
                and self.pretrained < self.config.offline_pretrain_batches)

    @property
    def env_steps(self) -> int:
        """Steps inserted: what its checkpoints are stamped with, and what its samples tell
        the learner. Offline nothing is inserted: the batches served count instead."""
        return self.sample_requests if self.offline_only else self.limiter.inserted

    def state(self) -> dict:
        return {"buffer": self.buffer.state_dict() if self.buffer is not None else None,
                "spec": None if self.buffer is None else {
                    k: {"shape": list(s.shape), "dtype": str(s.dtype).replace("torch.", "")}
                    for k, s in self.buffer.data_spec.items()},
                "inserted": self.limiter.inserted, "sampled": self.limiter.sampled,
                "sample_requests": self.sample_requests, "applied": dict(self.applied),
                "pretrained": self.pretrained,
                "her": self.her.state_dict() if self.her is not None else None,
                "shard_envs": self.shard_envs.state() if self.shard_envs is not None else None}

    def restore(self, state: dict) -> None:
        if state["buffer"] is not None:
            example = {k: np.zeros((1, *s["shape"]), dtype=s["dtype"])
                       for k, s in state["spec"].items()}
            self.make_buffer(example)
            self.buffer.load_state_dict(state["buffer"])
        self.limiter.inserted, self.limiter.sampled = state["inserted"], state["sampled"]
        self.sample_requests = int(state.get("sample_requests", 0))
        self.pretrained = int(state.get("pretrained", 0))
        self.applied = dict(state.get("applied") or {})
        if self.her is not None and state.get("her") is not None:
            self.her.load_state_dict(state["her"])
        if self.shard_envs is not None:
            self.shard_envs.restore(state.get("shard_envs"))
