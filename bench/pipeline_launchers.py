"""Env steps/s through a Ray-placed graph vs the local launcher, on the same machine.

    python bench/pipeline_launchers.py [--envs-per-runner 256] [--runners 2] [--seconds 10]
                                       [--ray-address HOST:PORT]

The graph of ``bench/pipeline_throughput.py`` (env_runner x N -> unroller with a random policy
-> experience -> replay_store), run three ways in turn: the local launcher over ipc (the
default), the local launcher over tcp with CurveZMQ, and ``run.launcher: ray`` over tcp with
CurveZMQ (each node replica a process started by a Ray actor). The rate is the replay store's
insert counter over ``--seconds`` after a warm-up. Without ``--ray-address`` a one-node Ray
cluster on 127.0.0.1 is started here for the measurement. The last line is one JSON object;
target (issue 12): ray >= 0.8 of local.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep loopback addresses

from bench.pipeline_throughput import GRAPH, RUNNERS  # noqa: E402
from pipeline.cli import control  # noqa: E402

WAYS = {"local-ipc": [], "local-tcp+curve": ["run.transport=tcp"],
        "ray-tcp+curve": ["run.transport=tcp", "run.launcher=ray"]}


def rate(overrides: list, runners: int, envs: int, seconds: float, warmup: float) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "graph.yaml")
        with open(path, "w") as f:
            part = RUNNERS.format(runners=runners, envs=envs, groups=1)
            f.write(GRAPH.format(runners_part=part, total=runners * envs, coalesce="false"))
        run_dir = os.path.join(tmp, "run")
        args = [sys.executable, os.path.join(ROOT, "run.py"), "run", path, "--run-dir",
                run_dir, "--quiet"]
        for item in overrides:
            args += ["--set", item]
        proc = subprocess.Popen(args, cwd=ROOT, stderr=subprocess.PIPE, text=True)
        try:
            for line in proc.stderr:
                if line.startswith("control: "):
                    break
            control(run_dir, "wait_ready", timeout=180)

            def inserted() -> int:
                nodes = control(run_dir, "status")["nodes"]
                return nodes["replay_store.0"].get("status", {}).get("inserted", 0)

            while inserted() == 0:  # a period between looks, not a synchronization
                time.sleep(0.5)
            time.sleep(warmup)
            t0, s0 = time.perf_counter(), inserted()
            time.sleep(seconds)
            t1, s1 = time.perf_counter(), inserted()
            control(run_dir, "stop")
            proc.wait(120)
        finally:
            if proc.poll() is None:
                proc.kill()
        return (s1 - s0) / (t1 - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs-per-runner", type=int, default=256)
    parser.add_argument("--runners", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--ray-address", help="an existing Ray cluster (default: start one)")
    args = parser.parse_args()
    cluster = None
    address = args.ray_address
    if address is None:
        from ray.cluster_utils import Cluster

        cluster = Cluster(initialize_head=True, head_node_args={
            "node_ip_address": "127.0.0.1", "num_cpus": os.cpu_count()})
        address = cluster.address
    results = {}
    try:
        for way, overrides in WAYS.items():
            extra = [f"run.ray_address={address}"] if "ray" in way else []
            results[way] = round(rate(overrides + extra, args.runners, args.envs_per_runner,
                                      args.seconds, args.warmup), 1)
            print(f"{way:>16} {results[way]:>10.0f} env steps/s", flush=True)
    finally:
        if cluster is not None:
            cluster.shutdown()
    print(json.dumps({"bench": "pipeline_launchers", "runners": args.runners,
                      "envs_per_runner": args.envs_per_runner, "cpus": os.cpu_count(),
                      "steps_per_s": results,
                      "ray_over_local_ipc": round(results["ray-tcp+curve"] /
                                                  results["local-ipc"], 3),
                      "ray_over_local_tcp": round(results["ray-tcp+curve"] /
                                                  results["local-tcp+curve"], 3)}))


if __name__ == "__main__":
    main()
