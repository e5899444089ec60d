"""Replay storage benchmark: our trees and buffer against peers, one CPU thread.

For each capacity (2^17 and 2^20 by default) and batch 256 it times, in microseconds of
this process's CPU time per call, best of several rounds of many calls. Every contender
runs one round in turn, round after round, so all of them see the same moments of a
shared machine; CPU time leaves out the time other processes hold the core, which wall
time would not. The operations:

  (a) priority update of 256 slots, the priorities alternating between two random sets
      (``update``), and the same priorities every call (``update_repeated``: peers may
      skip unchanged leaves, so this is the cheapest case)
  (b) prioritized sample of 256 indices (fresh random numbers every call)
  (c) full get_batch of 256 (4-float observation, with importance weights)
  (d) add_batch of one step for each of 16 environments, four fields (step type, reward,
      discount, 4-float observation) given as numpy arrays to both (``add_batch_torch``:
      ours given torch tensors)

for Conduit (default kernel, plus every other tree kernel for (a)/(b)), a level-by-level
binary torch tree in ALF's design, cpprb's PrioritizedReplayBuffer and TorchRL's
prioritized buffer and C++ segment trees when they import (optional: TorchRL's compiled
extension needs the torch it was built for; a peer that does not import is reported as
skipped with the reason). The last line is one JSON object with every time and the
ratios peer / ours (above 1 means we are faster).

    python bench/replay.py [--capacities 17 20] [--batch 256] [--quick]

``--memory STEPS`` instead reports the replay memory of STEPS Atari transitions (84x84 uint8
frames stored once, stacks of 4 rebuilt at sample time, PER with a beta), as the replay store
builds it: the arrays are allocated for real, memory-mapped in a scratch directory (new files
are sparse, so nothing is written), and the report gives every file's size, the trees held in
process memory, and what storing the stacks would cost instead.

    python bench/replay.py --memory 1000000 [--scratch DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from storage import PER, ReplayBuffer, SumSegmentTree, TensorSpec  # noqa: E402
from storage.segment_tree import available_backends, default_backend  # noqa: E402

NUM_ENVS = 16


def measure(contenders: dict, rounds: int) -> dict[str, float]:
    """Best mean µs per call of each ``name: (fn, calls)``, rounds interleaved."""
    for fn, calls in contenders.values():
        for _ in range(min(calls, 20)):
            fn()
    best = dict.fromkeys(contenders, float("inf"))
    for _ in range(rounds):
        for name, (fn, calls) in contenders.items():
            start = time.process_time()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.process_time() - start) / calls * 1e6)
    return best


def alternating(fn, *pairs):
    """A call of ``fn`` whose arguments alternate between ``pairs[i][0]`` and ``[1]``."""
    args = [tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)]
    turn = [0]

    def call():
        turn[0] ^= 1
        return fn(*args[turn[0]])

    return call


def cycling(fn, inputs):
    """A call of ``fn`` on the next of ``inputs`` (fresh data without drawing it in the loop)."""
    turn = [0]

    def call():
        turn[0] = (turn[0] + 1) % len(inputs)
        return fn(inputs[turn[0]])

    return call


class BinaryTorchTree:
    """ALF's layout, for reference: binary sum tree walked level by level with torch ops."""

    def __init__(self, capacity: int):
        self.leaf0 = 1 << max(1, (capacity - 1).bit_length())
        self.values = torch.zeros(2 * self.leaf0, dtype=torch.float64)
        self.depth = self.leaf0.bit_length() - 1

    def fill(self, leaves):
        self.values[self.leaf0 : self.leaf0 + leaves.numel()] = leaves
        for level in range(self.depth - 1, -1, -1):
            lo, hi = 1 << level, 1 << (level + 1)
            self.values[lo:hi] = (
                self.values[2 * lo : 2 * hi : 2] + self.values[2 * lo + 1 : 2 * hi : 2]
            )

    def set(self, idx, vals):
        nodes = idx + self.leaf0
        self.values[nodes] = vals
        for _ in range(self.depth):
            nodes = torch.unique(nodes >> 1)
            self.values[nodes] = self.values[2 * nodes] + self.values[2 * nodes + 1]

    def find(self, thresholds):
        nodes = torch.ones_like(thresholds, dtype=torch.int64)
        t = thresholds.clone()
        for _ in range(self.depth):
            left = self.values[2 * nodes]
            go_right = t >= left
            t = torch.where(go_right, t - left, t)
            nodes = 2 * nodes + go_right.to(torch.int64)
        return nodes - self.leaf0


