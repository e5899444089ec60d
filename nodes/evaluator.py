"""evaluator: greedy episodes in its own environments with the newest parameters.

Every ``eval_interval`` environment steps (as stamped on the parameters: the first parameters
at or past each multiple of it, or also at 0 with ``eval_at_start``) it runs
``num_eval_episodes`` episodes in parallel with ``predict_step`` and publishes
``eval/return``, ``eval/length`` and ``eval/seconds`` (from the parameters' arrival to the
result, so a benchmark can take evaluation off a training clock). With ``stop_at_return`` set
it finishes once an evaluation reaches it, which ends a graph that lists it in
``run.stop_when``.
Evaluation runs in a worker thread so the node keeps answering heartbeats meanwhile. The node
says ready before it builds its algorithm (and imports torch): that happens at the first
evaluation, so the evaluator takes no CPU from the nodes that start training.
"""

from __future__ import annotations

import asyncio
import logging
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
    best = -np.inf
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
        mean_return, mean_length = await asyncio.to_thread(
            _evaluate, alg, config)
        evaluations += 1
        best = max(best, mean_return)
        next_eval = next_evaluation(msg.env_steps, config.eval_interval)
        node.status.update(env_steps=msg.env_steps, eval_return=round(mean_return, 1))
        log.info("env_steps %d version %d: eval return %.1f", msg.env_steps, msg.version,
                 mean_return)
        await metrics.send(Metrics(node.info.instance, msg.env_steps, {
            "eval/return": mean_return, "eval/length": mean_length,
            "eval/version": msg.version, "eval/seconds": time.monotonic() - started}))
        if config.stop_at_return is not None and mean_return >= config.stop_at_return:
            return {"reached": mean_return, "env_steps": msg.env_steps, "evaluations":
                    evaluations}
    return {"best": best, "evaluations": evaluations}
