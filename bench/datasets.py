"""Offline datasets made here, and the offline and hybrid learning measured on them.

    python bench/datasets.py pendulum [--seed N]         # writes datasets/pendulum-sac-v0
    python bench/datasets.py offline iql [--seeds 0,1,2] # graphs/iql_pendulum_offline.yaml
    python bench/datasets.py offline bc [--seeds 0,1,2]  # graphs/bc_pendulum_offline.yaml
    python bench/datasets.py hybrid [--seeds 0,1,2]      # graphs/sac_pendulum_hybrid.yaml,
                                                         # with and without the dataset
    python bench/datasets.py halfcheetah [--sac-run RUN] # datasets/halfcheetah-medium-v0 and
                                                         # halfcheetah-medium-replay-v0
    python bench/datasets.py offline iql bc --dataset halfcheetah-medium [--seeds 0,1,2]
    python bench/datasets.py score --dataset halfcheetah-medium RUN_DIR...  # runs made before

``pendulum`` is the reference procedure of the Pendulum dataset: graphs/sac_pendulum.yaml run
to 10,000 env steps (no early stop at -200, a replay ring of 10,000 steps), then
``run.py dataset`` on its final checkpoint into ``datasets/pendulum-sac-v0``, where the offline
and hybrid graphs read it by default. It prints the dataset's episode returns.

``halfcheetah`` is the reference procedure of the HalfCheetah-v5 datasets (D4RL's "medium" and
"medium-replay", made here): graphs/sac_halfcheetah.yaml run to ``--env-steps`` (200,000) with
a checkpoint every 30 s, all kept (or ``--sac-run``, such a run made before). Its best
evaluation is the normalized score's 100, the mean return of 20 episodes of uniformly random
actions its 0. The checkpoints around the stretch where its evaluations went from a quarter to
half of the best are evaluated (10 greedy episodes each), and the one whose return lies in a
third to a half of the best, nearest the middle of that range, is the medium policy:
``halfcheetah-medium`` is its exploring actions (SAC's sampled ones, as D4RL's medium) played
for ``--medium-steps`` (200,000) transitions and written from buffers with
``storage.datasets.write_dataset``; ``halfcheetah-medium-replay`` is ``run.py dataset`` of that
checkpoint (the run's replay up to there). Each dataset directory gets a ``normalization.json``
(0, 100, the medium policy, the dataset's own mean return and score, and IQL's reward scale:
1000 over the range of its episode returns), which the HalfCheetah figures read. The graphs
read both where this writes them.

``offline`` and ``hybrid`` run the graphs for real, one run per seed (``--seed`` of run.py:
every node's seed plus N), and print each run's result and the median: for Pendulum's offline
graphs the best evaluation and the updates at which it first reached -200; for HalfCheetah's
the final return (the mean of the last 3 evaluations, 30 episodes) and the best, raw and
normalized, the medians of the final normalized score and each algorithm's median minus BC's;
for hybrid the env steps at which the evaluation first reached -200, with the dataset and
without it (``--set nodes.replay_store.config.datasets=null`` and
``offline_pretrain_batches=0``: the same graph otherwise). ``score`` prints the same for runs
made before (one seed at a time, say).

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
FINAL_EVALS = 3  # a HalfCheetah run's final return: the mean of its last evaluations


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
    """Each algorithm's offline graph on ``--dataset``, one run per seed (module doc)."""
    out: dict = {"dataset": args.dataset, "runs": []}
    for algorithm in args.algorithms:
        graph, extra = _offline_graph(algorithm, args.dataset)
        out.setdefault("graphs", {})[algorithm] = graph
        for seed in args.seeds:
            run_dir = os.path.join(ROOT, "runs", "datasets", f"{algorithm}_{args.dataset}"
                                   f"-s{seed}-{time.strftime('%H%M%S')}")
            started = time.monotonic()
            code = _run(graph, run_dir, seed, *extra, *args.set)
            row = {"algorithm": algorithm, "seed": seed, "exit": code,
                   **_offline_result(run_dir, args.dataset, code),
                   "wall_s": round(time.monotonic() - started, 1), "run_dir": run_dir}
            out["runs"].append(row)
            print(json.dumps(row), flush=True)
    return {**out, **_medians(out["runs"], args.dataset)}


