"""The unroller never puts two steps of one environment in one experience batch (issue 11: a
replay store exited with ``env_ids of one batch must be distinct`` after an env-runner kill).

A runner killed -9 leaves its last request queued at the unroller and its restart asks for the
same environments again; a runner whose request timed out asks again for the same step. The
test node below makes exactly that queue: each round it sends a step of its environments and,
without waiting, the next one for the same environments, as the dead runner and its restart
do. Every request must be answered and every step stored, none in a batch with another step
of its environment."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from algorithms.envs import make_env
from algorithms.steps import VectorEnvStepper
from nodes.messages import TimeStepBatch
from nodes.unroller import take_batch
from pipeline import graph as graphlib
from pipeline.inloop import run_graph

NUM_ENVS, ROUNDS = 4, 40


async def twin_runner(config, node, ready):
    """A test kind (``tests.test_reliability_unroller_batching:twin_runner``): each round, two
    requests for the same environments on their way together, then both replies."""
    policy = node.bus.client("policy")
    stepper = VectorEnvStepper(make_env("CartPole-v1", NUM_ENVS, 0, {}, training=True), 0)
    ts = stepper.reset()
    ready()
    answered = 0
    try:
        for _ in range(ROUNDS):
            await policy.request(TimeStepBatch("dead.0", 0, ts._asdict()), 30)  # connected
            stale = policy.submit(TimeStepBatch("dead.0", 0, ts._asdict()), 30)
            fresh = policy.submit(TimeStepBatch("env_runner.0", 0, ts._asdict()), 30)
            replies = await asyncio.gather(stale, fresh)
            answered += 3
            ts = stepper.step(np.asarray(replies[-1].message.action))
    finally:
        stepper.env.close()
    return {"answered": answered}


GRAPH = f"""
name: twin_requests
agent: {{env_id: CartPole-v1, algorithm: {{name: random}}}}
topics:
  experience: {{delivery: reliable, hwm: 64}}
nodes:
  env_runner:
    kind: "tests.test_reliability_unroller_batching:twin_runner"
    calls: [policy]
  unroller:
    kind: unroller
    serves: [policy]
    publishes: [experience]
  replay_store:
    kind: replay_store
    config: {{num_environments: {NUM_ENVS}, max_length: 1000}}
    subscribes: [experience]
    serves: [sample]
run:
  stop_when: [env_runner, replay_store]  # a replay store that fails ends the run at once
  duration_s: 100
"""


@pytest.mark.timeout(120)
def test_two_requests_for_the_same_envs_are_never_one_batch(tmp_path):
    graph = graphlib.parse(GRAPH, "twin.yaml")
    summaries = asyncio.run(asyncio.wait_for(run_graph(graph, str(tmp_path)), 110))
    assert summaries["env_runner.0"]["answered"] == 3 * ROUNDS
    steps = 3 * ROUNDS * NUM_ENVS
    assert summaries["unroller.0"]["env_steps"] == steps
    assert summaries["replay_store.0"]["inserted"] == steps  # every step, none refused


class _Req:
    def __init__(self, offset: int, n: int = 2):
        self.message = TimeStepBatch("r", offset, {"env_id": np.arange(n)})


def test_take_batch_holds_back_a_repeated_environment():
    a, b, c, d = _Req(0), _Req(2), _Req(0), _Req(4)
    queue = [b, c, d]
    requests, held = take_batch(a, lambda: queue.pop(0) if queue else None, 64)
    assert requests == [a, b] and held is c and queue == [d]  # d waits behind c: order kept
    queue = [b, d]
    assert take_batch(a, lambda: queue.pop(0) if queue else None, 2) == ([a, b], None)
