"""The experience schema at the hops: a producer whose batch does not match the agent's
declared schema makes the replay store fail at the first batch, naming the node, the field,
what was expected and what came (in one event loop, real sockets)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
import pytest

from nodes._agent import Agent, agent_field
from pipeline import graph as graphlib
from pipeline.inloop import run_graph

GRAPH = """
name: schema_hops
agent: {env_id: CartPole-v1, algorithm: {name: random}}
topics:
  experience: {delivery: reliable, hwm: 16}
nodes:
  producer:
    kind: "tests.test_nodes_schema:producer"
    config: {broken: %s}
    publishes: [experience]
  replay_store:
    kind: replay_store
    config: {num_environments: 2, max_length: 100, min_size_to_sample: 100}
run:
  stop_when: [producer, replay_store]
  duration_s: 60
"""


@dataclass(frozen=True)
class _ProducerConfig:
    agent: Agent = agent_field()
    broken: str = ""  # the field to get wrong: "", "reward" (float64) or "action" (missing)


async def producer(config: _ProducerConfig, node, ready):
    """Two steps of CartPole as the unroller would send them, one field broken on purpose."""
    from nodes.messages import ExperienceBatch

    out = node.bus.publisher("experience")
    ready()
    rows = {"step_type": np.zeros(2, np.int64), "reward": np.zeros(2, np.float32),
            "discount": np.ones(2, np.float32), "observation": np.zeros((2, 4), np.float32),
            "prev_action": np.zeros(2, np.int64), "env_id": np.arange(2, dtype=np.int64),
            "action": np.zeros(2, np.int64)}
    if config.broken == "reward":
        rows["reward"] = rows["reward"].astype(np.float64)
    elif config.broken == "action":
        del rows["action"]
    await out.send(ExperienceBatch(np.arange(2), rows, 0))
    return {"sent": 1}


producer.Config = _ProducerConfig


def _run(tmp_path, broken: str) -> dict:
    graph = graphlib.parse(GRAPH % (broken or '""'), "schema.yaml")
    return asyncio.run(asyncio.wait_for(run_graph(graph, str(tmp_path)), 50))


@pytest.mark.timeout(90)
def test_a_matching_batch_is_stored(tmp_path):
    assert _run(tmp_path, "")["replay_store.0"]["inserted"] == 2


@pytest.mark.timeout(90)
@pytest.mark.parametrize("broken,message", [
    ("reward", "replay_store.0: experience from producer.0~0: field 'reward': expected "
               "float32[], got float64[]"),
    ("action", "replay_store.0: experience from producer.0~0: field 'action' is missing"),
])
def test_a_mistyped_or_missing_field_fails_at_the_first_batch(tmp_path, broken, message):
    with pytest.raises(RuntimeError, match="replay_store.0 failed") as info:
        _run(tmp_path, broken)
    assert message in str(info.value)
