"""Segment trees against a plain Python list, on every kernel that can run here.

Leaves are small integers (as floats) in the property tests, so every sum is exact and
the expected answer of ``find_sum_bound`` is unambiguous even at interval boundaries.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import MaxSegmentTree, MinSegmentTree, SumSegmentTree, available_backends

KERNELS = [("cpu", b) for b in available_backends("cpu")] + [
    pytest.param(
        ("cuda", "torch"),
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    )
]


def make(cls, capacity, kernel, fanout=32):
    device, backend = kernel
    return cls(capacity, device=device, backend=backend, fanout=fanout)


def first_exceeding(leaves, threshold):
    running = 0.0
    for i, v in enumerate(leaves):
        running += v
        if threshold < running:
            return i
    return max(i for i, v in enumerate(leaves) if v > 0)


@st.composite
def tree_program(draw):
    capacity = draw(st.integers(1, 300))
    fanout = draw(st.sampled_from([2, 3, 4, 8, 32]))
    writes = draw(
        st.lists(
            st.lists(
                st.tuples(st.integers(0, capacity - 1), st.integers(0, 6)),
                min_size=1,
                max_size=40,
            ),
            min_size=1,
            max_size=8,
        )
    )
    return capacity, fanout, writes


@pytest.mark.parametrize("kernel", KERNELS)
@settings(max_examples=40, deadline=None)
@given(program=tree_program(), data=st.data())
def test_sum_tree_matches_reference(kernel, program, data):
    capacity, fanout, writes = program
    tree = make(SumSegmentTree, capacity, kernel, fanout)
    leaves = [0.0] * capacity
    for batch in writes:
        idx = torch.tensor([i for i, _ in batch])
        vals = torch.tensor([float(v) for _, v in batch])
        tree[idx] = vals
        for i, v in batch:  # last write wins
            leaves[i] = float(v)
        assert tree.total() == sum(leaves)
        assert tree.nnz == sum(v != 0 for v in leaves)
        assert tree[torch.arange(capacity)].cpu().tolist() == leaves
        if sum(leaves) == 0:
            with pytest.raises(ValueError):
                tree.find_sum_bound(torch.zeros(1))
            continue
        total = sum(leaves)
        # Boundaries (exact prefix sums), interior points, 0 and the total itself.
        prefix = np.cumsum([0.0] + leaves)
        candidates = sorted(set(prefix.tolist()) | {total, 0.0})
        extra = data.draw(st.lists(st.floats(0, total), max_size=10))
        thresholds = [t for t in candidates + extra if t <= total]
        found = tree.find_sum_bound(torch.tensor(thresholds, dtype=torch.float64))
        expected = [first_exceeding(leaves, t) for t in thresholds]
        assert found.cpu().tolist() == expected
        assert all(leaves[i] > 0 for i in expected)
        query = torch.arange(capacity + 1)
        assert tree.prefix_sum(query).cpu().tolist() == prefix.tolist()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("cls,reduce", [(MinSegmentTree, min), (MaxSegmentTree, max)])
@settings(max_examples=25, deadline=None)
@given(program=tree_program())
def test_min_max_trees_match_reference(kernel, cls, reduce, program):
    capacity, fanout, writes = program
    tree = make(cls, capacity, kernel, fanout)
    leaves = [0.0] * capacity
    assert tree.total() == 0.0  # ALF: leaves start at zero and count
    for batch in writes:
        tree[torch.tensor([i for i, _ in batch])] = torch.tensor([v - 3.0 for _, v in batch])
        for i, v in batch:
            leaves[i] = v - 3.0
        assert tree.total() == reduce(leaves)


@pytest.mark.parametrize("kernel", KERNELS)
def test_errors_and_alf_edge_cases(kernel):
    tree = make(SumSegmentTree, 10, kernel, fanout=4)
    tree[torch.tensor([2, 7])] = torch.tensor([1.0, 3.0])
    with pytest.raises(ValueError):
        tree.find_sum_bound(torch.tensor([4.5]))
    assert tree.find_sum_bound(torch.tensor([4.0])).tolist() == [7]  # == total: last non-zero
    assert tree.find_sum_bound(torch.tensor([-1.0])).tolist() == [2]
    with pytest.raises(IndexError):
        tree[torch.tensor([10])] = torch.tensor([1.0])
    with pytest.raises(ValueError):
        tree[torch.tensor([1])] = torch.tensor([-1.0])
    with pytest.raises(ValueError):
        tree[torch.tensor([1])] = torch.tensor([float("nan")])
    assert tree.total() == 4.0  # rejected writes changed nothing
    # float32 thresholds computed as u * summary() may round up; they stay legal.
    tree[torch.tensor([0])] = torch.tensor([0.1])
    assert int(tree.find_sum_bound(tree.summary().reshape(1))) == 7


@pytest.mark.parametrize("kernel", KERNELS)
def test_duplicates_last_write_wins_and_count_once(kernel):
    tree = make(SumSegmentTree, 100, kernel)
    tree[torch.tensor([5, 5, 5, 9])] = torch.tensor([1.0, 0.0, 2.0, 0.0])
    assert tree.nnz == 1 and tree.total() == 2.0
    tree[torch.tensor([5, 5])] = torch.tensor([3.0, 0.0])
    assert tree.nnz == 0 and tree.total() == 0.0


@pytest.mark.parametrize("kernel", KERNELS)
def test_sums_stay_exact_over_many_updates_at_2_20(kernel):
    capacity = 2**20
    tree = make(SumSegmentTree, capacity, kernel)
    gen = torch.Generator().manual_seed(0)
    tree.fill(torch.rand(capacity, generator=gen, dtype=torch.float64))
    # The torch kernel on a CPU only stands in for CUDA here: fewer rounds keep CI fast.
    rounds = 300 if kernel[1] != "torch" or tree.device.type == "cuda" else 40
    for _ in range(rounds):
        idx = torch.randint(capacity, (4096,), generator=gen)
        # Mix scales: priorities spanning 12 orders of magnitude.
        vals = torch.rand(4096, generator=gen, dtype=torch.float64) * 10.0 ** torch.randint(
            -6, 6, (4096,), generator=gen
        )
        tree[idx.to(tree.device)] = vals.to(tree.device)
    exact = math.fsum(tree.leaves().cpu().tolist())
    assert abs(tree.total() - exact) <= 1e-12 * exact
    # The root is recomputed from children, never drifted by deltas: a rebuild agrees.
    before = tree.total()
    tree.fill(tree.leaves().clone())
    assert abs(tree.total() - before) <= 1e-12 * exact


@pytest.mark.parametrize("kernel", KERNELS)
def test_state_dict_round_trip_and_backends_agree(kernel):
    gen = torch.Generator().manual_seed(1)
    a = make(SumSegmentTree, 5000, kernel, fanout=16)
    idx = torch.randint(5000, (3000,), generator=gen)
    a[idx.to(a.device)] = torch.rand(3000, generator=gen).to(a.device)
    thresholds = torch.rand(500, generator=gen, dtype=torch.float64) * a.total()
    for backend in available_backends("cpu"):
        b = SumSegmentTree(5000, backend=backend, fanout=16)
        b.load_state_dict(a.state_dict())
        assert b.nnz == a.nnz
        assert torch.equal(b.find_sum_bound(thresholds), a.find_sum_bound(thresholds).cpu())


# ----------------------------------------------------------------- delta updates
# The numba kernel adds each leaf change to the ancestors; these pin down the rules that
# keep its sums exact enough (see storage/_tree_kernels.py).
NUMBA = pytest.mark.skipif("numba" not in available_backends("cpu"), reason="needs numba")


@NUMBA
def test_cancellation_is_resummed_at_once():
    capacity = 4096
    tree = SumSegmentTree(capacity, backend="numba")
    gen = torch.Generator().manual_seed(2)
    tree.fill(torch.rand(capacity, generator=gen, dtype=torch.float64) * 1e9)
    # Every big leaf replaced by a tiny one: each ancestor goes 1e12 -> 1e-3 by deltas,
    # which would leave it mostly rounding error without a re-sum.
    for batch in torch.randperm(capacity, generator=gen).split(256):
        tree[batch] = torch.rand(256, generator=gen, dtype=torch.float64) * 1e-6
    exact = math.fsum(tree.leaves().tolist())
    assert abs(tree.total() - exact) <= 1e-12 * exact
    cut = torch.tensor([1000, 2048, 3333])
    want = [math.fsum(tree.leaves()[: int(i)].tolist()) for i in cut]
    assert tree.prefix_sum(cut).tolist() == pytest.approx(want, rel=1e-12)


@NUMBA
def test_sweep_resums_every_node_within_capacity_writes():
    capacity = 4096
    tree = SumSegmentTree(capacity, backend="numba", fanout=16)
    gen = torch.Generator().manual_seed(5)
    tree.fill(torch.rand(capacity, generator=gen, dtype=torch.float64))
    values = tree.kernel_arrays()[0]
    # Plant an error in nodes of every level (and their ancestors, as a delta would).
    for level, node in [(1, 7), (1, 200), (2, 3)]:
        for k in range(level, tree.num_levels + 1):
            values[tree._offsets[k] + (node >> (4 * (k - level)) if k < 3 else 0)] += 0.25
    for _ in range(capacity // 256):
        idx = torch.randint(capacity, (256,), generator=gen)
        tree[idx] = torch.rand(256, generator=gen, dtype=torch.float64)
    planted = values.copy()
    tree.resum()
    assert planted == pytest.approx(values, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("kernel", KERNELS)
def test_emptied_subtree_is_exactly_zero(kernel):
    capacity = 4096
    tree = make(SumSegmentTree, capacity, kernel, fanout=16)
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):  # leave rounding from deltas behind
        idx = torch.randint(capacity, (256,), generator=gen)
        tree[idx.to(tree.device)] = torch.rand(256, generator=gen, dtype=torch.float64).to(
            tree.device
        )
    tree[torch.arange(2048).to(tree.device)] = 0.0
    assert tree.prefix_sum(torch.tensor([2048]).to(tree.device)).item() == 0.0
    assert tree.nnz == int((tree.leaves() != 0).sum())
    found = tree.find_sum_bound(torch.tensor([0.0, 1e-300]).to(tree.device))
    assert found.min() >= 2048 and bool((tree.leaves()[found] > 0).all())


@NUMBA
def test_search_recovers_when_a_node_disagrees_with_its_children():
    tree = SumSegmentTree(4096, backend="numba", fanout=16)
    tree[torch.tensor([5, 4000])] = torch.tensor([1.0, 2.0])
    values = tree.kernel_arrays()[0]
    level1, level2 = tree._offsets[1:3]  # three levels: 4096 leaves, 256, 16, then the root
    # Give the empty level-1 node over leaves 16..31 mass (as rounding could), and its
    # ancestors to match: a search that enters it finds no child with mass.
    values[level1 + 1] = 0.5
    values[level2 + 0] += 0.5
    values[-1] += 0.5
    assert tree.find_sum_bound(torch.tensor([1.2])).tolist() == [4000]
    assert tree.total() == 3.0  # re-summed


@NUMBA
def test_restored_tree_holds_the_same_nodes_and_stays_so():
    gen = torch.Generator().manual_seed(4)
    a = SumSegmentTree(10_000, backend="numba")
    for _ in range(30):
        a[torch.randint(10_000, (256,), generator=gen)] = torch.rand(256, generator=gen)
    b = SumSegmentTree(10_000, backend="numba")
    b.load_state_dict(a.state_dict())
    for _ in range(30):
        idx, vals = torch.randint(10_000, (256,), generator=gen), torch.rand(256, generator=gen)
        a[idx] = vals
        b[idx] = vals
    assert torch.equal(a._values, b._values)


@NUMBA
# 3, 4, 5 and 6 levels (the hot path's unrolled depths), and 13 (its level loop).
@pytest.mark.parametrize("capacity, fanout", [(300, 16), (5000, 16), (2**17, 16),
                                              (2**21, 16), (5000, 2)])
def test_every_input_form_takes_the_same_writes_as_the_general_kernel(capacity, fanout):
    """The sum tree's hot path (numpy arrays, or tensors read by address) writes what the
    general ``set_leaves`` kernel writes, bit for bit, whatever form the input takes."""
    from storage import _tree_kernels

    gen = torch.Generator().manual_seed(6)
    start = torch.rand(capacity, generator=gen, dtype=torch.float64) + 0.01
    reference = SumSegmentTree(capacity, backend="numba", fanout=fanout)
    tree = SumSegmentTree(capacity, backend="numba", fanout=fanout)
    assert tree.num_levels in (3, 4, 5, 6, 13)
    for t in (reference, tree):
        t.fill(start)
    values, layout, state = reference.kernel_arrays()
    idx = torch.randint(capacity, (512,), generator=gen)  # repeats: the last write wins
    vals = torch.rand(512, generator=gen) + 0.5
    forms = [
        (idx.numpy(), vals.double().numpy()),  # numpy fast path
        (idx, vals),  # float32 tensors by address
        (idx, vals.double()),  # float64 tensors by address
        (idx[::2], vals[::2]),  # not contiguous: converted
        (idx.tolist(), vals.tolist()),  # lists: converted
        (idx.numpy().astype(np.int32), vals.numpy()),  # other dtypes: converted
        (idx[:7], 2.5),  # one value for all
    ]
    for given_idx, given_vals in forms:
        tree[given_idx] = given_vals
        i = np.asarray(given_idx, dtype=np.int64).reshape(-1)
        v = np.broadcast_to(np.asarray(given_vals, dtype=np.float64), i.shape).copy()
        _tree_kernels.set_leaves(values, layout, state, 0, i, v)
        assert np.array_equal(tree.kernel_arrays()[0], values)
        assert tree.nnz == reference.nnz
    for bad_idx in (np.array([0, capacity]), torch.tensor([-1, 3])):
        with pytest.raises(IndexError):
            tree[bad_idx] = np.array([1.0, 1.0])
    with pytest.raises(ValueError, match="finite"):
        tree[torch.tensor([1, 2])] = torch.tensor([1.0, float("nan")])
    with pytest.raises(ValueError, match="same length"):
        tree[np.array([1, 2, 3])] = np.array([1.0, 2.0])
    assert np.array_equal(tree.kernel_arrays()[0], values)  # failed calls wrote nothing
