"""Node building blocks without processes: checkpoint files, the rate limiter, episode
bookkeeping, and a flaky environment through an in-loop graph."""

from __future__ import annotations

import asyncio
import os

import gymnasium as gym
import numpy as np
import pytest
import torch

from algorithms.data import StepType, TimeStep
from nodes.checkpointer import prune, write_checkpoint
from nodes.env_runner import EpisodeStats, _truncated
from nodes.replay_store import RateLimiter
from pipeline import graph as graphlib
from pipeline.inloop import run_graph
from pipeline.wiring import latest_checkpoint


def test_checkpoint_is_complete_or_invisible(tmp_path):
    root = tmp_path / "checkpoints"
    first = write_checkpoint(str(root), {"learner": {"w": torch.ones(3)},
                                         "replay_store": {"n": 5}}, 100, 1)
    assert latest_checkpoint(str(tmp_path)) == first
    # A crash half way leaves a hidden temporary directory without COMPLETE: never loaded.
    os.makedirs(root / ".tmp-ckpt-000000000200-0002")
    (root / ".tmp-ckpt-000000000200-0002" / "learner.pt").write_bytes(b"half")
    assert latest_checkpoint(str(tmp_path)) == first
    # A component that is gone is carried over from the previous checkpoint.
    second = write_checkpoint(str(root), {"learner": {"w": torch.zeros(3)}}, 300, 3,
                              previous=first)
    assert latest_checkpoint(str(tmp_path)) == second
    assert os.path.basename(second) == "ckpt-000000000300-0003"
    replay = torch.load(os.path.join(second, "replay_store.pt"), weights_only=True)
    assert replay == {"n": 5}
    learner = torch.load(os.path.join(second, "learner.pt"), weights_only=True)
    assert torch.equal(learner["w"], torch.zeros(3))
    prune(str(root), keep=1)
    assert sorted(p for p in os.listdir(root) if p.startswith("ckpt-")) == [
        "ckpt-000000000300-0003"]
    assert torch.load(os.path.join(second, "replay_store.pt"), weights_only=True) == {"n": 5}


def test_wire_arrays_become_tensors_in_checkpoints(tmp_path):
    path = write_checkpoint(str(tmp_path), {"unroller": {"a": np.arange(3), "t": (1, 2.0)}},
                            7, 1)
    state = torch.load(os.path.join(path, "unroller.pt"), weights_only=True)
    assert torch.equal(state["a"], torch.arange(3)) and state["t"] == (1, 2.0)


@pytest.mark.parametrize("inserted,sampled,can_sample,can_insert", [
    (500, 0, False, True),  # below min_size: no sampling, inserts free
    (1000, 0, True, True),  # at min_size: one batch is within the tolerance
    (1100, 0, True, False),  # 100 inserts * spi 4 = 400 ahead > tolerance 256
    (1100, 400, True, True),
    (1100, 700, False, True),  # sampled too far ahead of inserts
])
def test_rate_limiter_keeps_samples_per_insert(inserted, sampled, can_sample, can_insert):
    limiter = RateLimiter(spi=4.0, tolerance=256, min_size=1000)
    limiter.inserted, limiter.sampled = inserted, sampled
    assert limiter.can_sample(64) is can_sample
    assert limiter.can_insert(1) is can_insert
    limiter.sampler_active = False  # the learner left: inserts are never held back
    assert limiter.can_insert(1)


def _ts(step_type, reward):
    n = len(step_type)
    return TimeStep(np.array(step_type), np.array(reward, np.float32), np.ones(n, np.float32),
                    np.zeros((n, 1), np.float32), np.zeros(n), np.arange(n))


def test_episode_stats_and_truncation():
    stats = EpisodeStats(2)
    F, M, L = StepType.FIRST, StepType.MID, StepType.LAST
    for st, r in [([F, F], [0, 0]), ([M, M], [1, 2]), ([L, M], [1, 2]), ([F, L], [0, 2])]:
        stats.update(_ts(st, r))
    out = stats.flush()
    assert out["train/episodes"] == 2
    assert out["train/episode_return"] == pytest.approx((2 + 6) / 2)
    assert out["train/episode_length"] == pytest.approx((2 + 3) / 2)
    cut = _truncated(_ts([M, F], [3, 0]))
    assert list(cut.step_type) == [L, L] and list(cut.discount) == [1, 1]
    assert list(cut.reward) == [0, 0]


