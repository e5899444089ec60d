"""Proportional PER with alpha != 1 and epsilon != 0, against numbers worked out by hand.

One environment, four stored steps, priorities p = [0, 0.75, 1.75, 3.75], alpha = 0.5,
epsilon = 0.25:

    leaf = (p + eps) ** alpha = [0.25, 1, 2, 4] ** 0.5 = [0.5, 1, sqrt(2), 2]
    sum  = 3.5 + sqrt(2) = 4.914214
    P    = leaf / sum    = [0.1017457, 0.2034914, 0.2877802, 0.4069827]

ALF's importance weights are N * P = [0.4069827, 0.8139654, 1.151121, 1.6279309]; PER's with
beta = 0.6 are (N * P) ** -beta over the largest, i.e. (leaf / min leaf) ** -0.6 =
[1, 2 ** -0.6, 2 ** -0.9, 2 ** -1.2] = [1, 0.659754, 0.535887, 0.435275].
"""

from __future__ import annotations

import math
from collections import Counter, namedtuple

import pytest
import torch

from storage import PER, BetaSchedule, ReplayBuffer, TensorSpec

Step = namedtuple("Step", ["observation"])
SPEC = Step(TensorSpec((), torch.int64))
PRIORITIES = [0.0, 0.75, 1.75, 3.75]
P = [0.1017457, 0.2034914, 0.2877802, 0.4069827]
ALF_WEIGHTS = [0.4069827, 0.8139654, 1.151121, 1.6279309]
PER_WEIGHTS = [1.0, 0.659754, 0.535887, 0.435275]


def make(backend, beta=None, controls=(), seed=0):
    rb = ReplayBuffer(
        SPEC,
        1,
        4,
        prioritized_sampling=True,
        backend=backend,
        seed=seed,
        per=PER(alpha=0.5, beta=beta, epsilon=0.25),
        controls=controls,
    )
    for t in range(4):
        rb.add_batch(Step(torch.tensor([t])), torch.tensor([0]))
    rb.update_priority(torch.zeros(4, dtype=torch.int64), torch.arange(4), torch.tensor(PRIORITIES))
    return rb


def weights_by_position(rb, draws=64):
    _, info = rb.get_batch(draws, 1)
    seen = {}
    for pos, w in zip(info.positions.tolist(), info.importance_weights.tolist(), strict=True):
        seen[pos] = w
    return seen


def test_leaves_and_alf_weights_match_hand_computed(replay_backend):
    rb = make(replay_backend)
    assert rb.sampler.sum_tree.total() == pytest.approx(3.5 + math.sqrt(2), rel=1e-9)
    seen = weights_by_position(rb)
    assert sorted(seen) == [0, 1, 2, 3]
    for pos, w in seen.items():
        assert w == pytest.approx(ALF_WEIGHTS[pos], abs=2e-6)


def test_per_weights_with_beta_match_hand_computed(replay_backend):
    seen = weights_by_position(make(replay_backend, beta=0.6))
    for pos, w in seen.items():
        assert w == pytest.approx(PER_WEIGHTS[pos], abs=2e-6)


def test_sampling_frequencies_match_hand_computed_probabilities(replay_backend):
    rb = make(replay_backend, seed=1)
    rb._with_replacement = True
    n = 40_000
    counts = Counter()
    for _ in range(n // 1000):
        _, info = rb.get_batch(1000, 1)
        counts.update(info.positions.tolist())
    observed = [counts[i] for i in range(4)]
    stat = sum((o - n * p) ** 2 / (n * p) for o, p in zip(observed, P, strict=True))
    assert stat < 16.27, (observed, stat)  # chi-square, 3 dof, p = 0.001


def test_new_steps_get_the_max_priority_through_alpha_and_eps(replay_backend):
    rb = ReplayBuffer(
        SPEC,
        1,
        8,
        prioritized_sampling=True,
        backend=replay_backend,
        seed=0,
        per=PER(alpha=0.5, epsilon=0.25),
        initial_priority=1.0,
    )
    for t in range(4):
        rb.add_batch(Step(torch.tensor([t])), torch.tensor([0]))
    rb.update_priority(torch.zeros(4, dtype=torch.int64), torch.arange(4), torch.tensor(PRIORITIES))
    rb.add_batch(Step(torch.tensor([4])), torch.tensor([0]))
    # max(initial 1.0, max priority 3.75) = 3.75: leaf (3.75 + 0.25) ** 0.5 = 2.
    assert rb.sampler.priority[4].item() == 3.75
    assert rb.sampler.sum_tree.total() == pytest.approx(3.5 + math.sqrt(2) + 2.0, rel=1e-9)


def test_beta_anneals_linearly_to_one_and_is_checkpointed(replay_backend):
    schedule = BetaSchedule(beta_start=0.4, anneal_samples=100)
    rb = make(replay_backend, beta=0.4, controls=(schedule,))
    for _ in range(5):
        rb.get_batch(10, 1)
    assert schedule.beta == pytest.approx(0.7)  # 50 of 100 items drawn
    seen = weights_by_position(rb, draws=10)  # this draw uses beta 0.7
    ratio = [1.0, 2.0, math.sqrt(8), 4.0]  # leaf / min leaf
    for pos, w in seen.items():
        assert w == pytest.approx(ratio[pos] ** -0.7, abs=2e-6)
    state = rb.state_dict()
    restored_schedule = BetaSchedule(beta_start=0.4, anneal_samples=100)
    restored = make(replay_backend, beta=0.4, controls=(restored_schedule,))
    restored.load_state_dict(state)
    assert restored_schedule.beta == pytest.approx(0.76)  # 60 of 100 drawn
    for _ in range(10):
        restored.get_batch(10, 1)
    assert restored_schedule.beta == 1.0  # and stays there
    seen = weights_by_position(restored, draws=10)
    for pos, w in seen.items():
        assert w == pytest.approx(ratio[pos] ** -1.0, abs=2e-6)


def test_beta_schedule_needs_per_with_beta():
    with pytest.raises(ValueError, match="set_beta needs"):
        make("fused", controls=(BetaSchedule(0.4, 10),)).get_batch(4, 1)
