"""ReplayBuffer: sampling statistics, ALF's defects fixed, state, controls, mmap, episodes."""

from __future__ import annotations

import math
from collections import Counter, namedtuple

import numpy as np
import pytest
import torch

from storage import (
    ERE,
    PER,
    MaxStaleness,
    MaxUse,
    ReplayBuffer,
    SampleStatistics,
    StepType,
    TensorSpec,
    ThroughputMonitor,
    arrays,
)

# "cpu-torch-path": the bookkeeping and the trees a GPU runs (storage.arrays.TORCH_ON_CPU), run
# on the CPU, so that machines without a GPU test that path too.
DEVICES = [
    "cpu",
    "cpu-torch-path",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    ),
]


@pytest.fixture(params=DEVICES)
def device(request, monkeypatch):
    if request.param == "cpu-torch-path":
        monkeypatch.setattr(arrays, "TORCH_ON_CPU", True)
        return "cpu"
    return request.param
Step = namedtuple("Step", ["step_type", "reward", "discount", "observation"])
SPEC = Step(
    TensorSpec((), torch.int64), TensorSpec(()), TensorSpec(()), TensorSpec((4,), torch.float32)
)


def steps(env_ids, t, step_type=StepType.MID):
    n = len(env_ids)
    return Step(
        torch.full((n,), int(step_type)),
        torch.ones(n),
        torch.ones(n),
        torch.tensor([[float(e), float(t), 0.0, 0.0] for e in env_ids]),
    )


def fill(rb, num_steps, env_ids=None, version=0):
    env_ids = list(range(rb.num_environments)) if env_ids is None else env_ids
    for t in range(num_steps):
        rb.add_batch(steps(env_ids, t), torch.tensor(env_ids), version=version)


def chi_square_p_value(observed, expected):
    """Upper tail of chi-square (Wilson-Hilferty), enough for a fixed-seed sanity test."""
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
    k = len(observed) - 1
    z = ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


# ----------------------------------------------------------------- statistics
@pytest.mark.parametrize("alpha", [1.0, 0.6])
def test_prioritized_frequencies_match_p_alpha(device, alpha):
    rb = ReplayBuffer(
        SPEC,
        2,
        10,
        prioritized_sampling=True,
        with_replacement=True,
        device=device,
        per=PER(alpha=alpha),
        seed=3,
    )
    fill(rb, 10)
    envs = torch.arange(2).repeat_interleave(10)
    pos = torch.arange(10).repeat(2)
    priorities = torch.arange(1, 21, dtype=torch.float32)
    rb.update_priority(envs, pos, priorities)
    counts = Counter()
    for _ in range(40):
        _, info = rb.get_batch(1000, 1)
        counts.update(zip(info.env_ids.tolist(), info.positions.tolist(), strict=True))
    weights = priorities.double() ** alpha
    expected = (weights / weights.sum() * 40_000).tolist()
    observed = [counts[(int(e), int(p))] for e, p in zip(envs, pos, strict=True)]
    assert chi_square_p_value(observed, expected) > 0.001
    # The test has power: uniform frequencies are rejected.
    assert chi_square_p_value(observed, [2000.0] * 20) < 1e-6


def test_cpu_torch_path_builds_the_gpu_bookkeeping(device):
    rb = ReplayBuffer(SPEC, 2, 8, prioritized_sampling=True, device=device, seed=0)
    on_numpy = device == "cpu" and not arrays.TORCH_ON_CPU
    assert rb.backend.name == ("fused" if on_numpy else "reference")
    assert rb.sampler.xp is (np if on_numpy else torch)
    assert rb.sampler.sum_tree.backend == ("numba" if on_numpy else "torch")


