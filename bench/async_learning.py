"""Lock-step PPO against the asynchronous graphs (APPO, IMPALA, APPO without V-trace) on the
same task, through the multi-process graph: env steps and wall-clock to a return threshold,
and the policy lag the learner measured, per seed, with the medians and ratios to PPO.

    python bench/async_learning.py                       # MinAtar Breakout, seeds 0,1,2, to 8
    python bench/async_learning.py --seeds 0 --graphs ppo_minatar appo_minatar
    python bench/async_learning.py --budget 300000       # stop every run there
    python bench/async_learning.py --graphs ppo_minatar ppg_minatar --eval-interval 5000

Runs alternate graph by graph within each seed (ppo, appo, ... for seed 0, then seed 1), so a
machine whose load drifts treats them alike. On a machine with many cores, ``--parallel N
--cores-per-run C`` runs N at a time, each pinned to its own C cores (``taskset``; the
graph's processes inherit it), so every run has a 2-core machine of its own, as here. Each run is ``python run.py run GRAPH --seed S``
with the evaluator stopping the run at the threshold; the clock runs from the launch of
``run.py`` to the moment the parameters that reached the threshold arrived at the evaluator
(the evaluation's own duration taken off, as ``bench/learning.py`` does). The last line is one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
_JIT = ["nodes.learner.config.publish_between_epochs=true", "nodes.unroller.config.just_in_time=true"]
# No-V-trace APPO: the same graph with the correction off (plain GAE on the lagged data).
VARIANTS = {"appo_minatar_novtrace": ("appo_minatar", ["agent.algorithm.vtrace=false"]),
            # Decoupled PPO: the clip against the learner's network, not the behaviour's.
            "appo_minatar_learner": ("appo_minatar", ["agent.algorithm.proximal_policy=learner"]),
            # One unroll ahead: the unroller waits after two unrolls per version.
            "appo_minatar_ahead": ("appo_minatar",
                                   ["nodes.unroller.config.max_unrolls_per_version=2"]),
            # Collecting regardless of the queue (the graphs before max_queued_unrolls: 0): the
            # runner fills the queue ahead of the learner, lag ~2 versions instead of ~1.
            "appo_minatar_queued": ("appo_minatar",
                                    ["nodes.unroller.config.max_queued_unrolls=null"]),
            "impala_minatar_queued": ("impala_minatar",
                                      ["nodes.unroller.config.max_queued_unrolls=null"]),
            # The clip: PPO's 0.2 (the graph before 2026-11-29) against the graph's 0.3, and 6
            # epochs at 0.2, each named for what it sets whatever the graph's own value.
            "appo_minatar_clip02": ("appo_minatar",
                                    ["agent.algorithm.importance_ratio_clipping=0.2"]),
            "appo_minatar_clip03": ("appo_minatar",
                                    ["agent.algorithm.importance_ratio_clipping=0.3"]),
            "appo_minatar_epochs6": ("appo_minatar", [
                "agent.algorithm.importance_ratio_clipping=0.2", "agent.algorithm.num_epochs=6"]),
            "appo_minatar_clip03_epochs6": ("appo_minatar", [
                "agent.algorithm.importance_ratio_clipping=0.3", "agent.algorithm.num_epochs=6"]),
            # The learner's update on 2 torch threads (the graphs' 1): lock-step PPO leaves one
            # of 2 cores idle (cores_busy ~1.0).
            "ppo_minatar_threads2": ("ppo_minatar", ["nodes.learner.config.num_threads=2"]),
            "appo_minatar_threads2": ("appo_minatar", ["nodes.learner.config.num_threads=2"]),
            # Shorter unrolls: a version is fewer gradient steps (32 / 16 of 256 samples against
            # the graph's 64), so one version of lag leaves the behaviour policy nearer.
            "appo_minatar_unroll32": ("appo_minatar", ["nodes.unroller.config.unroll_length=32"]),
            "appo_minatar_unroll16": ("appo_minatar", ["nodes.unroller.config.unroll_length=16"]),
            # Just in time: the learner publishes between its epochs, and the unroller starts
            # each unroll about one unroll's time before the learner's batch ends, with them.
            "appo_minatar_jit": ("appo_minatar", [*_JIT]),
            # Lock-step PPO with APPO's clip: is a gain the asynchrony's or the clip's?
            "ppo_minatar_clip03": ("ppo_minatar", ["agent.algorithm.importance_ratio_clipping=0.3"]),
            # ... and with PPO's clip: the graph's 0.3 gives room for a lag of a whole batch.
            "appo_minatar_jit_clip02": ("appo_minatar", [
                *_JIT, "agent.algorithm.importance_ratio_clipping=0.2"]),
            # PPG's auxiliary phase: the graph's (N_pi 2, E_aux 2 since 2026-11-29) against
            # the settings tried before it (N_pi unrolls of 2,048 env steps, E_aux epochs),
            # and fewer policy-phase epochs (the paper's E_pi is 1).
            "ppg_minatar_aux8_auxepochs6": ("ppg_minatar", ["agent.algorithm.aux_interval=8",
                                                            "agent.algorithm.aux_epochs=6"]),
            "ppg_minatar_aux4_auxepochs6": ("ppg_minatar", ["agent.algorithm.aux_interval=4",
                                                            "agent.algorithm.aux_epochs=6"]),
            "ppg_minatar_aux2_auxepochs6": ("ppg_minatar", ["agent.algorithm.aux_epochs=6"]),
            "ppg_minatar_aux4_epochs4": ("ppg_minatar", ["agent.algorithm.aux_interval=4",
                                                         "agent.algorithm.aux_epochs=6",
                                                         "agent.algorithm.num_epochs=4"])}


def run(graph: str, seed: int, threshold: float, budget: int | None,
        cores: str | None = None, timeout_s: float | None = None,
        eval_interval: int | None = None) -> dict:
    base, extra = VARIANTS.get(graph, (graph, []))
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = str(Path(tmp) / "run")
        cmd = ["taskset", "-c", cores] if cores else []
        cmd += [sys.executable, str(ROOT / "run.py"), "run", str(ROOT / "graphs" / f"{base}.yaml"),
               "--run-dir", run_dir, "--quiet", "--seed", str(seed),
               "--set", f"nodes.evaluator.config.stop_at_return={threshold}"]
        if budget:
            cmd += ["--set", f"nodes.learner.config.num_env_steps={budget}"]
        if eval_interval:
            cmd += ["--set", f"nodes.evaluator.config.eval_interval={eval_interval}"]
        for s in extra:
            cmd += ["--set", s]
        if timeout_s:
            cmd += ["--set", f"run.duration_s={timeout_s}", "--set", "run.on_duration=stop"]
        t0 = time.time()
        code, cpu = _run_counting_cpu(cmd)
        wall = time.time() - t0
        with open(Path(run_dir) / "metrics.jsonl") as f:
            records = [json.loads(line) for line in f]
    evals = [m for m in records if "eval/return" in m]
    lags = [m for m in records if "lag/versions_mean" in m]
    hit = next((m for m in evals if m["eval/return"] >= threshold), None)
    for m in evals:
        print(f"[{graph} seed {seed}] steps={m['env_steps']} "
              f"time={m['time'] - m.get('eval/seconds', 0) - t0:.0f}s eval={m['eval/return']:.1f}",
              flush=True)
    return {
        "graph": graph, "seed": seed, "exit_code": code, "reached": hit is not None,
        "env_steps": hit and hit["env_steps"],
        "seconds": hit and round(hit["time"] - hit.get("eval/seconds", 0.0) - t0, 1),
        "best_return": max((m["eval/return"] for m in evals), default=None),
        "total_seconds": round(wall, 1),
        # CPU seconds of all the run's processes per wall-clock second: on a 2-core machine,
        # near 2 means no core idles, so overlapping acting and learning has nothing to gain.
        "cores_busy": round(cpu / wall, 2),
        "total_env_steps": max((m["env_steps"] for m in records), default=0),
        "lag_mean": lags and round(statistics.fmean(m["lag/versions_mean"] for m in lags), 2),
        "lag_max": lags and max(m["lag/versions_max"] for m in lags),
        "dropped_batches": max((m.get("lag/dropped_batches", 0) for m in records), default=0),
    }


def _run_counting_cpu(cmd: list[str]) -> tuple[int, float]:
    """Run ``cmd``; its exit code and the CPU seconds (user + system) it and every process it
    waited for used (``wait4``'s resource usage: the graph's nodes are the supervisor's
    children, reaped by it)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def ratio_interval(ours: list[dict], ref: list[dict], key: str, draws: int = 10_000,
                   level: float = 0.9) -> list[float] | None:
    """How far the ratio of medians (ours / ref) moves with the seeds drawn: a bootstrap
    interval (``level``) over the seeds both graphs ran, resampled with replacement. Where it
    is wide, a target ratio inside it cannot be told met or missed with this many seeds. A run
    that never reached the threshold counts as its whole length (a lower bound)."""
    def by_seed(rows):
        return {r["seed"]: r[key] if r["reached"] else r[f"total_{key}"] for r in rows}

    a, b = by_seed(ours), by_seed(ref)
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 3:
        return None
    x, y = np.array([a[s] for s in seeds], float), np.array([b[s] for s in seeds], float)
    picks = np.random.default_rng(0).integers(0, len(seeds), (draws, len(seeds)))
    ratios = np.median(x[picks], axis=1) / np.median(y[picks], axis=1)
    return [round(float(q), 2) for q in np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])]


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", nargs="+", default=["ppo_minatar", "appo_minatar",
                                                     "impala_minatar", "appo_minatar_novtrace"])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--threshold", type=float, default=8.0)
    ap.add_argument("--budget", type=int, default=None, help="env-step budget of every run")
    ap.add_argument("--timeout", type=float, default=None, help="seconds a run may last")
    ap.add_argument("--eval-interval", type=int, default=None,
                    help="env steps between evaluations (the graphs' 25k makes 'env steps to "
                         "the threshold' a multiple of it)")
    ap.add_argument("--parallel", type=int, default=1, help="runs at a time, each pinned")
    ap.add_argument("--cores-per-run", type=int, default=2)
    ap.add_argument("--read", nargs="+", type=Path, metavar="LOG",
                    help="summarize the per-run lines of earlier runs' output instead (the "
                         "first of --graphs is the reference)")
    args = ap.parse_args(argv)
    jobs = [(graph, seed) for seed in (int(s) for s in args.seeds.split(","))
            for graph in args.graphs]
    results = []
    if args.read:
        results = [json.loads(line) for log in args.read for line in log.read_text().splitlines()
                   if line.startswith('{"graph"')]
        results = [r for r in results if r["graph"] in args.graphs]
    elif args.parallel <= 1:
        for graph, seed in jobs:
            results.append(run(graph, seed, args.threshold, args.budget, None, args.timeout,
                               args.eval_interval))
            print(json.dumps(results[-1]), flush=True)
    else:
        from concurrent.futures import ThreadPoolExecutor

        free = [",".join(str(i * args.cores_per_run + c) for c in range(args.cores_per_run))
                for i in range(args.parallel)]

        def pinned(job):
            cores = free.pop()
            try:
                return run(*job, args.threshold, args.budget, cores, args.timeout,
                           args.eval_interval)
            finally:
                free.append(cores)

        with ThreadPoolExecutor(args.parallel) as pool:
            for r in pool.map(pinned, jobs):
                print(json.dumps(r), flush=True)
                results.append(r)
    summary = {}
    for graph in args.graphs:
        mine = [r for r in results if r["graph"] == graph]
        summary[graph] = {"reached": sum(r["reached"] for r in mine), "runs": len(mine),
                          "median_env_steps": _median([r["env_steps"] for r in mine]),
                          "median_seconds": _median([r["seconds"] for r in mine]),
                          "median_lag_mean": _median([r["lag_mean"] or None for r in mine]),
                          "median_cores_busy": _median([r.get("cores_busy") for r in mine])}
    base = summary.get(args.graphs[0], {})
    for graph, s in summary.items():
        for key in ("env_steps", "seconds"):
            ours, ref = s[f"median_{key}"], base.get(f"median_{key}")
            s[f"{key}_ratio_to_{args.graphs[0]}"] = (round(ours / ref, 3) if ours and ref
                                                     else None)
            s[f"{key}_ratio_90pct"] = ratio_interval(
                [r for r in results if r["graph"] == graph],
                [r for r in results if r["graph"] == args.graphs[0]], key)
        print(f"{graph:24s} reached {s['reached']}/{s['runs']}  median env steps "
              f"{s['median_env_steps']}  median seconds {s['median_seconds']}  "
              f"env-step ratio {s[f'env_steps_ratio_to_{args.graphs[0]}']} "
              f"{s['env_steps_ratio_90pct']}  wall-clock ratio "
              f"{s[f'seconds_ratio_to_{args.graphs[0]}']} {s['seconds_ratio_90pct']}  "
              f"lag {s['median_lag_mean']}  cores busy {s['median_cores_busy']}")
    print(json.dumps({"threshold": args.threshold, "summary": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
