"""Replay storage: ALF's RingBuffer/ReplayBuffer/SegmentTree family on fast wide trees.

Parts (each with ``state_dict``/``load_state_dict``): ``RingStorage`` (where the bytes
are), ``RingWriter`` (which slot is written), ``SlotSampler`` (which slots are read; the
segment trees live there), ``EpisodeIndex`` (episode bookkeeping), ``BufferControl``s
(DI-engine's max use, staleness, statistics, throughput); ``ReplayBuffer`` wires them.
Nothing here knows about ZeroMQ.
"""

from storage.allocator import MemoryAllocator, MmapAllocator, StorageLocked
from storage.backend import Backend, select_backend
from storage.controls import (
    BetaSchedule,
    BufferControl,
    MaxStaleness,
    MaxUse,
    SampleStatistics,
    ThroughputMonitor,
)
from storage.episodes import EpisodeIndex
from storage.ere import ERE
from storage.nest import StepType, TensorSpec
from storage.nstep import NStepResult, nstep_returns
from storage.replay_buffer import ReplayBuffer
from storage.ring import RingStorage, RingWriter
from storage.ring_buffer import BatchInfo, RingBuffer, SlotInfo
from storage.sampler import PER, NothingToSample, SlotSampler
from storage.segment_tree import (
    MaxSegmentTree,
    MinSegmentTree,
    SegmentTree,
    SumSegmentTree,
    available_backends,
)
from storage.sharding import (
    ShardMass,
    global_importance_weights,
    rescale_importance_weights,
    shard_for_env,
    shard_mass,
    split_batch,
    split_by_shard,
)

__all__ = [
    "Backend",
    "BetaSchedule",
    "BatchInfo",
    "BufferControl",
    "ERE",
    "EpisodeIndex",
    "MaxSegmentTree",
    "MaxStaleness",
    "MaxUse",
    "MemoryAllocator",
    "MinSegmentTree",
    "MmapAllocator",
    "NStepResult",
    "NothingToSample",
    "PER",
    "ReplayBuffer",
    "RingBuffer",
    "RingStorage",
    "RingWriter",
    "SampleStatistics",
    "SegmentTree",
    "ShardMass",
    "SlotInfo",
    "SlotSampler",
    "StepType",
    "StorageLocked",
    "SumSegmentTree",
    "TensorSpec",
    "ThroughputMonitor",
    "available_backends",
    "global_importance_weights",
    "rescale_importance_weights",
    "nstep_returns",
    "select_backend",
    "shard_for_env",
    "shard_mass",
    "split_batch",
    "split_by_shard",
]
