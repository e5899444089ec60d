"""Environment steps per second through the graph vs one process stepping the same envs.

    python bench/pipeline_throughput.py [--envs-per-runner 256] [--seconds 10]
        [--env-groups 2] [--pin env_runner:0,unroller:1,replay_store:1,supervisor:1] [--actor]
        [--repeats 5]

For 1, 2 and 4 env runners (each with ``--envs-per-runner`` CartPole-v1 environments), runs the
real multi-process graph env_runner x N -> unroller (random policy) -> experience -> replay_store
and measures env steps/s after a warm-up, from the replay store's insert counter (every step
that went all the way into replay). In the same run it steps ``N * envs-per-runner`` environments
with random actions in a plain Gymnasium vector env in this one process: the limit the issue
compares with. Prints a table; the last line is one JSON object with the rates and ratios.
``--repeats N`` alternates the two N times and reports medians: on a shared 2-core machine
either rate swings by 10-20% from one run to the next, so one pair can land far from typical.
The last column sets runner 0's CPU time inside its envs' step, per env step (its
``env_step_cpu_s``), beside the one process's time per env step: the same code, so what it
adds is what the graph's other work costs the envs on their CPU.

Why 256 environments per runner by default: every round trip to the unroller and every message
into replay has a fixed cost (a few hundred µs of CPU across three processes on this 2-core
machine), and a CartPole step costs ~10 µs, so a runner needs a batch of this size for stepping
to dominate. ``--envs-per-runner 64`` shows the cost of
smaller batches.

``--actor`` runs the same envs in actors (``kind: actor``, named ``env_runner`` here so the
rest reads alike): each acts with its own copy of the policy, so there is no round trip per
step and the actor publishes the experience itself. That is how a small batch of cheap envs
reaches most of the one-process rate; the unroller's round trip costs about half of it at 64.
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

import gymnasium as gym
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pipeline.cli import control  # noqa: E402

# The runners' part of the graph (env runners and their unroller, or actors), then the rest.
RUNNERS = """
  env_runner:
    kind: env_runner
    replicas: {runners}
    config: {{num_envs: {envs}, env_groups: {groups}}}
    calls: [policy]
  unroller:
    kind: unroller
    serves: [policy]
    publishes: [experience]"""

# ``--actor``: the same envs stepped by actors, each with its own copy of the (random) policy:
# no ``policy`` round trip, the actor publishes its experience itself (nodes/actor.py).
ACTORS = """
  env_runner:
    kind: actor
    replicas: {runners}
    config: {{num_envs: {envs}, env_groups: {groups}}}
    publishes: [experience]"""

GRAPH = """
name: pipeline_throughput
agent: {{env_id: CartPole-v1, algorithm: {{name: random}}}}
topics:
  experience: {{delivery: reliable, hwm: 256, coalesce: {coalesce}}}
nodes:{runners_part}
  replay_store:
    kind: replay_store
    config: {{num_environments: {total}, max_length: 20000}}
    subscribes: [experience]
    serves: [sample]
run:
  duration_s: 600
