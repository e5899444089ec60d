"""Every RL payload that travels between nodes, declared once.

Arrays are numpy arrays or torch CPU tensors; the codec sends them as separate frames. Nested
experience travels as a flat ``{field: array}`` dict (``algorithms.Experience.to_dict``).
"""

from __future__ import annotations

from typing import Any

from pipeline.messages import Message, message


@message("rl.time_steps")
class TimeStepBatch(Message):
    """env_runner -> unroller (request on the ``policy`` service): one step of every env of a
    runner, ALF ``TimeStep`` fields ``[B, ...]``; the reply is an :class:`ActionBatch`."""

    runner: str
    env_offset: int  # global id of this runner's first environment
    time_step: dict


@message("rl.actions")
class ActionBatch(Message):
    """unroller -> env_runner: the actions for a :class:`TimeStepBatch`, the parameter
    version that chose them and the graph's env-step count so far."""

    action: Any
    version: int
    env_steps: int


@message("rl.experience")
class ExperienceBatch(Message):
    """unroller -> replay_store: one stored step per env (``[B, ...]``), global ``env_ids``."""

    env_ids: Any
    experience: dict
    version: int


@message("rl.trajectory")
class Trajectory(Message):
    """unroller -> learner (on-policy): a whole unroll ``[T + 1, B, ...]``; the last row
    bootstraps this unroll and is the first row of the next. ``version``: the unroller's
    newest parameters when it was sent; ``versions``: the version that acted at each of the
    ``T + 1`` rows (an unroll spans versions when the unroller does not wait for the
    learner), what the learner measures policy lag with (:mod:`nodes._lag`)."""

    experience: dict
    version: int
    env_steps: int
    versions: list | None = None


@message("rl.sample_request")
class SampleRequest(Message):
    """learner -> replay_store (``sample`` service). ``learner_version`` is the version of the
    learner's newest parameters (what ``ExperienceBatch.version`` counts in), so the store's
    ``max_staleness`` is in parameter versions whatever ``publish_params_every`` is; -1: unknown."""

    batch_size: int
    batch_length: int
    learner_iter: int
    learner_version: int = -1
    # To one replay shard of several: the other shards' rate-limiter balance (items they may
    # still give), so the samples-per-insert limit holds for all shards together.
    others_credit: float = 0.0
    # Sample nothing: only hand the shard ``others_credit`` and get its own balance back at
    # once (nodes._sharded_sample: how a learner waiting on one shard refreshes them all).
    credit_only: bool = False


@message("rl.sample")
class SampleBatch(Message):
    """replay_store -> learner: ``[B, T, ...]`` experience and ALF's ``BatchInfo`` fields."""

    experience: dict
    env_ids: Any
    positions: Any
    importance_weights: Any
    env_steps: int
    # A shard of several: [total, count, smallest leaf, beta, credit] of its sampling
    # distribution and rate limiter (nodes.replay_store.shard.sample_mass); None from a store that
    # holds everything.
    mass: list | None = None


@message("rl.priorities")
class Priorities(Message):
    """learner -> replay_store: new priorities of sampled steps (late ones are ignored)."""

    env_ids: Any
    positions: Any
    priorities: Any


@message("rl.params")
class Params(Message):
    """learner -> unroller, evaluator: the policy parameters.

    Parameters are ordered by ``(epoch, version)``. ``version`` counts published updates and
    grows within a learner and across a swap (the new learner continues the old one's count);
    ``epoch`` is new whenever a learner starts from anything but a live predecessor (a fresh
    start, a restart from a checkpoint), so a restarted learner's parameters are taken at once
    although its version restarted from an older checkpoint."""

    version: int
    env_steps: int
    params: dict
    epoch: int = 0
    # Published between the epochs of an on-policy batch (the learner's
    # ``publish_between_epochs``): the seconds the learner expects its batch to go on for,
    # which a just-in-time unroller starts its next unroll by. None: a batch's end (or not said).
    eta_s: float | None = None
    # The same learner's batches' training time, smoothed (None: not measured, or not said):
    # how long a just-in-time unroller expects the batch the learner just took to last.
    batch_s: float | None = None

    def newer_than(self, epoch: int, version: int) -> bool:
        return (self.epoch, self.version) > (epoch, version)


@message("rl.metrics")
class Metrics(Message):
    """Scalar metrics from any node; ``env_steps`` is the x axis of every plot."""

    source: str
    env_steps: int
    values: dict


FINAL_CHECKPOINT = "run ending"
HANDOVER = "handover"  # a swapped-in learner asks its predecessor: stop training, give me all


@message("rl.state_request")
class StateRequest(Message):
    """checkpointer -> learner/replay_store/unroller: send me your full state. ``reason`` is
    ``FINAL_CHECKPOINT`` for the checkpoint taken when the run stops, ``HANDOVER`` when a
    swapped-in learner takes over from the one that answers."""

    reason: str


@message("rl.state")
class StateReply(Message):
    """A node's full state (nested dicts of tensors and numbers), and its ``env_steps``."""

    component: str
    env_steps: int
    state: Any
