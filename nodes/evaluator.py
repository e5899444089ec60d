"""evaluator: greedy episodes in its own environments with the newest parameters.

Every ``eval_interval`` environment steps (as stamped on the parameters: the first parameters
at or past each multiple of it, or also at 0 with ``eval_at_start``) it runs
``num_eval_episodes`` episodes in parallel with ``predict_step`` and publishes
``eval/return``, ``eval/length``, ``eval/success_rate`` (where the env reports
``info["is_success"]``: the share of episodes that ended in success) and ``eval/seconds``
(from the parameters' arrival to the result, so a benchmark can take evaluation off a
training clock). With ``stop_at_return`` (or ``stop_at_success_rate``) set it finishes once an
evaluation reaches it, which ends a graph that lists it in ``run.stop_when``.

It keeps the policy it evaluated (:func:`keep_policy`): each evaluation that beats the best so
far writes the parameters it evaluated to ``RUN_DIR/best/``, and the evaluation that reaches
``stop_at_return`` writes them to ``RUN_DIR/reached/`` as well (``conduit.load_policy``
reads either back). A restarted evaluator takes the best so far from ``best/``.
Evaluation runs in a worker thread so the node keeps answering heartbeats meanwhile. The node
says ready before it builds its algorithm (and imports torch): that happens at the first
evaluation, so the evaluator takes no CPU from the nodes that start training.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import time
from dataclasses import dataclass, field

import numpy as np

from nodes._agent import Agent, EnvSpec, agent_field
from nodes.messages import Metrics, Params
from pipeline.ports import Port, Ports

log = logging.getLogger(__name__)

PORTS = Ports(subscribes={"params": Port(Params)}, publishes={"metrics": Port(Metrics)})


@dataclass(frozen=True)
class Config:
    agent: Agent = agent_field()
    eval_env: EnvSpec | None = field(default=None, metadata={
        "doc": "evaluate on this env (env_id, env_kwargs) instead of the agent's: on purpose, "
               "e.g. another variant of the task; its spaces must match the agent's"})
    num_eval_episodes: int = field(default=10, metadata={"doc": "episodes per evaluation"})
    eval_interval: int = field(default=5000, metadata={"minimum": 1,
                                                       "doc": "env steps between evaluations"})
    stop_at_return: float | None = field(default=None, metadata={
        "doc": "finish once the mean return reaches this"})
    stop_at_success_rate: float | None = field(default=None, metadata={
        "doc": "finish once the success rate (info[\"is_success\"] at episodes' ends) reaches "
               "this; with stop_at_return too, both must be met"})
    seed: int = field(default=10_000, metadata={"doc": "evaluation env seed"})
    eval_at_start: bool = field(default=False, metadata={
        "doc": "also evaluate the untrained policy (it competes for CPU with start-up)"})
    epsilon: float = field(default=0.0, metadata={
        "minimum": 0.0, "doc": "probability of a random action per step (Atari: 0.05, else a greedy policy "
               "can stall until the episode's frame limit)"})


def _build_algorithm(config: Config, device: str):
    import torch

    from nodes._common import make_algorithm

    torch.set_num_threads(1)
    return make_algorithm(config.agent, device)


def _evaluate(alg, config: Config):
    from algorithms.evaluation import evaluate  # imports torch: not before the first evaluation

    env = config.eval_env or config.agent
    return evaluate(alg, env.env_id, config.num_eval_episodes, config.seed, env.env_kwargs,
                    config.epsilon)


# Where an evaluator keeps a policy: RUN_DIR/<BEST or REACHED>/POLICY_FILE (the parameters and
# their record, for torch.load(weights_only=True)) and INFO_FILE (the record alone, for people
# and for tools that do not import torch).
BEST, REACHED = "best", "reached"
POLICY_FILE, INFO_FILE = "policy.pt", "policy.json"


def keep_policy(directory: str, policy: dict, info: dict) -> None:
    """Write ``policy`` (``policy_state_dict()``: the networks and data transformers that
    acted) with ``info`` (its evaluation) into ``directory``, each file atomically (temporary
    file, fsync, rename), the parameters first: ``POLICY_FILE`` holds both, so whoever reads it
    gets parameters and record of one evaluation whenever this process dies; ``INFO_FILE``
    repeats the record."""
    from nodes._common import save_atomically  # imports torch, as the caller already has

    save_atomically(os.path.join(directory, POLICY_FILE), {"policy": policy, "info": info})
    path = os.path.join(directory, INFO_FILE)
    with open(path + ".tmp", "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def kept_info(directory: str) -> dict | None:
    """The record of the policy kept in ``directory``, or None if there is none (yet)."""
    try:
        with open(os.path.join(directory, INFO_FILE)) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def next_evaluation(env_steps: int, interval: int) -> int:
    """The env steps of the evaluation after one of parameters stamped ``env_steps``: the
    next multiple of ``interval``, as a trainer that evaluates every ``interval`` env steps
    would. Parameters arrive every few dozen env steps, so counting ``interval`` from the
    stamp evaluated later by that much each time (1000, 2024, 3048, ...)."""
    return (env_steps // interval + 1) * interval


async def run(config: Config, node, ready) -> dict:
    bus = node.bus
    # Built at the first evaluation unless that is now. A bad algorithm config then shows at
    # that evaluation; the unroller and learner, which build the same algorithm, fail at start.
    alg = _build_algorithm(config, node.info.device) if config.eval_at_start else None
    probes = None
    params = bus.subscriber("params")
    metrics = bus.publisher("metrics")
    ready()
    next_eval = 0 if config.eval_at_start else config.eval_interval
    run_dir = node.info.run_dir
    best_dir = os.path.join(run_dir, BEST) if run_dir else None
    kept = kept_info(best_dir) if best_dir else None  # a restarted evaluator's best so far
    best = float((kept or {}).get("mean_return", -np.inf))
    if np.isfinite(best):
        node.status.update(_best(best, best_dir))
    evaluations = 0
    while not node.stopping.is_set():
        envelope = await node.wait_or_stop(params.recv())
        if envelope is None:
            break
        msg = envelope.message
        if msg.env_steps < next_eval:
            continue
        started = time.monotonic()
        if alg is None:
            alg = await asyncio.to_thread(_build_algorithm, config, node.info.device)
        alg.load_policy_state_dict(msg.params)
        if probes is None:
            from nodes._common import ProbeLog  # torch is imported by now

            probes = ProbeLog(node.status, config.agent.probe_observation)
        probes.record(alg, msg.version)
        result = await asyncio.to_thread(_evaluate, alg, config)
        mean_return, mean_length = result.mean_return, result.mean_length
        seconds = time.monotonic() - started
        evaluations += 1
        next_eval = next_evaluation(msg.env_steps, config.eval_interval)
        node.status.update(env_steps=msg.env_steps, eval_return=round(mean_return, 1))
        reached = _reached(config, mean_return, result.success_rate)
        keep = ([BEST] if mean_return > best else []) + ([REACHED] if reached else [])
        # Kept before the result is published: whoever sees an eval/return finds its
        # policy on disk (a run that stops at stop_at_return included).
        kept_all = True
        if run_dir and keep:
            info = {**_record(config, msg, mean_return, mean_length, reached),
                    "success_rate": result.success_rate}
            policy = alg.policy_state_dict()  # a copy, before the next parameters load
            for name in keep:
                kept_all &= await _keep(node, os.path.join(run_dir, name), policy, info)
        if mean_return > best and kept_all:  # else the next evaluation that beats it retries
            best = mean_return
            node.status.update(_best(best, best_dir))
        log.info("env_steps %d version %d: eval return %.1f", msg.env_steps, msg.version,
                 mean_return)
        values = {"eval/return": mean_return, "eval/length": mean_length,
                  "eval/version": msg.version, "eval/seconds": seconds}
        if result.success_rate is not None:  # goal-conditioned envs: info["is_success"]
            values["eval/success_rate"] = result.success_rate
            node.status["eval_success_rate"] = round(result.success_rate, 3)
        await metrics.send(Metrics(node.info.instance, msg.env_steps, values))
        if reached:
            return {"reached": mean_return, "env_steps": msg.env_steps, "evaluations":
                    evaluations, **_best(best, best_dir)}
    return {"evaluations": evaluations, **_best(best, best_dir)}


def _reached(config: Config, mean_return: float, success_rate: float | None) -> bool:
    """Every stop criterion the config sets is met (none set: never)."""
    wanted = [(config.stop_at_return, mean_return),
              (config.stop_at_success_rate, success_rate)]
    wanted = [(bar, value) for bar, value in wanted if bar is not None]
    return bool(wanted) and all(value is not None and value >= bar for bar, value in wanted)


async def _keep(node, path: str, policy: dict, info: dict) -> bool:
    """Write a kept policy; a disk that refuses it (full, failing, read-only: any exception
    of the write) is a status warning, said once per episode of trouble, not the evaluator's
    end: evaluating goes on and a later evaluation writes again."""
    try:
        await asyncio.to_thread(keep_policy, path, policy, info)
    except Exception as exc:  # noqa: BLE001 - any failure of the write is the disk's
        warning = f"policy not kept in {path}: {type(exc).__name__}: {exc}"
        if node.status.get("warning") is None:
            log.warning("%s (evaluating goes on)", warning)
        node.status["warning"] = warning
        return False
    if str(node.status.get("warning", "")).startswith("policy not kept"):
        node.status.pop("warning")
        log.info("policies are kept again (%s)", path)
    return True


def _best(best: float, best_dir: str | None) -> dict:
    """The status keys of the best evaluation, also in the result: a node's last status may
    not reach the supervisor before the node finishes, its result does."""
    if not np.isfinite(best):
        return {"best_return": None, "best_dir": None}
    return {"best_return": round(best, 1), "best_dir": best_dir}


def _record(config: Config, msg: Params, mean_return: float, mean_length: float,
            reached: bool) -> dict:
    """What a kept policy's ``INFO_FILE`` says about it: its evaluation and where its
    parameters came from."""
    env = config.eval_env or config.agent
    now = time.time()
    return {"mean_return": mean_return, "mean_length": mean_length,
            "num_episodes": config.num_eval_episodes, "env_steps": msg.env_steps,
            "version": msg.version, "epoch": msg.epoch, "env_id": env.env_id,
            "algorithm": config.agent.algorithm.name, "stop_at_return": config.stop_at_return,
            "reached": reached, "unix_time": now,
            "time": datetime.datetime.fromtimestamp(now, datetime.UTC).isoformat(
                timespec="seconds")}