"""


def single_process_rate(num_envs: int, seconds: float) -> float:
    env = gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP})
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(rng.integers(0, 2, size=num_envs))
        steps += num_envs
    env.close()
    return steps / (time.perf_counter() - start)


def pin_nodes(run_dir: str, supervisor_pid: int, placement: dict[str, int]) -> None:
    """Every thread of each named process (a node by its name, or ``supervisor``) on one CPU:
    its ZeroMQ I/O thread then wakes on the CPU its main thread runs on. For measuring what
    placement does (``--pin``); the graph itself does not pin."""
    pids = {"supervisor": supervisor_pid}
    with open(os.path.join(run_dir, "events.jsonl")) as f:
        for line in f:
            event = json.loads(line)
            if event["topic"].endswith(".started"):  # supervisor.<instance>.started, "pid N"
                pids[event["topic"].split(".")[1]] = int(event["detail"].split()[1])
    for name, cpu in placement.items():
        if name not in pids:
            raise SystemExit(f"--pin: no process {name!r} (have {', '.join(sorted(pids))})")
        for tid in os.listdir(f"/proc/{pids[name]}/task"):
            os.sched_setaffinity(int(tid), {cpu})


def graph_rate(runners: int, envs: int, seconds: float, warmup: float,
               groups: int = 1, placement: dict[str, int] | None = None,
               actor: bool = False, coalesce: bool = False) -> tuple:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "graph.yaml")
        with open(path, "w") as f:
            part = (ACTORS if actor else RUNNERS).format(runners=runners, envs=envs,
                                                          groups=groups)
            f.write(GRAPH.format(runners_part=part, total=runners * envs,
                                 coalesce=str(coalesce).lower()))
        run_dir = os.path.join(tmp, "run")
        proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "run.py"), "run", path,
                                 "--run-dir", run_dir, "--quiet"], cwd=ROOT,
                                stderr=subprocess.PIPE, text=True)
        try:
            for line in proc.stderr:
                if line.startswith("control: "):
                    break
            control(run_dir, "wait_ready", timeout=120)
            if placement:
                pin_nodes(run_dir, proc.pid, placement)

            def sample():
                nodes = control(run_dir, "status")["nodes"]
                runner = nodes["env_runner.0"].get("status", {})
                return (nodes["replay_store.0"].get("status", {}).get("inserted", 0),
                        runner.get("stepping_s", 0.0), runner.get("waiting_s", 0.0),
                        runner.get("steps", 0), runner.get("env_step_cpu_s", 0.0))

            while sample()[0] == 0:  # the replay store allocates its buffer on first data
                time.sleep(0.5)
            time.sleep(warmup)

            t0, (s0, step0, wait0, n0, cpu0) = time.perf_counter(), sample()
            time.sleep(seconds)
            t1, (s1, step1, wait1, n1, cpu1) = time.perf_counter(), sample()
            control(run_dir, "stop")
            proc.wait(120)
        finally:
            if proc.poll() is None:
                proc.kill()
        # Where runner 0's time went: stepping its envs vs waiting for their actions; and the
        # CPU its envs' step took per env step, to set beside the one process's.
        share = (step1 - step0, wait1 - wait0)
        env_step_us = (cpu1 - cpu0) / max(n1 - n0, 1) * 1e6
        return (s1 - s0) / (t1 - t0), share, env_step_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs-per-runner", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--runners", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--env-groups", type=int, default=1,
                        help="groups of each runner's envs stepped while the others' actions "
                             "are computed (env_runner env_groups)")
    parser.add_argument("--actor", action="store_true",
                        help="actors (env runners with the policy in their own process) "
                             "instead of env runners and an unroller")
    parser.add_argument("--coalesce", action="store_true",
                        help="coalesce: true on the experience topic (the steps of one turn "
                             "of a runner's loop go as one batch)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="measure each runner count this many times, the graph and the one "
                             "process alternated; each figure is the median of the repeats and "
                             "the ratio the median of each pair's ratio")
    parser.add_argument("--pin", default="",
                        help="NAME:CPU,...: pin every thread of these processes (env_runner.0 "
                             "is env_runner, also unroller, replay_store, supervisor) to a CPU")
    args = parser.parse_args()
    placement = {name: int(cpu) for name, cpu in
                 (item.split(":") for item in args.pin.split(",") if item)}
    results = {}
    print(f"{'runners':>8}{'envs':>6}{'graph steps/s':>15}{'1-process steps/s':>19}{'ratio':>8}"
          f"{'runner wait':>12}{'env.step CPU µs/step graph/1-process':>38}")
    for n in args.runners:
        total = n * args.envs_per_runner
        pairs = []
        for _ in range(args.repeats):
            ours, (stepping, waiting), env_step_us = graph_rate(
                n, args.envs_per_runner, args.seconds, args.warmup, args.env_groups, placement,
                args.actor, args.coalesce)
            limit = single_process_rate(total, args.seconds)
            pairs.append((ours, limit, waiting / max(stepping + waiting, 1e-9), env_step_us))
            if args.repeats > 1:
                print(f"{'':>8}{'':>6}{ours:>15.0f}{limit:>19.0f}{ours / limit:>8.2f}", flush=True)
        ours, limit, wait_share, env_step_us = (statistics.median(p[i] for p in pairs)
                                                for i in range(4))
        ratio = statistics.median(p[0] / p[1] for p in pairs)
        alone_us = 1e6 / limit  # the one process does nothing but step
        results[n] = {"graph": round(ours, 1), "single_process": round(limit, 1),
                      "ratio": round(ratio, 3), "runner_wait_share": round(wait_share, 3),
                      "runner_env_step_cpu_us": round(env_step_us, 2),
                      "single_process_step_us": round(alone_us, 2)}
        if args.repeats > 1:
            results[n]["ratios"] = [round(p[0] / p[1], 3) for p in pairs]
        print(f"{n:>8}{total:>6}{ours:>15.0f}{limit:>19.0f}{ratio:>8.2f}"
              f"{wait_share:>12.2f}{env_step_us:>26.2f} / {alone_us:.2f}", flush=True)
    print(json.dumps({"bench": "pipeline_throughput", "env": "CartPole-v1",
                      "envs_per_runner": args.envs_per_runner,
                      "env_groups": args.env_groups, "actor": args.actor,
                      "coalesce": args.coalesce, "cpus": os.cpu_count(),
                      "results": results}))


if __name__ == "__main__":
    main()
