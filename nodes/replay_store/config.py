"""The replay store's config (``replay_store`` in a graph) and the storage controls it asks
the buffer for: the keys checked at load, apart from the node that runs them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from nodes._agent import Agent
from storage import BetaSchedule, MaxStaleness, MaxUse, SampleStatistics, ThroughputMonitor
from typedconfig import ConfigError, absent_input


@dataclass(frozen=True)
class Config:
    num_environments: int = field(metadata={"doc": "env ids are 0 .. num_environments - 1"})
    max_length: int = field(default=100_000, metadata={"doc": "steps kept per environment"})
    prioritized_sampling: bool = field(default=False, metadata={"doc": "segment-tree PER"})
    priority_replay_alpha: float = field(default=0.6, metadata={"doc": "priority exponent"})
    priority_replay_eps: float = field(default=1e-6, metadata={"doc": "added to priorities"})
    beta_start: float = field(default=0.4, metadata={
        "doc": "PER importance-weight exponent at the start (annealed to 1.0)"})
    beta_anneal_samples: int = field(default=0, metadata={
        "doc": "sampled items over which beta goes linearly to 1.0 (0: stays at beta_start)"})
    initial_priority: float = field(default=1.0, metadata={"doc": "priority of new steps"})
    recent_data_ratio: float = field(default=0.0, metadata={"doc": "share of recent samples"})
    recent_data_steps: int = field(default=1, metadata={"doc": "what counts as recent"})
    with_replacement: bool = field(default=False, metadata={
        "doc": "draw with replacement (default: stratified, ALF)"})
    num_earliest_frames_ignored: int = field(default=0, metadata={
        "doc": "never start a sample in an environment's first N stored steps", "minimum": 0})
    max_use: int | None = field(default=None, metadata={
        "doc": "evict a step once sampled this many times", "minimum": 1})
    max_staleness: int | None = field(default=None, metadata={
        "doc": "never sample a step collected more than this many learner parameter versions "
               "ago", "minimum": 0})
    sample_statistics: bool = field(default=False, metadata={
        "doc": "publish use count and staleness of sampled steps (replay/use_*, staleness_*)"})
    throughput_period_s: float | None = field(default=None, metadata={
        "doc": "publish pushed/sampled/removed per second over periods this long"})
    sample_range: list[int | None] | None = field(default=None, metadata={
        "doc": "[start, stop] slice of each environment's stored steps a sample starts in "
               "(e.g. [-1000, null]: the newest 1000)"})
    ere_eta: float | None = field(default=None, metadata={
        "doc": "Emphasizing Recent Experience: sample the newest N * eta^(k*1000/K) steps"})
    ere_cmin: int = field(default=5000, metadata={"doc": "ERE's smallest window", "minimum": 1})
    ere_round: int = field(default=1000, metadata={
        "doc": "ERE's K: sample requests per round of shrinking windows", "minimum": 1})
    nstep: int = field(default=1, metadata={
        "doc": "add n-step returns from storage to samples (nstep.*) when > 1", "minimum": 1})
    nstep_gamma: float = field(default=0.99, metadata={"doc": "discount of nstep returns"})
    keep_episodic_info: bool = field(default=False, metadata={
        "doc": "index episodes; samples carry episode.begin_position, episode.steps_to_end"})
    record_episodic_return: bool = field(default=False, metadata={
        "doc": "samples carry episode.discounted_return (ALF; implies keep_episodic_info)"})
    episodic_gamma: float = field(default=0.99, metadata={"doc": "discount of that return"})
    default_return: float = field(default=-1000.0, metadata={
        "doc": "discounted return of steps whose episode has not ended"})
    reward_clip: list[float] | None = field(default=None, metadata={
        "doc": "[min, max] clip of rewards in the discounted return"})
    frame_stack: int = field(default=1, metadata={
        "doc": "keep single frames of frame_field and rebuild stacks of the last k at sample "
               "time, never across an episode start (raises num_earliest_frames_ignored to "
               "k - 1)", "minimum": 1})
    frame_field: str = field(default="observation", metadata={
        "doc": "the experience field holding one frame per step (for frame_stack)"})
    min_size_to_sample: int = field(default=1000, metadata={"doc": "steps before sampling"})
    samples_per_insert: float | None = field(default=None, metadata={"doc": "rate limit"})
    spi_tolerance: float = field(default=10_000.0, metadata={"doc": "rate limit slack, items"})
    seed: int = field(default=0, metadata={"doc": "sampling seed"})
    storage_dir: str | None = field(default=None, metadata={
        "doc": "memory-map the buffer here (relative to the run directory): a restarted store "
               "re-attaches to it and loses nothing, instead of going back to a checkpoint"})
    metrics_interval_s: float = field(default=5.0, metadata={"doc": "metrics period"})
    datasets: list[str] | None = field(default=None, metadata={
        "doc": "Minari dataset directories (relative to the current directory) loaded "
               "read-only: the only data of an offline graph (no experience input), mixed "
               "into the experience of a hybrid one (docs/offline.md)"})
    dataset_caps: list[int | None] | None = field(default=None, metadata={
        "doc": "per dataset: load at most this many steps, the first ones (null: all)"})
    dataset_weights: list[float] | None = field(default=None, metadata={
        "doc": "per dataset: its share of the offline rows, relative (default: equal)"})
    offline_share: float = field(default=1.0, metadata={
        "doc": "share of each sampled batch drawn from the datasets (1.0 offline; below 1 "
               "in a hybrid graph, the rest from the experience)"})
    offline_pretrain_batches: int = field(default=0, metadata={
        "doc": "hybrid: serve this many batches from the datasets alone first, as soon as the "
               "learner asks, before (and not counted against) the run's own experience "
               "(ALF's offline updates before RL)", "minimum": 0})
    her_relabel_ratio: float = field(default=0.0, metadata={
        "doc": "hindsight experience replay: share of sampled windows whose desired goal is "
               "replaced by an achieved one of the same episode, rewards recomputed (0 = off; "
               "needs a goal-conditioned Dict observation; docs/her.md)"})
    her_strategy: str = field(default="future", metadata={
        "doc": "where the new goal comes from: future (a later step of the episode) or final "
               "(its last step)"})
    her_achieved_goal: str = field(default="achieved_goal", metadata={
        "doc": "the observation key of the goal the env reached"})
    her_desired_goal: str = field(default="desired_goal", metadata={
        "doc": "the observation key of the goal the env asks for"})
    her_reward: str | None = field(default=None, metadata={
        "doc": "module:function(achieved [N, G], desired [N, G]) -> reward [N] for relabeled "
               "steps (null: 0 within her_distance_threshold of the goal, else -1)"})
    her_distance_threshold: float = field(default=0.05, metadata={
        "doc": "goal distance that counts as reached, for the default reward (FetchReach: "
               "0.05)", "minimum": 0.0})
    agent: Agent | None = field(default=None, metadata={
        "doc": "the graph's agent: section (filled in at load): the first batch from each "
               "sender is checked against its experience schema"})

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Values that must agree; a ``ConfigError`` names the key (the graph adds file:line)."""
        if self.num_earliest_frames_ignored >= self.max_length:
            raise ConfigError("num_earliest_frames_ignored",
                              f"must be below max_length {self.max_length}")
        if self.frame_stack > self.max_length:
            raise ConfigError("frame_stack", f"must not exceed max_length {self.max_length}")
        if not 0.0 <= self.beta_start <= 1.0:
            raise ConfigError("beta_start", f"must lie in [0, 1], got {self.beta_start}")
        if self.beta_anneal_samples < 0:
            raise ConfigError("beta_anneal_samples", "must be >= 0")
        if self.beta_anneal_samples and not self.prioritized_sampling:
            raise ConfigError("beta_anneal_samples", "needs prioritized_sampling: true")
        if self.priority_replay_alpha < 0 or self.priority_replay_eps < 0:
            raise ConfigError("priority_replay_alpha" if self.priority_replay_alpha < 0
                              else "priority_replay_eps", "must be >= 0")
        if not 0.0 <= self.recent_data_ratio <= 1.0:
            raise ConfigError("recent_data_ratio", "must lie in [0, 1]")
        if self.sample_range is not None:
            if len(self.sample_range) != 2:
                raise ConfigError("sample_range", "must be [start, stop] (either may be null)")
            if self.ere_eta is not None:
                raise ConfigError("sample_range", "and ere_eta both choose the sampled window: "
                                  "set one")
        if self.ere_eta is not None and not 0.0 < self.ere_eta <= 1.0:
            raise ConfigError("ere_eta", f"must lie in (0, 1], got {self.ere_eta}")
        for key in ("nstep_gamma", "episodic_gamma"):
            if not 0.0 < getattr(self, key) <= 1.0:
                raise ConfigError(key, f"must lie in (0, 1], got {getattr(self, key)}")
        if self.reward_clip is not None and (len(self.reward_clip) != 2
                                             or self.reward_clip[0] > self.reward_clip[1]):
            raise ConfigError("reward_clip", "must be [min, max] with min <= max")
        if self.throughput_period_s is not None and self.throughput_period_s <= 0:
            raise ConfigError("throughput_period_s", "must be > 0")
        self._validate_datasets()
        from nodes.replay_store.her import validate_her

        validate_her(self)

    def _validate_datasets(self) -> None:
        """Datasets: lists that match, sample extras they cannot give, an algorithm that
        cannot train on them, and each dataset's env and dtypes against the agent (one line
        at load: a wrong dataset never reaches a running store)."""
        if not self.datasets:
            needs = getattr(type(getattr(self.agent, "algorithm", None)), "needs_dataset", False)
            if needs:
                raise ConfigError("datasets", f"{self.agent.algorithm.name} learns from "
                                  f"datasets only: list at least one (docs/offline.md)")
            for key in ("dataset_caps", "dataset_weights"):
                if getattr(self, key) is not None:
                    raise ConfigError(key, "needs datasets")
            if self.offline_pretrain_batches:
                raise ConfigError("offline_pretrain_batches", "needs datasets")
            return
        for key in ("dataset_caps", "dataset_weights"):
            value = getattr(self, key)
            if value is not None and len(value) != len(self.datasets):
                raise ConfigError(key, f"has {len(value)} entries for {len(self.datasets)} "
                                  f"datasets")
        if any(c is not None and c < 2 for c in self.dataset_caps or ()):
            raise ConfigError("dataset_caps", "each cap must be at least 2 steps (or null)")
        if any(w <= 0 for w in self.dataset_weights or ()):
            raise ConfigError("dataset_weights", "each weight must be > 0")
        if not 0.0 < self.offline_share <= 1.0:
            raise ConfigError("offline_share", f"must lie in (0, 1], got {self.offline_share}")
        for key, unset in (("nstep", 1), ("frame_stack", 1), ("keep_episodic_info", False),
                           ("record_episodic_return", False)):
            if getattr(self, key) != unset:
                raise ConfigError(key, "is not supported with datasets (their rows carry no "
                                  "sample extras)")
        if self.agent is None:
            return
        if self.agent.on_policy:
            raise ConfigError("datasets", f"{self.agent.algorithm.name} is on-policy: it "
                              f"trains on fresh unrolls of its own policy, not on datasets; "
                              f"use an off-policy algorithm (bc, iql, sac, ...)")
        from nodes._datasets import check_dataset, missing_dataset
        from storage.datasets import DatasetError

        for i, path in enumerate(self.datasets):
            if not os.path.isdir(path):  # run refuses; check notes it (a file still to make)
                absent_input(f"datasets.{i}", missing_dataset(path))
                continue
            try:
                check_dataset(path, self.agent)
            except DatasetError as exc:
                raise ConfigError(f"datasets.{i}", str(exc)) from None


def buffer_controls(config: Config) -> dict:
    """The buffer's controls for ``config``, by name (each one is a storage component)."""
    controls = {}
    if config.max_use is not None:
        controls["max_use"] = MaxUse(config.max_use)
    if config.max_staleness is not None:
        controls["max_staleness"] = MaxStaleness(config.max_staleness)
    if config.sample_statistics:
        controls["sample_statistics"] = SampleStatistics()
    if config.throughput_period_s is not None:
        controls["throughput"] = ThroughputMonitor(config.throughput_period_s)
    if config.prioritized_sampling:
        controls["beta"] = BetaSchedule(config.beta_start, config.beta_anneal_samples)
    return controls