def score(args) -> dict:
    """The same figures as ``offline`` for runs made before (their graph.yaml names the
    algorithm), e.g. seeds run one at a time."""
    import yaml

    runs = []
    for run_dir in args.run_dirs:
        try:
            with open(os.path.join(run_dir, "graph.yaml")) as f:
                algorithm = yaml.safe_load(f)["agent"]["algorithm"]["name"]
        except (OSError, KeyError, TypeError):
            raise SystemExit(f"{run_dir}: no graph.yaml naming an agent.algorithm") from None
        runs.append({"algorithm": algorithm, **_offline_result(run_dir, args.dataset, 0),
                     "run_dir": run_dir})
        print(json.dumps(runs[-1]), flush=True)
    return {"dataset": args.dataset, "runs": runs, **_medians(runs, args.dataset)}


def _offline_graph(algorithm: str, dataset: str) -> tuple[str, tuple]:
    if dataset == "pendulum":
        return f"graphs/{algorithm}_pendulum_offline.yaml", ()
    graph = f"graphs/{algorithm}_halfcheetah_offline.yaml"
    if dataset == "halfcheetah-medium":  # what the graph reads by default
        return graph, ()
    return graph, (f"nodes.replay_store.config.datasets=[{HALFCHEETAH[dataset]}]",)


def _offline_result(run_dir: str, dataset: str, code: int) -> dict:
    """Pendulum: the best evaluation and the updates at which it first reached -200.
    HalfCheetah: the final return (the mean of the last ``FINAL_EVALS`` evaluations) and the
    best one, raw and normalized."""
    evals = _evals(run_dir) if code == 0 and os.path.exists(
        os.path.join(run_dir, "metrics.jsonl")) else []
    if dataset == "pendulum":
        return {"best": max((r for _, r in evals), default=None),
                "final": evals[-1][1] if evals else None,
                "updates_to_threshold": next((s for s, r in evals if r >= THRESHOLD), None)}
    if not evals:
        return {"final": None, "best": None, "final_score": None, "best_score": None}
    norm = read_normalization(os.path.join(ROOT, HALFCHEETAH[dataset]))
    final = statistics.fmean(r for _, r in evals[-FINAL_EVALS:])
    best = max(r for _, r in evals)
    return {"final": round(final, 1), "best": round(best, 1),
            "final_score": round(normalized_score(final, norm), 1),
            "best_score": round(normalized_score(best, norm), 1),
            "updates": evals[-1][0], "evaluations": len(evals)}


def _medians(runs: list[dict], dataset: str) -> dict:
    """Per algorithm the median over its runs (Pendulum: of the best return; HalfCheetah: of
    the final normalized score), and each algorithm's median minus BC's."""
    key = "best" if dataset == "pendulum" else "final_score"
    medians = {}
    for algorithm in dict.fromkeys(r["algorithm"] for r in runs):
        values = [r[key] for r in runs if r["algorithm"] == algorithm and r[key] is not None]
        medians[algorithm] = round(statistics.median(values), 1) if values else None
    out: dict = {f"median_{key}": medians}
    if dataset != "pendulum":
        norm = read_normalization(os.path.join(ROOT, HALFCHEETAH[dataset]))
        out["dataset_score"] = norm.get("dataset_score")
    if medians.get("bc") is not None:
        out["minus_bc"] = {a: round(m - medians["bc"], 1) for a, m in medians.items()
                           if a != "bc" and m is not None}
    return out


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


# ----- HalfCheetah: the medium and medium-replay datasets -------------------------------------
HALFCHEETAH = {"halfcheetah-medium": os.path.join("datasets", "halfcheetah-medium-v0"),
               "halfcheetah-medium-replay": os.path.join("datasets",
                                                         "halfcheetah-medium-replay-v0")}
NORMALIZATION = "normalization.json"  # beside a dataset's data/: its normalized score's 0 and 100
MEDIUM = (1 / 3, 1 / 2)  # the medium policy's deterministic return, as a share of the best


def normalized_score(episode_return: float, norm: dict) -> float:
    """``episode_return`` on the scale where the random policy scores 0 and the reference SAC
    run's best evaluation 100 (D4RL's normalized score)."""
    span = norm["expert_return"] - norm["random_return"]
    if span <= 0:
        raise ValueError(f"normalization: expert_return {norm['expert_return']} is not above "
                         f"random_return {norm['random_return']}")
    return 100.0 * (episode_return - norm["random_return"]) / span


