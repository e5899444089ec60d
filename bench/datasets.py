"""Offline datasets made here, and the offline and hybrid learning measured on them.

    python bench/datasets.py pendulum [--seed N]         # writes datasets/pendulum-sac-v0
    python bench/datasets.py offline iql [--seeds 0,1,2] # graphs/iql_pendulum_offline.yaml
    python bench/datasets.py offline bc [--seeds 0,1,2]  # graphs/bc_pendulum_offline.yaml
    python bench/datasets.py hybrid [--seeds 0,1,2]      # graphs/sac_pendulum_hybrid.yaml,
                                                         # with and without the dataset
    python bench/datasets.py halfcheetah-medium          # the procedure, see below
    python bench/datasets.py halfcheetah-medium-replay

``pendulum`` is the reference procedure of the Pendulum dataset: graphs/sac_pendulum.yaml run
to 10,000 env steps (no early stop at -200, a replay ring of 10,000 steps), then
``run.py dataset`` on its final checkpoint into ``datasets/pendulum-sac-v0``, where the offline
and hybrid graphs read it by default. It prints the dataset's episode returns.

``offline`` and ``hybrid`` run the graphs for real, one run per seed (``--seed`` of run.py:
every node's seed plus N), and print each run's result and the median: for offline graphs the
best evaluation and the updates at which it first reached -200; for hybrid the env steps at
which the evaluation first reached -200, with the dataset and without it
(``--set nodes.replay_store.config.datasets=null`` and ``offline_pretrain_batches=0``: the same
graph otherwise).

HalfCheetah (not measured yet: it needs a SAC HalfCheetah-v5 run of about 1M env steps, hours
on the 2-core machine): ``halfcheetah-medium-replay`` is ``run.py dataset`` of the checkpoint at
which that run's evaluation first reached a third to a half of its best return (a
``checkpointer`` with ``num_checkpoints`` large enough to keep it); ``halfcheetah-medium`` plays
that checkpoint's policy (``conduit.load_policy(RUN, which=CKPT)``, stochastic actions) for
200,000+ steps and writes the episodes with ``storage.datasets.write_dataset``. The
normalized score's 0 and 100 are a uniform random policy's return and that run's best.

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PENDULUM = os.path.join("datasets", "pendulum-sac-v0")
THRESHOLD = -200.0


def _run(graph: str, run_dir: str, seed: int, *overrides: str) -> int:
    cmd = [sys.executable, os.path.join(ROOT, "run.py"), "run", "--quiet",
           os.path.join(ROOT, graph), "--run-dir", run_dir, "--seed", str(seed)]
    for item in overrides:
        cmd += ["--set", item]
    return subprocess.run(cmd, cwd=ROOT).returncode


def _evals(run_dir: str) -> list[tuple[int, float]]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [(m["env_steps"], m["eval/return"]) for m in rows if "eval/return" in m]


def pendulum(args) -> dict:
    """The SAC run and its replay as a dataset (see the module doc)."""
    to = os.path.join(ROOT, args.to or PENDULUM)
    if os.path.exists(to):
        raise SystemExit(f"{to} exists: remove it to make it again")
    run_dir = os.path.join(ROOT, "runs", "datasets", f"sac_pendulum_10k-{time.strftime('%Y%m%d-%H%M%S')}")
    started = time.monotonic()
    code = _run("graphs/sac_pendulum.yaml", run_dir, args.seed,
                "nodes.learner.config.num_env_steps=10000",
                "nodes.evaluator.config.stop_at_return=null",
                "nodes.replay_store.config.max_length=10000")
    if code != 0:
        raise SystemExit(f"the SAC run failed ({code}): {run_dir}")
    made = subprocess.run([sys.executable, os.path.join(ROOT, "run.py"), "dataset", run_dir,
                           "--to", to], cwd=ROOT)
    if made.returncode != 0:
        raise SystemExit(made.returncode)
    sys.path.insert(0, ROOT)
    from storage.datasets import Dataset

    returns = [float(ep.rewards.sum()) for ep in Dataset(to).episodes()]
    evals = _evals(run_dir)
    return {"dataset": to, "run_dir": run_dir, "seed": args.seed,
            "wall_s": round(time.monotonic() - started, 1), "episodes": len(returns),
            "transitions": None if not returns else Dataset(to).total_steps,
            "episode_return_mean": round(statistics.fmean(returns), 1),
            "episode_return_last10": round(statistics.fmean(returns[-10:]), 1),
            "sac_best_eval": max((r for _, r in evals), default=None)}


def offline(args) -> dict:
    graph = f"graphs/{args.algorithm}_pendulum_offline.yaml"
    runs = []
    for seed in args.seeds:
        run_dir = os.path.join(ROOT, "runs", "datasets",
                               f"{args.algorithm}_offline-s{seed}-{time.strftime('%H%M%S')}")
        started = time.monotonic()
        code = _run(graph, run_dir, seed, *args.set)
        evals = _evals(run_dir) if code == 0 else []
        hit = next((s for s, r in evals if r >= THRESHOLD), None)
        runs.append({"seed": seed, "exit": code, "best": max((r for _, r in evals), default=None),
                     "final": evals[-1][1] if evals else None, "updates_to_threshold": hit,
                     "wall_s": round(time.monotonic() - started, 1), "run_dir": run_dir})
        print(json.dumps(runs[-1]), flush=True)
    best = [r["best"] for r in runs if r["best"] is not None]
    return {"graph": graph, "runs": runs,
            "median_best": statistics.median(best) if best else None}


def hybrid(args) -> dict:
    graph = "graphs/sac_pendulum_hybrid.yaml"
    out: dict = {"graph": graph, "with": [], "without": []}
    for seed in args.seeds:
        for arm, extra in (("with", ()), ("without", (
                "nodes.replay_store.config.datasets=null",
                "nodes.replay_store.config.offline_pretrain_batches=0"))):
            if arm not in args.arms:
                continue
            run_dir = os.path.join(ROOT, "runs", "datasets",
                                   f"hybrid-{arm}-s{seed}-{time.strftime('%H%M%S')}")
            started = time.monotonic()
            code = _run(graph, run_dir, seed, *extra, *args.set)
            evals = _evals(run_dir) if code == 0 else []
            hit = next((s for s, r in evals if r >= THRESHOLD), None)
            out[arm].append({"seed": seed, "exit": code, "env_steps_to_threshold": hit,
                             "wall_s": round(time.monotonic() - started, 1),
                             "run_dir": run_dir})
            print(json.dumps({arm: out[arm][-1]}), flush=True)
    for arm in ("with", "without"):
        steps = [r["env_steps_to_threshold"] for r in out[arm]
                 if r["env_steps_to_threshold"] is not None]
        out[f"median_{arm}"] = statistics.median(steps) if len(steps) == len(out[arm]) else None
    if out["median_with"] and out["median_without"]:
        out["ratio"] = round(out["median_with"] / out["median_without"], 2)
    return out


def halfcheetah(args) -> dict:
    raise SystemExit(f"{args.command}: not measured yet; the procedure is in the module doc "
                     f"of bench/datasets.py (a SAC HalfCheetah-v5 run of about 1M env steps)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pendulum", help="write datasets/pendulum-sac-v0 from a SAC run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--to", help=f"the dataset directory (default {PENDULUM})")
    p = sub.add_parser("offline", help="an offline Pendulum graph, one run per seed")
    p.add_argument("algorithm", choices=["iql", "bc"])
    p = sub.add_parser("hybrid", help="the hybrid SAC graph with and without the dataset")
    p.add_argument("--arms", type=lambda s: s.split(","), default=["with", "without"],
                   help="with,without (default both)")
    for name in ("offline", "hybrid"):
        sub.choices[name].add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")],
                                       default=[0, 1, 2])
        sub.choices[name].add_argument("--set", action="append", default=[],
                                       help="a graph override for every run")
    sub.add_parser("halfcheetah-medium")
    sub.add_parser("halfcheetah-medium-replay")
    args = ap.parse_args(argv)
    run = {"pendulum": pendulum, "offline": offline, "hybrid": hybrid}.get(args.command,
                                                                          halfcheetah)
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
