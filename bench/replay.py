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

for Conduit (default kernel, plus every other tree kernel for (a)/(b); ``update_numpy``:
the raw tree given the same numpy arrays as TorchRL's), a level-by-level binary torch tree
in ALF's design, cpprb's PrioritizedReplayBuffer and TorchRL's prioritized buffer and C++
segment trees. The peers run in a second process (``bench/peers/peer_bench.py``) under
the python of ``bench/.venv-peers``, which ``bash bench/peers/setup.sh`` builds with the
torch that TorchRL's compiled extension was built for (2.14.1; the project keeps its own);
the two processes take their rounds in turn. Without that venv the peers run under this
python, and a peer that does not import there is reported as skipped with the reason.
The last line is one JSON object with every time and the ratios peer / ours (above 1
means we are faster); the lines before it give the two targets (the raw tree update
against TorchRL's C++ tree, ``add_batch`` against cpprb) with both figures.

    bash bench/peers/setup.sh      # once: bench/.venv-peers (torch 2.14.1, TorchRL, cpprb)
    python bench/replay.py [--capacities 17 20] [--batch 256] [--quick] [--peers-python PY]

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
import subprocess
import sys
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "peers"))

from peer_bench import (  # noqa: E402
    FRESH_SETS,
    NUM_ENVS,
    alternating,
    cycling,
    one_round,
    step_inputs,
    tree_inputs,
    warm_up,
)

from storage import PER, ReplayBuffer, SumSegmentTree, TensorSpec  # noqa: E402
from storage.segment_tree import available_backends, default_backend  # noqa: E402

PEERS_VENV_PYTHON = os.path.join(HERE, ".venv-peers", "bin", "python")


class Peers:
    """``bench/peers/peer_bench.py`` in a child process, one round per ``round()``."""

    def __init__(self, python: str, capacity: int, batch: int, calls: int):
        script = os.path.join(HERE, "peers", "peer_bench.py")
        self.proc = subprocess.Popen(
            [python, script, "--capacity", str(capacity), "--batch", str(batch),
             "--calls", str(calls)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        self.info = self._read()

    def _read(self) -> dict:
        for line in self.proc.stdout:  # peers may log to stdout: skip what is not JSON
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"peer process exited with {self.proc.wait()}")

    def round(self) -> dict[str, float]:
        self.proc.stdin.write("round\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait()


def measure(contenders: dict, rounds: int, peers: Peers | None = None) -> dict[str, float]:
    """Best mean µs per call of each ``name: (fn, calls)`` and of each peer, rounds
    interleaved (ours, then the peers' process, round after round)."""
    warm_up(contenders)
    best: dict[str, float] = {}
    for _ in range(rounds):
        times = one_round(contenders)
        if peers is not None:
            times |= peers.round()
        for name, value in times.items():
            best[name] = min(best.get(name, float("inf")), value)
    return best


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
        if backend == "numba":
            # The same tree and the same numpy arrays as TorchRL's C++ tree is given.
            same = SumSegmentTree(capacity, backend=backend)
            leaves_np, idx_np, vals_np = tree_inputs(capacity, batch)
            same.fill(torch.from_numpy(leaves_np))
            contenders["conduit_tree[numba].update_numpy"] = (
                alternating(same.__setitem__, (idx_np, idx_np), vals_np),
                n,
            )
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
    step_numpy = step_inputs()  # what cpprb's add is given
    step = {k: torch.from_numpy(v) for k, v in step_numpy.items()}
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


PEER_FOR = {
    "update": ["cpprb", "torchrl_buffer", "alf_binary_torch_tree"],
    "update_repeated": ["cpprb"],
    "sample_indices": ["torchrl_cpp_tree", "alf_binary_torch_tree"],
    "get_batch": ["cpprb", "torchrl_buffer"],
    "add_batch": ["cpprb"],
}
# The issue-13 targets: (label, ours, peer).
TARGETS = [
    ("raw sum-tree update, 256 leaves (numpy in)", "conduit_tree[numba].update_numpy",
     "torchrl_cpp_tree.update"),
    ("add_batch, 16 envs, 4 fields (numpy in)", "conduit_buffer.add_batch", "cpprb.add_batch"),
]


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
    parser.add_argument("--peers-python", help="python that runs the peers (default: "
                        "bench/.venv-peers' if bash bench/peers/setup.sh made it, else this one)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.memory:
        report = atari_memory(args.memory, args.scratch)
        for name, value in report.items():
            print(f"  {name:28s} {value}")
        print(json.dumps(report))
        return
    calls, rounds = (50, 2) if args.quick else (200, 15)
    peers_python = args.peers_python or (
        PEERS_VENV_PYTHON if os.path.exists(PEERS_VENV_PYTHON) else sys.executable
    )
    report = {
        "batch": args.batch,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "default_tree_kernel": default_backend("cpu"),
        "results_us": {},
        "ratios_peer_over_ours": {},
        "targets": {},
        "skipped": {},
    }
    for log2 in args.capacities:
        capacity = 2**log2
        contenders = bench_ours(capacity, args.batch, calls)
        contenders |= bench_alf_tree(capacity, args.batch, calls)
        peers = Peers(peers_python, capacity, args.batch, calls)
        skipped = peers.info["skipped"]
        report["peers_torch"] = peers.info["torch"]
        report["peers_python"] = peers.info["python"]
        results = measure(contenders, rounds, peers)
        peers.close()
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
        targets = {}
        for label, ours, peer in TARGETS:
            if peer in results:
                ratio = results[peer] / results[ours]
                targets[label] = {"ours_us": round(results[ours], 2),
                                  "peer_us": round(results[peer], 2), "peer": peer,
                                  "ratio_peer_over_ours": round(ratio, 2)}
                print(f"  target {label}: ours {results[ours]:.2f} us, {peer} "
                      f"{results[peer]:.2f} us, ratio {ratio:.2f} "
                      f"({'met' if ratio >= 1 else 'NOT met'})")
            else:
                targets[label] = None
                print(f"  target {label}: NOT measured ({peer.split('.')[0]} skipped, below)")
        report["targets"][key] = targets
        for name, why in skipped.items():
            print(f"  skipped {name}: {why}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