def iql_reward_scale(episode_returns) -> float:
    """IQL's reward scaling for locomotion (Kostrikov et al. 2021): 1000 over the range of the
    dataset's episode returns, so its advantages, and the weights ``exp(beta * A)``, have the
    scale the paper's ``beta`` was chosen for, whatever the env's reward units."""
    returns = list(episode_returns)
    span = max(returns) - min(returns) if returns else 0.0
    if span <= 0:
        raise ValueError("iql_reward_scale: the episodes' returns have no range")
    return 1000.0 / span


def read_normalization(dataset: str) -> dict:
    """The 0 and 100 a dataset made by ``halfcheetah`` records (one line if there are none)."""
    path = os.path.join(dataset, NORMALIZATION)
    try:
        with open(path) as f:
            norm = json.load(f)
    except FileNotFoundError:
        raise SystemExit(f"{path}: no such file (make the dataset with python "
                         f"bench/datasets.py halfcheetah)") from None
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{path}: unreadable normalization ({exc})") from None
    missing = [k for k in ("random_return", "expert_return") if k not in norm]
    if missing:
        raise SystemExit(f"{path}: no {missing[0]}")
    return norm


def _envs(env_id: str, count: int, seed: int) -> tuple[list, list]:
    import gymnasium as gym

    envs = [gym.make(env_id) for _ in range(count)]
    observations = [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]
    for i, env in enumerate(envs):
        env.action_space.seed(seed + i)
    return envs, observations


def random_return(env_id: str, episodes: int, seed: int) -> float:
    """Mean return of uniformly random actions over ``episodes`` episodes: the score's 0."""
    envs, _ = _envs(env_id, episodes, seed)
    returns = []
    for env in envs:
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
        env.close()
    return statistics.fmean(returns)


def rollout_episodes(policy, num_steps: int, num_envs: int, seed: int, deterministic: bool):
    """Whole episodes of ``policy`` (a :class:`conduit.Policy`) in ``num_envs`` envs stepped in
    lockstep (one batched action per step), as :class:`storage.datasets.Episode`, until they
    hold ``num_steps`` transitions; episodes still running then are dropped (none when the
    episodes are of a fixed length dividing ``num_steps``, as HalfCheetah's 1,000).
    Observations are float32, as the replay stores them (the experience schema)."""
    import numpy as np

    from storage.datasets import Episode

    envs, observations = _envs(policy.agent.env_id, num_envs, seed)
    buffers = [{"obs": [np.asarray(o, np.float32)], "act": [], "rew": []} for o in observations]
    state, starts, collected = None, np.ones(num_envs, bool), 0
    try:
        while collected < num_steps:
            batch = np.stack([b["obs"][-1] for b in buffers])
            actions, state = policy.act(batch, state, deterministic=deterministic,
                                        episode_start=starts)
            starts = np.zeros(num_envs, bool)
            for i, (env, buf) in enumerate(zip(envs, buffers, strict=True)):
                obs, reward, terminated, truncated, _ = env.step(actions[i])
                buf["obs"].append(np.asarray(obs, np.float32))
                buf["act"].append(np.asarray(actions[i], np.float32))
                buf["rew"].append(float(reward))
                if not (terminated or truncated):
                    continue
                n = len(buf["rew"])
                ends = np.zeros(n, bool)
                ends[-1] = True
                if collected < num_steps:
                    yield Episode(observations=np.stack(buf["obs"]),
                                  actions=np.stack(buf["act"]),
                                  rewards=np.asarray(buf["rew"], np.float32),
                                  terminations=ends & bool(terminated),
                                  truncations=ends & (not terminated))
                    collected += n
                obs, _ = env.reset()
                buffers[i] = {"obs": [np.asarray(obs, np.float32)], "act": [], "rew": []}
                starts[i] = True
    finally:
        for env in envs:
            env.close()


def write_rollouts(path: str, policy, num_steps: int, num_envs: int, seed: int, *,
                   dataset_id: str, metadata: dict) -> dict:
    """Roll ``policy`` out (its exploring actions, as D4RL's medium datasets) into a Minari
    dataset at ``path`` with :func:`storage.datasets.write_dataset`; returns its metadata
    plus ``returns`` (each episode's)."""
    import dataclasses

    import gymnasium as gym
    import numpy as np
    import torch

    from storage.datasets import write_dataset

    torch.manual_seed(seed)
    returns: list[float] = []

    def counted():
        for episode in rollout_episodes(policy, num_steps, num_envs, seed, deterministic=False):
            returns.append(float(episode.rewards.sum()))
            yield episode

    space = policy.observation_space
    obs_space = gym.spaces.Box(space.low.astype(np.float32), space.high.astype(np.float32),
                               space.shape, dtype=np.float32)
    env_id = policy.agent.env_id
    spec = gym.spec(env_id)
    spec = dataclasses.replace(spec, kwargs={**spec.kwargs, **dict(policy.agent.env_kwargs)})
    written = write_dataset(path, counted(), obs_space, policy.action_space,
                            dataset_id=dataset_id, env_spec=spec, metadata=metadata)
    return {**written, "returns": returns}