def test_importance_weights_match_definition(device):
    rb = ReplayBuffer(SPEC, 2, 8, prioritized_sampling=True, device=device, seed=0)
    fill(rb, 8)
    rb.update_priority(
        torch.tensor([0, 1, 1]), torch.tensor([2, 0, 5]), torch.tensor([4.0, 0.5, 9.0])
    )
    _, info = rb.get_batch(64, 3)
    # Valid starts for batch_length 3: positions 0..5 in each env.
    prio = {(e, p): 1.0 for e in range(2) for p in range(6)}
    prio.update({(0, 2): 4.0, (1, 0): 0.5, (1, 5): 9.0})
    mean = sum(prio.values()) / len(prio)
    expected = [
        prio[(e, p)] / mean
        for e, p in zip(info.env_ids.tolist(), info.positions.tolist(), strict=True)
    ]
    assert info.importance_weights.tolist() == pytest.approx(expected, rel=1e-6)

    beta = 0.4
    per = ReplayBuffer(SPEC, 1, 4, prioritized_sampling=True, per=PER(beta=beta), seed=0)
    fill(per, 4)
    per.update_priority(torch.zeros(4), torch.arange(4), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    _, info = per.get_batch(16, 1)
    n_p = torch.tensor([1.0, 2.0, 3.0, 4.0]) * 4 / 10
    want = (n_p**-beta / (n_p.min() ** -beta))[info.positions]
    assert info.importance_weights.tolist() == pytest.approx(want.tolist(), rel=1e-6)


def test_without_replacement_is_stratified_and_env_ordered():
    rb = ReplayBuffer(SPEC, 4, 16, seed=1)
    fill(rb, 16)
    _, info = rb.get_batch(64, 1)
    pairs = list(zip(info.env_ids.tolist(), info.positions.tolist(), strict=True))
    assert len(set(pairs)) == 64  # 64 draws from 64 equal slots: each exactly once
    assert info.env_ids.tolist() == sorted(info.env_ids.tolist())


def test_recent_data_ratio_is_honoured():
    rb = ReplayBuffer(SPEC, 2, 100, recent_data_steps=5, recent_data_ratio=0.5, seed=2)
    fill(rb, 100)
    recent = 0
    for _ in range(20):
        _, info = rb.get_batch(100, 2)
        newest_start = 100 - 2 + 1
        recent += int((info.positions >= newest_start - 5).sum())
    # Half the batch comes from the 5 newest starts, plus their share of the rest.
    expected = 2000 * (0.5 + 0.5 * 5 / 99)
    assert abs(recent - expected) < 0.05 * 2000


def test_ere_emphasizes_recent_data():
    rb = ReplayBuffer(SPEC, 2, 500, seed=4)
    fill(rb, 500)
    ere = ERE(eta=0.99, cmin=20)
    assert ere.recent_count(1000, 0, 10) == 1000
    late = ere.sample_range(rb, 9, 10)
    c9 = ere.recent_count(1000, 9, 10)
    assert c9 == max(int(1000 * 0.99**900), 20)
    _, info = rb.get_batch(200, 1, sample_range=late)
    assert int(info.positions.min()) >= 500 - math.ceil(c9 / 2)
    _, early = rb.get_batch(200, 1, sample_range=ere.sample_range(rb, 0, 10))
    assert float(early.positions.double().mean()) < float(info.positions.double().mean())


# ----------------------------------------------------------------- ALF defects
def test_short_environment_never_sampled_into_unwritten_slots(device):
    rb = ReplayBuffer(SPEC, 3, 10, device=device, seed=5)
    fill(rb, 8, env_ids=[0])
    fill(rb, 2, env_ids=[1])  # fewer than batch_length
    for _ in range(20):
        data, info = rb.get_batch(32, 4)
        assert set(info.env_ids.tolist()) == {0}
        assert (info.positions <= 4).all()
        assert torch.equal(
            data.observation[:, :, 1],
            (info.positions[:, None] + torch.arange(4, device=device)).float(),
        )


def test_clear_subset_resets_priorities_and_counters(device):
    rb = ReplayBuffer(SPEC, 2, 6, prioritized_sampling=True, device=device, seed=0)
    fill(rb, 6)
    rb.update_priority(torch.tensor([0, 1]), torch.tensor([1, 1]), torch.tensor([50.0, 7.0]))
    rb.get_batch(8, 1)
    rb.clear(torch.tensor([0]))
    assert rb.writer.current_size.tolist() == [0, 6]
    assert float(rb.sampler.priority[:6].abs().sum()) == 0.0
    assert int(rb.slot_info.use_count[:6].sum()) == 0
    assert rb.sampler.initial_priority == 7.0  # env 0's 50 is forgotten
    # A late update for cleared data is ignored, not an error and not resurrected.
    applied = rb.update_priority(torch.tensor([0]), torch.tensor([1]), torch.tensor([99.0]))
    assert applied.tolist() == [False]
    _, info = rb.get_batch(16, 1)
    assert set(info.env_ids.tolist()) == {1}
    rb.clear()
    assert int(rb.total_size) == 0 and rb.num_sampleable == 0


def test_priority_updates_late_ignored_future_rejected():
    rb = ReplayBuffer(SPEC, 1, 4, prioritized_sampling=True, seed=0)
    fill(rb, 6)  # positions 2..5 stored
    applied = rb.update_priority(
        torch.tensor([0, 0]), torch.tensor([1, 3]), torch.tensor([5.0, 6.0])
    )
    assert applied.tolist() == [False, True]
    assert float(rb.sampler.priority[3 % 4]) == 6.0
    with pytest.raises(ValueError):
        rb.update_priority(torch.tensor([0]), torch.tensor([6]), torch.tensor([1.0]))


def _tree_state(rb):
    trees = (rb.sampler.sum_tree, rb.sampler.max_tree, rb.sampler.min_tree)
    return [t._values.clone() for t in trees if t is not None] + [rb.sampler.priority.clone()]


@pytest.mark.parametrize(
    "convert",
    [
        lambda t: t,
        lambda t: t.numpy(),
        lambda t: t.tolist(),
        lambda t: torch.stack([t, t], 1)[:, 0],  # not contiguous
        lambda t: t.double() if t.is_floating_point() else t.int(),  # other dtypes
        lambda t: t.reshape(2, -1),  # any shape, read flat
    ],
    ids=["tensor", "numpy", "list", "strided", "dtypes", "2d"],
)
def test_update_priority_takes_any_array_like(convert):
    def run(convert):
        rb = ReplayBuffer(SPEC, 2, 8, prioritized_sampling=True, per=PER(0.6, 0.4, 0.1), seed=0)
        fill(rb, 11)  # positions 3..10 stored
        env = torch.tensor([0, 1, 1, 0, 1, 0])
        pos = torch.tensor([2, 3, 9, 4, 3, 10])  # (0, 2) overwritten; (1, 3) twice
        prio = torch.tensor([7.0, 0.5, 2.0, 0.0, 3.0, 1.5])
        applied = rb.update_priority(convert(env), convert(pos), convert(prio))
        return applied.tolist(), _tree_state(rb)

    want_applied, want_state = run(lambda t: t)
    applied, state = run(convert)
    assert applied == want_applied == [False, True, True, True, True, True]
    assert all(torch.equal(a, b) for a, b in zip(state, want_state, strict=True))
    rb = ReplayBuffer(SPEC, 2, 8, prioritized_sampling=True, seed=0)
    fill(rb, 11)
    assert float(rb.sampler.priority[1 * 8 + 3]) == 1.0
    rb.update_priority(
        convert(torch.tensor([1, 1])),
        convert(torch.tensor([3, 3])),
        convert(torch.tensor([0.5, 3.0])),
    )
    assert float(rb.sampler.priority[1 * 8 + 3]) == 3.0  # the last update wins


@pytest.mark.parametrize("as_numpy", [False, True])
def test_rejected_priority_updates_change_nothing(as_numpy):
    rb = ReplayBuffer(SPEC, 2, 8, prioritized_sampling=True, per=PER(beta=0.4), seed=0)
    fill(rb, 11)
    before = _tree_state(rb)
    convert = (lambda t: t.numpy()) if as_numpy else (lambda t: t)
    bad = [
        (ValueError, [0, 1], [5, 11], [1.0, 1.0]),  # position 11 never written
        (ValueError, [0, 1], [5, 6], [1.0, -1.0]),
        (ValueError, [0, 1], [5, 6], [1.0, float("nan")]),
        (ValueError, [0, 1], [5, 6], [1.0, float("inf")]),
        (IndexError, [0, 2], [5, 6], [1.0, 1.0]),
        (ValueError, [0, 1], [5, 6], [1.0]),
    ]
    for error, env, pos, prio in bad:
        with pytest.raises(error):
            rb.update_priority(
                convert(torch.tensor(env)), convert(torch.tensor(pos)), convert(torch.tensor(prio))
            )
    assert all(torch.equal(a, b) for a, b in zip(_tree_state(rb), before, strict=True))


def test_rejected_appends_change_nothing():
    rb = ReplayBuffer(SPEC, 3, 2, seed=0)
    fill(rb, 2, env_ids=[0, 1])
    cursors = rb.writer.state_dict()
    with pytest.raises(ValueError):
        rb.add_batch(steps([0, 0], 5), torch.tensor([0, 0]))  # twice the same env
    with pytest.raises(ValueError):
        rb.add_batch(steps([0, 3], 5), torch.tensor([0, 3]))  # no env 3
    with pytest.raises(ValueError):
        rb.add_batch(steps([0, 1], 5), torch.tensor([0]))  # two steps, one env
    with pytest.raises(RuntimeError):
        rb.add_batch(steps([2, 1], 5), torch.tensor([2, 1]), blocking=True)  # env 1 full
    assert all(torch.equal(cursors[k], v) for k, v in rb.writer.state_dict().items())
    assert rb.add_batch(steps([2, 1], 5), [2, 1]).tolist() == [0, 2]


def test_gather_all_empty_and_full():
    rb = ReplayBuffer(SPEC, 2, 4)
    data, info = rb.gather_all()
    assert data.observation.shape == (2, 0, 4) and data.reward.shape == (2, 0)
    fill(rb, 6)
    data, info = rb.gather_all()
    assert data.observation[0, :, 1].tolist() == [2.0, 3.0, 4.0, 5.0]
    assert info.positions.tolist() == [2, 2]
    uneven = ReplayBuffer(SPEC, 2, 4)
    fill(uneven, 1, env_ids=[0])
    with pytest.raises(ValueError):
        uneven.gather_all()


def test_changing_batch_length_keeps_learned_priorities():
    rb = ReplayBuffer(SPEC, 1, 8, prioritized_sampling=True, seed=0)
    fill(rb, 8)
    rb.update_priority(torch.tensor([0]), torch.tensor([6]), torch.tensor([30.0]))
    rb.get_batch(4, 4)  # position 6 cannot start 4 steps: masked, priority kept
    assert float(rb.sampler.sum_tree.get_float64(6)) == 0.0
    rb.get_batch(4, 1)
    assert float(rb.sampler.sum_tree.get_float64(6)) == 30.0


# ----------------------------------------------------------------- state
def test_restored_buffer_samples_exactly_like_the_original(device):
    kwargs = dict(prioritized_sampling=True, device=device, keep_episodic_info=True)
    rb = ReplayBuffer(SPEC, 3, 16, seed=9, **kwargs)
    for t in range(40):
        rb.add_batch(steps([0, 1, 2], t, StepType.FIRST if t % 7 == 0 else StepType.MID))
        if t % 5 == 4:
            _, info = rb.get_batch(8, 2)
            rb.update_priority(info.env_ids, info.positions, torch.rand(8) * 10)
    state = rb.state_dict()
    restored = ReplayBuffer(SPEC, 3, 16, seed=123, **kwargs)
    restored.load_state_dict(state)
    for _ in range(3):
        a, ia = rb.get_batch(16, 2)  # the same batch_length: no rebuild on either side
        b, ib = restored.get_batch(16, 2)
        assert torch.equal(ia.positions, ib.positions) and torch.equal(ia.env_ids, ib.env_ids)
        assert torch.equal(ia.importance_weights, ib.importance_weights)
        prios = torch.rand(16) * 10
        rb.update_priority(ia.env_ids, ia.positions, prios)
        restored.update_priority(ib.env_ids, ib.positions, prios)
    for _ in range(3):
        a, ia = rb.get_batch(16, 3)
        b, ib = restored.get_batch(16, 3)
        assert torch.equal(ia.positions, ib.positions) and torch.equal(ia.env_ids, ib.env_ids)
        assert torch.equal(ia.importance_weights, ib.importance_weights)
        assert torch.equal(a.observation, b.observation)
    # state_dict returns copies: later writes do not change a saved state.
    saved = state["storage"]["observation"].clone()
    fill(rb, 3)
    assert torch.equal(state["storage"]["observation"], saved)


def test_memory_mapped_storage_reattaches(tmp_path):
    kwargs = dict(prioritized_sampling=True, storage_dir=str(tmp_path / "replay"), seed=0)
    rb = ReplayBuffer(SPEC, 2, 8, **kwargs)
    fill(rb, 11)
    rb.update_priority(torch.tensor([1]), torch.tensor([9]), torch.tensor([40.0]))
    rb.close()  # releases the directory's lock, as a dying process does
    again = ReplayBuffer(SPEC, 2, 8, **kwargs)
    assert again.reattached
    assert again.writer.current_pos.tolist() == [11, 11]
    data, _ = again.gather_all()
    assert data.observation[1, :, 1].tolist() == [float(t) for t in range(3, 11)]
    assert again.sampler.sum_tree.total() == pytest.approx(15 + 40.0)
    again.close()
    with pytest.raises(ValueError):
        ReplayBuffer(SPEC, 2, 16, **kwargs)  # a different buffer on the same files


# ----------------------------------------------------------------- episodes
def test_discounted_return_backfilled_on_termination():
    rb = ReplayBuffer(SPEC, 1, 16, record_episodic_return=True, gamma=0.5, default_return=-9.0)
    kinds = [
        StepType.FIRST,
        StepType.MID,
        StepType.MID,
        StepType.LAST,
        StepType.FIRST,
        StepType.MID,
    ]
    rewards = [0.0, 1.0, 2.0, 4.0, 0.0, 1.0]
    discounts = [1.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    for k, r, d in zip(kinds, rewards, discounts, strict=True):
        rb.add_batch(
            Step(torch.tensor([int(k)]), torch.tensor([r]), torch.tensor([d]), torch.zeros(1, 4))
        )
    got = rb.episodes.discounted_return[0, :6].tolist()
    g2 = 4.0
    g1 = 2.0 + 0.5 * g2
    g0 = 1.0 + 0.5 * g1
    assert got == pytest.approx([g0, g1, g2, -9.0, -9.0, -9.0])
    _, info = rb.get_batch(4, 1)
    assert info.discounted_return.shape == (4,)


def test_truncation_keeps_bootstrap_in_nstep():
    from storage import nstep_returns

    rb = ReplayBuffer(SPEC, 1, 8)
    for k, d in [
        (StepType.FIRST, 1.0),
        (StepType.MID, 1.0),
        (StepType.LAST, 1.0),
        (StepType.FIRST, 1.0),
    ]:
        rb.add_batch(
            Step(torch.tensor([int(k)]), torch.tensor([1.0]), torch.tensor([d]), torch.zeros(1, 4))
        )
    result = nstep_returns(rb, torch.tensor([0]), torch.tensor([0]), 5, 0.9)
    assert result.steps.tolist() == [2]  # stops at the truncated LAST
    assert result.returns.tolist() == pytest.approx([1.9])
    assert result.bootstrap_discount.tolist() == pytest.approx([0.81])


# ----------------------------------------------------------------- controls
def test_max_use_evicts_after_n_draws():
    rb = ReplayBuffer(SPEC, 1, 10, with_replacement=True, controls=(MaxUse(2),), seed=0)
    fill(rb, 10)
    for _ in range(5):
        if rb.num_sampleable == 0:
            break
        rb.get_batch(min(3, rb.num_sampleable), 1)
    assert int(rb.slot_info.use_count.max()) <= 2 + 2  # at most one batch past the limit
    evicted = rb.sampler.evicted.nonzero().reshape(-1)
    assert (rb.slot_info.use_count[evicted] >= 2).all()
    fill(rb, 1)  # rewriting a slot makes it sampleable again
    assert not bool(rb.sampler.evicted[0])


def test_max_staleness_and_statistics():
    stats = SampleStatistics()
    rb = ReplayBuffer(SPEC, 2, 50, controls=(MaxStaleness(3), stats), seed=0)
    for version in range(10):
        fill(rb, 3, version=version)
    for _ in range(5):
        _, info = rb.get_batch(32, 1, learner_iter=10)
        assert (rb.slot_info.version[info.env_ids * 50 + info.positions % 50] >= 7).all()
    assert stats.last["staleness_max"] <= 3
    assert stats.last["use_mean"] >= 1


def test_sample_statistics_of_a_period_cover_every_draw_since_the_last():
    """A report covers the period, not its last draw: one fresh draw after a stale one must
    not hide the stale one."""
    stats = SampleStatistics()
    rb = ReplayBuffer(SPEC, 2, 50, controls=(stats,), seed=0)
    for version in range(10):
        fill(rb, 3, version=version)
    lasts = []
    for learner_iter in (20, 10, 10):  # the first draw sees everything 10 or more stale
        rb.get_batch(16, 1, learner_iter=learner_iter)
        lasts.append(dict(stats.last))
    period = stats.take_period()
    assert period["staleness_max"] == max(last["staleness_max"] for last in lasts) >= 11
    assert period["staleness_max"] > stats.last["staleness_max"]
    mean = sum(last["staleness_mean"] for last in lasts) / 3  # equal draws: equal weights
    assert period["staleness_mean"] == pytest.approx(mean)
    assert period["use_max"] == max(last["use_max"] for last in lasts)
    assert stats.take_period() == {}  # a new period, nothing drawn yet


def test_throughput_monitor_periods():
    now = [0.0]
    monitor = ThroughputMonitor(period_s=10, clock=lambda: now[0])
    rb = ReplayBuffer(SPEC, 2, 4, controls=(monitor,), seed=0)
    fill(rb, 5)  # 10 pushed, 2 overwritten
    rb.get_batch(6, 1)
    assert monitor.poll() is None
    now[0] = 10.5
    report = monitor.poll()
    assert report["pushed"] == 10 and report["sampled"] == 6 and report["removed"] == 2
    assert report["valid"] == 8


# ----------------------------------------------------------------- backend and ALF arguments
def test_backend_is_chosen_once_and_reported():
    assert ReplayBuffer(SPEC, 2, 8).backend.name == "fused"
    assert ReplayBuffer(SPEC, 2, 8, tree_backend="torch").backend.name == "reference"
    reference = ReplayBuffer(SPEC, 2, 8, backend="reference", prioritized_sampling=True)
    assert reference.backend.name == "reference"
    assert reference.sampler.sum_tree.backend == "numba"
    with pytest.raises(ValueError, match="fused backend needs"):
        ReplayBuffer(SPEC, 2, 8, backend="fused", tree_backend="torch")
    with pytest.raises(ValueError, match="backend must be one of"):
        ReplayBuffer(SPEC, 2, 8, backend="numba")


@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_backends_sample_the_same(backend):
    """Same seed, same events: the same samples, weights and priority results."""
    results = []
    for name in ("fused", backend):
        rb = ReplayBuffer(
            SPEC,
            3,
            16,
            prioritized_sampling=True,
            seed=3,
            backend=name,
            per=PER(alpha=0.7, beta=0.5, epsilon=0.01),
        )
        fill(rb, 20)
        _, info = rb.get_batch(8, 2)
        applied = rb.update_priority(info.env_ids, info.positions, torch.arange(8) * 0.5)
        data, info = rb.get_batch(8, 2)
        results.append((data.observation, info.positions, info.importance_weights, applied))
    for a, b in zip(*results, strict=True):
        assert torch.equal(torch.as_tensor(a), torch.as_tensor(b))


def test_allow_multiprocess_raises_and_enable_checkpoint_works():
    with pytest.raises(ValueError, match="allow_multiprocess"):
        ReplayBuffer(SPEC, 2, 8, allow_multiprocess=True)
    rb = ReplayBuffer(SPEC, 2, 8, enable_checkpoint=False)
    fill(rb, 3)
    state = rb.state_dict()
    assert state == {"enable_checkpoint": False}
    other = ReplayBuffer(SPEC, 2, 8, enable_checkpoint=False)
    fill(other, 5)
    other.load_state_dict(state)  # ALF's checkpointer skipped such a buffer: nothing changes
    assert int(other.total_size) == 10
    assert ReplayBuffer(SPEC, 2, 8).name == "ReplayBuffer"


def test_blocking_dequeue_of_missing_steps_raises():
    rb = ReplayBuffer(SPEC, 2, 8)
    fill(rb, 1)
    with pytest.raises(RuntimeError, match="blocking dequeue"):
        rb.dequeue(n=2, blocking=True)
    with pytest.raises(ValueError):
        rb.dequeue(n=2)


def test_restoring_with_other_controls_is_one_clear_error():
    rb = ReplayBuffer(SPEC, 2, 8, controls=(MaxUse(2),))
    fill(rb, 3)
    with pytest.raises(ValueError, match="saved buffer had 1 controls and this one has 0"):
        ReplayBuffer(SPEC, 2, 8).load_state_dict(rb.state_dict())
