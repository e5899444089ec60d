"""Atari env steps per second through the graph, with Nature-CNN inference in the unroller,
against the environment limit, the inference limit and a single-process act loop.

    python bench/pixel_throughput.py [--runners 2] [--envs-per-runner 16] [--seconds 20]

Four figures, all in env steps (= observations) per second, measured in the same run:

* graph: the real multi-process graph env_runner x ``--runners`` -> unroller (DQN's rollout
  step: the Nature CNN on the last 4 frames, frame-stacked in the unroller, batched across the
  runners' requests) -> experience -> replay_store. The learner only publishes the initial
  parameters (replay never reaches its sampling size), so no training competes for the CPU.
  Measured from the replay store's insert counter after a warm-up: every step went all the way
  into replay.
* env limit: the same ``runners x envs-per-runner`` Atari envs stepped with random actions in
  this one process (the environments alone).
* inference limit: the same algorithm's ``rollout_step`` on batches of ``runners x
  envs-per-runner`` frames in this process with one torch thread, as in the unroller.
* act loop: one process stepping the envs and running ``rollout_step`` in turn (step, infer,
  step, ...) as CleanRL's rollout loop does, with ``--act-threads`` torch threads (default 1,
  as the unroller: on a 2-core machine shared with other work, two spinning OpenMP threads
  made it ~10x slower, 39 env steps/s).

The point of the graph is that stepping and inference overlap (on different cores), so it should
beat the act loop (target 1.3x on 2 cores) and get close to the lower of the two limits (target
0.7). Prints a table; the last line is one JSON object with the figures and ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pipeline.cli import control  # noqa: E402

ALGORITHM = {"name": "dqn", "encoder": "nature_cnn", "fc_layer_params": [512],
             "data_transformers": [{"name": "frame_stacker", "stack_size": 4}],
             "epsilon_greedy_start": 0.05, "rollout_epsilon_greedy": 0.05}

GRAPH = """
name: pixel_throughput
agent: {{env_id: {env_id}, algorithm: {algorithm}}}
topics:
  experience: {{delivery: reliable, hwm: 256}}
  params: {{delivery: latest, hwm: 4}}
nodes:
  env_runner:
    kind: env_runner
    replicas: {runners}
    config: {{num_envs: {envs}, env_groups: {groups}}}
    calls: [policy]
  unroller:
    kind: unroller
    serves: [policy]
    subscribes: [params]
    publishes: [experience]
  replay_store:
    kind: replay_store
    config: {{num_environments: {total}, max_length: 2000, min_size_to_sample: 100000000}}
    subscribes: [experience]
    serves: [sample]
  learner:
    kind: learner
    config: {{num_env_steps: 100000000, request_timeout_s: 100000}}
    calls: [sample]
    publishes: [params]
run:
  duration_s: 900