def _checkpoints(run_dir: str) -> list[tuple[int, str]]:
    """``(env steps, path)`` of the run's complete checkpoints, oldest first."""
    from pipeline.wiring import MARKER

    root = os.path.join(run_dir, "checkpoints")
    found = []
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        path = os.path.join(root, name)
        if name.startswith("ckpt-") and os.path.exists(os.path.join(path, MARKER)):
            found.append((int(name.split("-")[1]), path))
    return found


def pick_medium(evals: list[tuple[int, float]], checkpoints: list[tuple[int, str]],
                margin: int = 20_000) -> list[tuple[int, str]]:
    """The checkpoints worth evaluating for the medium policy: those within ``margin`` env
    steps of the stretch where the run's evaluations went from a quarter to past half of its
    best (the medium policy is the one of them whose own return lies in ``MEDIUM``)."""
    best = max(r for _, r in evals)
    low = next(s for s, r in evals if r >= best / 4)
    high = next((s for s, r in evals if r >= best * MEDIUM[1]), evals[-1][0])
    return [(s, p) for s, p in checkpoints if low - margin <= s <= high + margin]


def halfcheetah(args) -> dict:
    """The SAC run (or ``--sac-run``), the medium policy and both datasets (module doc)."""
    sys.path.insert(0, ROOT)
    import torch

    from conduit import load_policy

    # One thread: batches of 10 rows gain nothing from more, and on a loaded CPU (the SAC
    # run's nodes, other work) two threads contending made each step 30 times slower.
    torch.set_num_threads(1)
    to = {name: os.path.join(ROOT, args.to, os.path.basename(path))
          for name, path in HALFCHEETAH.items()}
    for path in to.values():
        if os.path.exists(path):
            raise SystemExit(f"{path} exists: remove it to make it again")
    started = time.monotonic()
    run_dir = args.sac_run
    if run_dir is None:
        run_dir = os.path.join(ROOT, "runs", "datasets",
                               f"sac_halfcheetah-{time.strftime('%Y%m%d-%H%M%S')}")
        code = _run("graphs/sac_halfcheetah.yaml", run_dir, args.seed,
                    f"nodes.learner.config.num_env_steps={args.env_steps}",
                    "nodes.checkpointer.config.interval_s=30",
                    "nodes.checkpointer.config.num_checkpoints=1000")
        if code != 0:
            raise SystemExit(f"the SAC run failed ({code}): {run_dir}")
    evals = _evals(run_dir)
    if not evals:
        raise SystemExit(f"{run_dir}: no evaluation in metrics.jsonl")
    best_steps, best = max(evals, key=lambda e: e[1])
    env_id = "HalfCheetah-v5"
    norm = {"env_id": env_id, "random_return": round(random_return(env_id, 20, 1_000_000), 2),
            "random_episodes": 20, "expert_return": round(best, 2),
            "expert": f"best evaluation of {run_dir} ({best_steps} env steps)"}
    print(json.dumps({"normalization": norm}), flush=True)
    candidates = []
    for steps, ckpt in pick_medium(evals, _checkpoints(run_dir)):
        policy = load_policy(run_dir, which=ckpt)
        returns = [float(ep.rewards.sum()) for ep in
                   rollout_episodes(policy, 10_000, 10, 2_000_000, deterministic=True)]
        candidates.append({"env_steps": steps, "checkpoint": ckpt,
                           "eval_return": round(statistics.fmean(returns), 1)})
        print(json.dumps(candidates[-1]), flush=True)
    inside = [c for c in candidates if MEDIUM[0] * best <= c["eval_return"] <= MEDIUM[1] * best]
    middle = sum(MEDIUM) / 2 * best
    pool = inside or candidates
    if not pool:
        raise SystemExit(f"{run_dir}: no checkpoint near a third to a half of the best "
                         f"return {best:.0f} (keep more checkpoints: interval_s, "
                         f"num_checkpoints)")
    medium = min(pool, key=lambda c: abs(c["eval_return"] - middle))
    policy = load_policy(run_dir, which=medium["checkpoint"])
    source = {"run_dir": os.path.abspath(run_dir), "checkpoint": medium["checkpoint"],
              "env_steps": medium["env_steps"], "env_id": env_id, "env_kwargs": {},
              "eval_return": medium["eval_return"], "graph": "sac_halfcheetah"}
    write_rollouts(
        to["halfcheetah-medium"], policy, args.medium_steps, 10, args.seed,
        dataset_id="halfcheetah-medium-v0",
        metadata={"algorithm_name": "sac", "normalization": norm,
                  "conduit": {**source, "rollout": "stochastic (rollout_step)",
                              "seed": args.seed}})
    made = subprocess.run([sys.executable, os.path.join(ROOT, "run.py"), "dataset", run_dir,
                           "--checkpoint", medium["checkpoint"],
                           "--to", to["halfcheetah-medium-replay"]], cwd=ROOT)
    if made.returncode != 0:
        raise SystemExit(made.returncode)
    from storage.datasets import Dataset

    out = {"sac_run": run_dir, "normalization": norm, "medium_policy": medium,
           "candidates": candidates}
    for name, path in to.items():
        data = Dataset(path)
        episodes = [(float(ep.rewards.sum()), len(ep)) for ep in data.episodes()]
        # The dataset's own score: of its whole episodes (a replay's last one may be cut).
        whole = [r for r, n in episodes if n == 1000] or [r for r, _ in episodes]
        record = {**norm, "dataset": name, "medium_policy": medium,
                  "dataset_return_mean": round(statistics.fmean(whole), 1),
                  "dataset_score": round(normalized_score(statistics.fmean(whole), norm), 1),
                  "return_range": [round(min(whole), 1), round(max(whole), 1)],
                  "iql_reward_scale": round(iql_reward_scale(whole), 4)}
        with open(os.path.join(path, NORMALIZATION), "w") as f:
            json.dump(record, f, indent=1)
        out[name] = {"path": path, "episodes": data.total_episodes,
                     "transitions": data.total_steps, "dataset_return_mean":
                     record["dataset_return_mean"], "dataset_score": record["dataset_score"],
                     "iql_reward_scale": record["iql_reward_scale"]}
    out["wall_s"] = round(time.monotonic() - started, 1)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pendulum", help="write datasets/pendulum-sac-v0 from a SAC run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--to", help=f"the dataset directory (default {PENDULUM})")
    p = sub.add_parser("halfcheetah", help="write datasets/halfcheetah-medium-v0 and "
                       "halfcheetah-medium-replay-v0 from a SAC run (and their normalization)")
    p.add_argument("--sac-run", metavar="RUN_DIR",
                   help="a finished run of graphs/sac_halfcheetah.yaml to use instead of "
                        "making one (it must have kept its checkpoints near the medium point)")
    p.add_argument("--env-steps", type=int, default=200_000,
                   help="the SAC run's budget (default 200000)")
    p.add_argument("--medium-steps", type=int, default=200_000,
                   help="transitions of the medium policy's rollouts (default 200000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--to", default="datasets", help="the directory both datasets go in "
                   "(default datasets, where the HalfCheetah offline graphs read them)")
    datasets = ["pendulum", *HALFCHEETAH]
    p = sub.add_parser("offline", help="offline graphs, one run per algorithm and seed")
    p.add_argument("algorithms", nargs="+", choices=["iql", "bc", "cql"], metavar="ALGORITHM",
                   help="iql, bc, cql (HalfCheetah only): "
                        "graphs/<algorithm>_<pendulum|halfcheetah>_offline.yaml")
    p.add_argument("--dataset", choices=datasets, default="pendulum",
                   help="pendulum (default), halfcheetah-medium or halfcheetah-medium-replay")
    p = sub.add_parser("score", help="offline's figures for runs made before")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--dataset", choices=datasets, default="halfcheetah-medium")
    p = sub.add_parser("hybrid", help="the hybrid SAC graph with and without the dataset")
    p.add_argument("--arms", type=lambda s: s.split(","), default=["with", "without"],
                   help="with,without (default both)")
    for name in ("offline", "hybrid"):
        sub.choices[name].add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")],
                                       default=[0, 1, 2])
        sub.choices[name].add_argument("--set", action="append", default=[],
                                       help="a graph override for every run")
    args = ap.parse_args(argv)
    run = {"pendulum": pendulum, "halfcheetah": halfcheetah, "offline": offline,
           "score": score, "hybrid": hybrid}[args.command]
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