class FlakyCartPole(gym.Wrapper):
    """CartPole that raises on its 30th step: the runner must recreate it and go on."""

    def __init__(self):
        super().__init__(gym.make("CartPole-v1"))
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps == 30:
            raise RuntimeError("simulator crashed")
        return self.env.step(action)


gym.register("ConduitTest/FlakyCartPole-v0", entry_point=FlakyCartPole)

FLAKY_GRAPH = """
name: flaky
agent: {env_id: "ConduitTest/FlakyCartPole-v0", algorithm: {name: random}}
topics:
  experience: {delivery: reliable, hwm: 64}
nodes:
  env_runner:
    kind: env_runner
    config: {num_envs: 4, env_groups: 2, max_env_failures: 1000000, max_steps: 400}
    calls: [policy]
  unroller:
    kind: unroller
    serves: [policy]
    publishes: [experience]
  replay_store:
    kind: replay_store
    config: {num_environments: 4, max_length: 1000}
    subscribes: [experience]
    serves: [sample]
run:
  stop_when: [env_runner]  # after its 400 steps: each env raised on its 30th and went on
  duration_s: 120
"""


@pytest.mark.timeout(120)
def test_a_raising_environment_is_recreated_and_nothing_is_lost(tmp_path):
    graph = graphlib.parse(FLAKY_GRAPH, "flaky.yaml")
    summaries = asyncio.run(asyncio.wait_for(run_graph(graph, str(tmp_path)), 90))
    runner = summaries["env_runner.0"]
    assert runner["failures"] >= 1
    assert runner["steps"] > 100  # it kept going after the crash
    # Every step the unroller produced reached the replay store (drained at stop).
    assert summaries["replay_store.0"]["inserted"] == summaries["unroller.0"]["env_steps"]


SPLIT_BATCH_GRAPH = """
name: split_batches
agent: {env_id: CartPole-v1, algorithm: {name: dqn, fc_layer_params: [16]}}
topics:
  experience: {delivery: reliable, hwm: 64}
  params: {delivery: latest, hwm: 4}
  priorities: {delivery: reliable, hwm: 64}
nodes:
  env_runner:
    kind: env_runner
    config: {num_envs: 4}
    calls: [policy]
  unroller:
    kind: unroller
    serves: [policy]
    subscribes: [params]
    publishes: [experience]
  replay_store:
    kind: replay_store
    config: {num_environments: 4, max_length: 1000, min_size_to_sample: 200,
             prioritized_sampling: true, samples_per_insert: 4, spi_tolerance: 256}
    subscribes: [experience, priorities]
    serves: [sample]
  learner:
    kind: learner
    config: {num_env_steps: 800, mini_batch_size: 8, prioritized: true,
             batches_per_request: 3, prefetch: 2}
    calls: [sample]
    publishes: [params, priorities]
run:
  stop_when: [learner]
  duration_s: 120
"""


@pytest.mark.timeout(120)
def test_learner_trains_on_every_mini_batch_of_a_split_request(tmp_path):
    graph = graphlib.parse(SPLIT_BATCH_GRAPH, "split.yaml")
    summaries = asyncio.run(asyncio.wait_for(run_graph(graph, str(tmp_path)), 90))
    updates = summaries["learner.0"]["iteration"]
    sampled = summaries["replay_store.0"]["sampled"]
    # Requests of 24 rows, each trained on as three updates of 8.
    assert updates > 0 and updates % 3 == 0 and sampled % 24 == 0, (sampled, updates)
    # Every sampled row was trained on, but for the requests still in flight at the end.
    assert 0 <= sampled - 8 * updates <= 2 * 24, (sampled, updates)
    assert summaries["replay_store.0"]["priority_updates"] == updates