"""


def env_limit(env_id: str, num_envs: int, seconds: float) -> float:
    from algorithms.envs import make_env

    env = make_env(env_id, num_envs, 0, training=True)
    env.reset(seed=0)
    n = env.single_action_space.n
    rng = np.random.default_rng(0)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(rng.integers(0, n, size=num_envs))
        steps += num_envs
    env.close()
    return steps / (time.perf_counter() - start)


def _algorithm(env_id: str):
    from nodes._agent import Agent
    from nodes._common import make_algorithm
    from typedconfig import build

    return make_algorithm(build(Agent, {"env_id": env_id, "algorithm": ALGORITHM}), "cpu")


def inference_limit(env_id: str, batch: int, seconds: float) -> float:
    import torch

    from algorithms.steps import VectorEnvStepper, make_vector_env

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        alg = _algorithm(env_id)
        env = make_vector_env(env_id, batch, 0, training=True)
        ts = VectorEnvStepper(env, 0).reset()
        env.close()
        steps, start = 0, time.perf_counter()
        with torch.no_grad():
            while time.perf_counter() - start < seconds:
                alg.rollout_step(ts, ())
                steps += batch
        return steps / (time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)


def act_loop(env_id: str, num_envs: int, seconds: float, threads: int) -> float:
    import torch

    from algorithms.steps import VectorEnvStepper, make_vector_env

    torch.set_num_threads(threads)
    alg = _algorithm(env_id)
    stepper = VectorEnvStepper(make_vector_env(env_id, num_envs, 0, training=True), 0)
    ts = stepper.reset()
    steps, start = 0, time.perf_counter()
    with torch.no_grad():
        while time.perf_counter() - start < seconds:
            action = alg.rollout_step(ts, ()).output
            ts = stepper.step(action.cpu().numpy())
            steps += num_envs
    stepper.env.close()
    return steps / (time.perf_counter() - start)


def graph_rate(env_id: str, runners: int, envs: int, groups: int, seconds: float,
               warmup: float) -> tuple[float, float]:
    """Env steps/s into replay, and runner 0's share of time waiting for actions."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "graph.yaml")
        with open(path, "w") as f:
            f.write(GRAPH.format(env_id=env_id, runners=runners, envs=envs, groups=groups,
                                 total=runners * envs, algorithm=json.dumps(ALGORITHM)))
        run_dir = os.path.join(tmp, "run")
        proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "run.py"), "run", path,
                                 "--run-dir", run_dir, "--quiet"], cwd=ROOT,
                                stderr=subprocess.PIPE, text=True)
        try:
            for line in proc.stderr:
                if line.startswith("control: "):
                    break
            control(run_dir, "wait_ready", timeout=180)

            def sample():
                nodes = control(run_dir, "status")["nodes"]
                runner = nodes["env_runner.0"].get("status", {})
                return (nodes["replay_store.0"].get("status", {}).get("inserted", 0),
                        runner.get("stepping_s", 0.0), runner.get("waiting_s", 0.0))

            while sample()[0] == 0:  # polling a counter for a benchmark, not synchronization
                time.sleep(0.5)
            time.sleep(warmup)
            t0, (s0, step0, wait0) = time.perf_counter(), sample()
            time.sleep(seconds)
            t1, (s1, step1, wait1) = time.perf_counter(), sample()
            control(run_dir, "stop")
            proc.wait(120)
        finally:
            if proc.poll() is None:
                proc.kill()
        waited = wait1 - wait0
        return (s1 - s0) / (t1 - t0), waited / max(waited + step1 - step0, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="ALE/Breakout-v5")
    parser.add_argument("--runners", type=int, default=2)
    # 16: a request's fixed costs (round trip, encode and decode, one forward call) are shared
    # by more envs, and a runner's stepping (~7 ms) covers the unroller serving the other one.
    # 8 per runner measured 1.27 / 0.70 (medians of 3), 16 per runner 1.32-1.40 / 0.77-0.79.
    parser.add_argument("--envs-per-runner", type=int, default=16)
    parser.add_argument("--env-groups", type=int, default=1,
                        help="env groups per runner (double buffering inside a runner)")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--act-threads", type=int, default=1,
                        help="torch threads of the single-process act loop")
    parser.add_argument("--repeat", type=int, default=1,
                        help="measure all four this many times, interleaved, and report each "
                             "figure's and ratio's median (a shared machine's load moves "
                             "single runs by 10-20%%)")
    args = parser.parse_args()
    total = args.runners * args.envs_per_runner
    rounds = []
    for r in range(args.repeat):
        graph, wait_share = graph_rate(args.env, args.runners, args.envs_per_runner,
                                       args.env_groups, args.seconds, args.warmup)
        envs = env_limit(args.env, total, args.seconds)
        infer = inference_limit(args.env, total, args.seconds)
        loop = act_loop(args.env, total, args.seconds, args.act_threads)
        rounds.append((graph, envs, infer, loop, wait_share, graph / loop,
                       graph / min(envs, infer)))
        if args.repeat > 1:
            print(f"round {r + 1}: graph {graph:.0f}, env limit {envs:.0f}, inference limit "
                  f"{infer:.0f}, act loop {loop:.0f}: {graph / loop:.2f} of the act loop, "
                  f"{graph / min(envs, infer):.2f} of the lower limit", flush=True)
    graph, envs, infer, loop, wait_share, vs_loop, vs_limit = (
        float(np.median(column)) for column in zip(*rounds, strict=True))
    rows = [("graph", graph), ("env limit (1 process, random actions)", envs),
            ("inference limit (1 thread)", infer), ("act loop (1 process)", loop)]
    for name, rate in rows:
        print(f"{name:<40}{rate:>10.0f} env steps/s")
    print(f"graph / act loop {vs_loop:.2f} (target 1.3); graph / min(limits) "
          f"{vs_limit:.2f} (target 0.7); runner wait share {wait_share:.2f}"
          + (f" (medians of {args.repeat} rounds)" if args.repeat > 1 else ""))
    print(json.dumps({"bench": "pixel_throughput", "env": args.env, "runners": args.runners,
                      "envs_per_runner": args.envs_per_runner, "env_groups": args.env_groups,
                      "cpus": os.cpu_count(), "graph": round(graph, 1),
                      "env_limit": round(envs, 1), "inference_limit": round(infer, 1),
                      "act_loop": round(loop, 1), "act_threads": args.act_threads,
                      "graph_vs_act_loop": round(vs_loop, 3),
                      "graph_vs_limit": round(vs_limit, 3),
                      "runner_wait_share": round(wait_share, 3), "rounds": args.repeat}))


if __name__ == "__main__":
    main()