FRESH_SETS = 128  # threshold sets cycled through, so searches do not hit a warm cache


def bench_ours(capacity, batch, calls):
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(capacity, (batch,), generator=gen)
    prios = [torch.rand(batch, generator=gen) + 0.1 for _ in range(2)]
    leaves = torch.rand(capacity, generator=gen, dtype=torch.float64) + 0.01
    contenders = {}
    for backend in available_backends("cpu"):
        tree = SumSegmentTree(capacity, backend=backend)
        tree.fill(leaves)
        thresholds = [
            torch.rand(batch, generator=gen, dtype=torch.float64) * tree.total()
            for _ in range(FRESH_SETS)
        ]
        n = max(calls // 10, 20) if backend == "torch" else calls
        update = alternating(tree.__setitem__, (idx, idx), prios)
        contenders[f"conduit_tree[{backend}].update"] = (update, n)
        search = cycling(tree.find_sum_bound, thresholds)
        contenders[f"conduit_tree[{backend}].sample_indices"] = (search, n)

    spec = {
        "step_type": TensorSpec((), torch.int64),
        "reward": TensorSpec(()),
        "discount": TensorSpec(()),
        "observation": TensorSpec((4,)),
    }
    rb = ReplayBuffer(
        spec, NUM_ENVS, capacity // NUM_ENVS, prioritized_sampling=True, per=PER(alpha=0.6), seed=0
    )
    _bulk_fill(rb, capacity)
    env_ids = idx % NUM_ENVS
    positions = rb.writer.current_pos[env_ids] - 1 - (idx // NUM_ENVS) % (capacity // NUM_ENVS)
    update = rb.update_priority
    as_numpy = [t.numpy() for t in (env_ids, positions, *prios)]
    g = torch.Generator().manual_seed(1)
    step = _step_batch(NUM_ENVS, 0)
    step_numpy = {k: v.numpy() for k, v in step.items()}  # what cpprb's add is given
    contenders |= {
        "conduit_buffer.update": (
            alternating(update, (env_ids, env_ids), (positions, positions), prios),
            calls,
        ),
        "conduit_buffer.update_repeated": (lambda: update(env_ids, positions, prios[0]), calls),
        "conduit_buffer.update_numpy": (
            alternating(update, as_numpy[:1] * 2, as_numpy[1:2] * 2, as_numpy[2:]),
            calls,
        ),
        "conduit_buffer.sample_indices": (
            lambda: rb.sampler.sample(batch, g, with_replacement=True),
            calls,
        ),
        "conduit_buffer.get_batch": (lambda: rb.get_batch(batch, 1), calls),
        "conduit_buffer.add_batch": (lambda: rb.add_batch(step_numpy), calls),
        "conduit_buffer.add_batch_torch": (lambda: rb.add_batch(step), calls),
    }
    return contenders


def _step_batch(n, t):
    return {
        "step_type": torch.ones(n, dtype=torch.int64),
        "reward": torch.ones(n),
        "discount": torch.ones(n),
        "observation": torch.full((n, 4), float(t)),
    }


def _bulk_fill(rb, capacity):
    """Fill every ring (writing the parts directly is much faster than 65k add_batch calls)."""
    length = capacity // NUM_ENVS
    rb.storage.data["observation"].copy_(torch.rand(NUM_ENVS, length, 4))
    rb.storage.data["step_type"].fill_(1)
    rb.storage.data["reward"].fill_(1.0)
    rb.storage.data["discount"].fill_(1.0)
    rb.writer.current_pos.fill_(length)
    rb.writer.current_size.fill_(length)
    rb.sampler.priority.copy_(torch.rand(NUM_ENVS * length, dtype=torch.float64) + 0.1)
    rb.sampler.rebuild()


def bench_alf_tree(capacity, batch, calls):
    gen = torch.Generator().manual_seed(0)
    tree = BinaryTorchTree(capacity)
    tree.fill(torch.rand(capacity, generator=gen, dtype=torch.float64) + 0.01)
    idx = torch.randint(capacity, (batch,), generator=gen)
    vals = [torch.rand(batch, generator=gen, dtype=torch.float64) for _ in range(2)]
    total = float(tree.values[1])
    thresholds = [
        torch.rand(batch, generator=gen, dtype=torch.float64) * total for _ in range(FRESH_SETS)
    ]
    n = max(calls // 20, 10)
    return {
        "alf_binary_torch_tree.update": (alternating(tree.set, (idx, idx), vals), n),
        "alf_binary_torch_tree.sample_indices": (cycling(tree.find, thresholds), n),
    }


def bench_cpprb(capacity, batch, calls, skipped):
    try:
        import cpprb
    except ImportError as exc:
        skipped["cpprb"] = f"not importable: {exc}"
        return {}
    # The same four fields our buffer stores (step type, reward, discount, observation).
    fields = {"obs": {"shape": 4}, "step_type": {"dtype": np.int64}, "rew": {}, "discount": {}}
    rb = cpprb.PrioritizedReplayBuffer(capacity, fields, alpha=0.6)
    chunk = 65536
    for _ in range(capacity // chunk):
        rb.add(obs=np.random.rand(chunk, 4), step_type=np.ones(chunk, dtype=np.int64),
               rew=np.ones(chunk), discount=np.ones(chunk),
               priorities=np.random.rand(chunk) + 0.1)
    idx = np.random.default_rng(0).integers(0, capacity, batch)
    prios = [np.random.default_rng(seed).random(batch) + 0.1 for seed in (1, 2)]
    update = rb.update_priorities
    step = {"obs": np.random.rand(NUM_ENVS, 4), "step_type": np.ones(NUM_ENVS, dtype=np.int64),
            "rew": np.ones(NUM_ENVS), "discount": np.ones(NUM_ENVS)}
    return {
        "cpprb.update": (alternating(update, (idx, idx), prios), calls),
        "cpprb.update_repeated": (lambda: update(idx, prios[0]), calls),
        "cpprb.get_batch": (lambda: rb.sample(batch, beta=0.4), calls),
        "cpprb.add_batch": (lambda: rb.add(**step), calls),
    }


def bench_torchrl(capacity, batch, calls, skipped):
    try:
        from tensordict import TensorDict
        from torchrl._torchrl import SumSegmentTreeFp64
        from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer
    except Exception as exc:  # ImportError, or a compiled extension built for another torch
        skipped["torchrl"] = f"not importable with torch {torch.__version__}: {exc!s:.160}"
        return {}
    tree = SumSegmentTreeFp64(capacity)
    tree[np.arange(capacity)] = np.random.rand(capacity) + 0.01
    idx = np.random.default_rng(0).integers(0, capacity, batch)
    vals = [np.random.rand(batch) for _ in range(2)]
    total = tree.query(0, capacity)
    thresholds = [np.random.rand(batch) * total for _ in range(FRESH_SETS)]
    rb = TensorDictPrioritizedReplayBuffer(
        alpha=0.6, beta=0.4, storage=LazyTensorStorage(capacity), batch_size=batch
    )
    chunk = 65536
    for _ in range(capacity // chunk):
        rb.extend(TensorDict({"obs": torch.rand(chunk, 4)}, batch_size=[chunk]))
    index = rb.sample()["index"]
    prios = [torch.rand(batch) + 0.1 for _ in range(2)]
    return {
        "torchrl_cpp_tree.update": (alternating(tree.__setitem__, (idx, idx), vals), calls),
        "torchrl_cpp_tree.sample_indices": (cycling(tree.scan_lower_bound, thresholds), calls),
        "torchrl_buffer.get_batch": (lambda: rb.sample(), calls // 4),
        "torchrl_buffer.update": (
            alternating(rb.update_priority, (index, index), prios),
            calls // 4,
        ),
    }


PEER_FOR = {
    "update": ["torchrl_cpp_tree", "cpprb", "torchrl_buffer", "alf_binary_torch_tree"],
    "update_repeated": ["cpprb"],
    "sample_indices": ["torchrl_cpp_tree", "alf_binary_torch_tree"],
    "get_batch": ["cpprb", "torchrl_buffer"],
    "add_batch": ["cpprb"],
}


def atari_memory(steps: int, scratch: str | None, num_envs: int = 8, k: int = 4) -> dict:
    """Bytes of a replay buffer of ``steps`` Atari transitions, allocated memory-mapped."""
    import shutil
    import tempfile

    from storage import PER
    from storage.frame_stack import check_stackable

    # One stored step as the unroller sends it for DQN on Atari (one new frame per step).
    spec = {
        "step_type": TensorSpec((), torch.int32),
        "reward": TensorSpec((), torch.float32),
        "discount": TensorSpec((), torch.float32),
        "observation": TensorSpec((84, 84), torch.uint8),
        "action": TensorSpec((), torch.int64),
        "env_id": TensorSpec((), torch.int32),
    }
    directory = tempfile.mkdtemp(prefix="replay-memory-", dir=scratch)
    try:
        started = time.perf_counter()
        rb = ReplayBuffer(spec, num_envs, steps // num_envs, num_earliest_frames_ignored=k - 1,
                          keep_episodic_info=True, prioritized_sampling=True,
                          per=PER(0.6, 0.4, 1e-6), storage_dir=directory)
        check_stackable(rb, "observation", k)
        built_s = time.perf_counter() - started
        files = {n: os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory)
                 if n.endswith(".bin")}
        trees = [t for t in (rb.sampler.sum_tree, rb.sampler.max_tree, rb.sampler.min_tree)
                 if t is not None]
        tree_bytes = sum(t._values.numel() * t._values.element_size() for t in trees)
        frames = files["data.observation.bin"]
        total = sum(files.values()) + tree_bytes
        rb.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    gib = 2**30
    return {
        "steps": num_envs * (steps // num_envs),
        "frame_stack": k,
        "mapped_files_bytes": files,
        "frames_GiB": round(frames / gib, 3),
        "other_arrays_GiB": round((sum(files.values()) - frames) / gib, 3),
        "trees_in_memory_GiB": round(tree_bytes / gib, 3),
        "total_GiB": round(total / gib, 3),
        "stacks_stored_instead_GiB": round((total + (k - 1) * frames) / gib, 3),
        "build_s": round(built_s, 2),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacities", type=int, nargs="+", default=[17, 20], help="log2 sizes")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="fewer calls (smoke run)")
    parser.add_argument("--memory", type=int, metavar="STEPS",
                        help="report the replay memory of STEPS Atari transitions instead")
    parser.add_argument("--scratch", help="directory for --memory's mapped files (default: tmp)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.memory:
        report = atari_memory(args.memory, args.scratch)
        for name, value in report.items():
            print(f"  {name:28s} {value}")
        print(json.dumps(report))
        return
    calls, rounds = (50, 2) if args.quick else (200, 15)
    report = {
        "batch": args.batch,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "default_tree_kernel": default_backend("cpu"),
        "results_us": {},
        "ratios_peer_over_ours": {},
        "skipped": {},
    }
    for log2 in args.capacities:
        capacity = 2**log2
        skipped = {}
        contenders = bench_ours(capacity, args.batch, calls)
        contenders |= bench_alf_tree(capacity, args.batch, calls)
        contenders |= bench_cpprb(capacity, args.batch, calls, skipped)
        contenders |= bench_torchrl(capacity, args.batch, calls, skipped)
        results = measure(contenders, rounds)
        del contenders  # frees this capacity's buffers before the next
        key = f"2^{log2}"
        report["results_us"][key] = {k: round(v, 1) for k, v in results.items()}
        report["skipped"].update(skipped)
        ratios = {}
        ours_for = {
            "update": results["conduit_buffer.update"],
            "update_repeated": results["conduit_buffer.update_repeated"],
            "sample_indices": results["conduit_buffer.sample_indices"],
            "get_batch": results["conduit_buffer.get_batch"],
            "add_batch": results["conduit_buffer.add_batch"],
        }
        print(f"capacity {key}, batch {args.batch}, one thread (microseconds per call)")
        for name, value in results.items():
            print(f"  {name:45s} {value:10.1f}")
        for op, peers in PEER_FOR.items():
            for peer in peers:
                if f"{peer}.{op}" in results:
                    ratios[f"{peer}.{op}"] = round(results[f"{peer}.{op}"] / ours_for[op], 2)
        report["ratios_peer_over_ours"][key] = ratios
        for name, why in skipped.items():
            print(f"  skipped {name}: {why}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
