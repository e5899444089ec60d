"""The replay benchmark's peers (cpprb, TorchRL), run in their own process.

TorchRL's compiled extension loads only with the torch it was built for (0.14.1: torch
2.14.1), which is not the project's torch; ``bench/peers/setup.sh`` builds a venv that has
it, and ``bench/replay.py`` starts this file there (any python works: a peer that does not
import is reported as skipped, with the reason). Nothing here imports the project.

Protocol (one JSON object per line): started with ``--capacity --batch --calls``, it builds
every peer, warms each up and prints ``{"ready": ..., "torch": ..., "skipped": {...}}``;
then for each ``round`` read on stdin it runs one round of every contender and prints their
mean µs per call (CPU time of this process); ``quit`` ends it. The driver takes its own
rounds in between, so both processes see the same moments of a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

NUM_ENVS = 16
FRESH_SETS = 128  # threshold sets cycled through, so searches do not hit a warm cache


def tree_inputs(capacity: int, batch: int):
    """Leaves, indices and two priority sets, the same in every process (numpy seeds)."""
    leaves = np.random.default_rng(3).random(capacity) + 0.01
    idx = np.random.default_rng(0).integers(0, capacity, batch)
    vals = [np.random.default_rng(seed).random(batch) + 0.1 for seed in (1, 2)]
    return leaves, idx, vals


def step_inputs():
    """One step of NUM_ENVS environments, the four fields both buffers store (numpy)."""
    return {
        "step_type": np.ones(NUM_ENVS, dtype=np.int64),
        "reward": np.ones(NUM_ENVS, dtype=np.float32),
        "discount": np.ones(NUM_ENVS, dtype=np.float32),
        "observation": np.random.default_rng(4).random((NUM_ENVS, 4)).astype(np.float32),
    }


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


def warm_up(contenders: dict) -> None:
    for fn, calls in contenders.values():
        for _ in range(min(calls, 20)):
            fn()


def one_round(contenders: dict) -> dict[str, float]:
    """Mean µs of CPU time per call of each ``name: (fn, calls)``, one round."""
    times = {}
    for name, (fn, calls) in contenders.items():
        start = time.process_time()
        for _ in range(calls):
            fn()
        times[name] = (time.process_time() - start) / calls * 1e6
    return times


def bench_cpprb(capacity, batch, calls, skipped):
    try:
        import cpprb
    except ImportError as exc:
        skipped["cpprb"] = f"not importable: {exc}"
        return {}
    # The same four fields our buffer stores (step type, reward, discount, observation).
    fields = {"obs": {"shape": 4}, "step_type": {"dtype": np.int64}, "rew": {}, "discount": {}}
    rb = cpprb.PrioritizedReplayBuffer(capacity, fields, alpha=0.6)
    chunk = min(65536, capacity)
    for _ in range(capacity // chunk):
        rb.add(obs=np.random.rand(chunk, 4), step_type=np.ones(chunk, dtype=np.int64),
               rew=np.ones(chunk), discount=np.ones(chunk),
               priorities=np.random.rand(chunk) + 0.1)
    _, idx, prios = tree_inputs(capacity, batch)
    update = rb.update_priorities
    s = step_inputs()
    step = {"obs": s["observation"], "step_type": s["step_type"], "rew": s["reward"],
            "discount": s["discount"]}
    return {
        "cpprb.update": (alternating(update, (idx, idx), prios), calls),
        "cpprb.update_repeated": (lambda: update(idx, prios[0]), calls),
        "cpprb.get_batch": (lambda: rb.sample(batch, beta=0.4), calls),
        "cpprb.add_batch": (lambda: rb.add(**step), calls),
    }


def bench_torchrl(capacity, batch, calls, skipped):
    try:
        import torch
        from tensordict import TensorDict
        from torchrl._torchrl import SumSegmentTreeFp64
        from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer
    except Exception as exc:  # ImportError, or a compiled extension built for another torch
        version = sys.modules["torch"].__version__ if "torch" in sys.modules else "none"
        skipped["torchrl"] = (
            f"not importable with torch {version}: {exc!s:.160} "
            "(bash bench/peers/setup.sh builds a venv where it is)"
        )
        return {}
    torch.set_num_threads(1)
    leaves, idx, vals = tree_inputs(capacity, batch)
    tree = SumSegmentTreeFp64(capacity)
    tree[np.arange(capacity)] = leaves
    total = tree.query(0, capacity)
    rng = np.random.default_rng(5)
    thresholds = [rng.random(batch) * total for _ in range(FRESH_SETS)]
    rb = TensorDictPrioritizedReplayBuffer(
        alpha=0.6, beta=0.4, storage=LazyTensorStorage(capacity), batch_size=batch
    )
    chunk = min(65536, capacity)
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--calls", type=int, required=True)
    args = parser.parse_args(argv)
    skipped = {}
    contenders = bench_cpprb(args.capacity, args.batch, args.calls, skipped)
    contenders |= bench_torchrl(args.capacity, args.batch, args.calls, skipped)
    warm_up(contenders)
    torch = sys.modules.get("torch")
    ready = {"ready": True, "python": sys.executable, "skipped": skipped,
             "torch": torch.__version__ if torch else None}
    print(json.dumps(ready), flush=True)
    for line in sys.stdin:
        if line.strip() != "round":
            break
        print(json.dumps(one_round(contenders)), flush=True)


if __name__ == "__main__":
    main()
