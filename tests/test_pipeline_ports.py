"""Declared ports at runtime, and the graph-wide check hook."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

import typedconfig as configlib
from pipeline import graph as graphlib
from pipeline import kinds
from pipeline.bus import Bus, TopicSpec
from pipeline.inloop import run_graph
from pipeline.ports import PortNotListed

GRAPH = """\
name: demo
topics:
  numbers: {delivery: reliable, hwm: 100}
nodes:
  source:
    kind: demo_source
    config: {count: 10}
    publishes: [numbers]
  sink:
    kind: demo_sink
    config: {expected: 10, input: numbers}
    subscribes: [numbers]
"""


def test_graph_checks_run_at_load_and_name_the_key(monkeypatch):
    monkeypatch.setattr(kinds, "_GRAPH_CHECKS", [])

    @kinds.register_graph_check
    def counts_agree(graph):
        if graph.configs["sink"].expected != graph.configs["source"].count:
            raise configlib.ConfigError("nodes.sink.config.expected",
                                        f"must equal nodes.source.config.count "
                                        f"({graph.configs['source'].count})")

    graphlib.parse(GRAPH, "ok.yaml")
    with pytest.raises(graphlib.GraphError) as info:
        graphlib.parse(GRAPH.replace("expected: 10", "expected: 11"), "bad.yaml")
    assert str(info.value) == ("bad.yaml:11: nodes.sink.config.expected: must equal "
                               "nodes.source.config.count (10)")


def test_the_bus_refuses_a_port_the_graph_entry_does_not_list():
    topics = {"numbers": TopicSpec("reliable", 10), "other": TopicSpec("lossy", 10)}
    bus = Bus("learner.0~0", "learner", topics, {}, {},
              listed={"subscribes": ["numbers"], "calls": ["sample"]})
    try:
        with pytest.raises(PortNotListed, match=r"^node 'learner' calls 'replay_state', but its "
                           r"graph entry does not list it under calls \(it lists: sample\)$"):
            bus.client("replay_state")
        with pytest.raises(PortNotListed, match="node 'learner' subscribes to 'other', but"):
            bus.subscriber("other")
        with pytest.raises(PortNotListed, match=r"node 'learner' publishes 'numbers', but its "
                           r"graph entry does not list it under publishes \(it lists: "
                           r"nothing\)"):
            bus.publisher("numbers")
        with pytest.raises(PortNotListed, match="node 'learner' serves 'sample'"):
            bus.server("sample")
    finally:
        bus.close()


CALLER = """\
from pipeline.messages import Record

async def run(config, node, ready):
    ready()
    await node.bus.client("sample").request(Record(1, None), 1.0)
"""


def test_a_node_using_an_unlisted_service_fails_at_once(tmp_path, monkeypatch):
    (tmp_path / "conduit_test_caller.py").write_text(CALLER)
    monkeypatch.syspath_prepend(str(tmp_path))
    text = "name: alone\nnodes:\n  caller:\n    kind: conduit_test_caller:run\n    calls: []\n"
    graph = graphlib.parse(text, "caller.yaml")

    async def main():
        with pytest.raises(RuntimeError, match="caller.0 failed: PortNotListed: node 'caller' calls 'sample', "
                           "but its graph entry does not list it under calls"):
            await run_graph(graph, str(tmp_path / "run"))

    asyncio.run(asyncio.wait_for(main(), 60))
    sys.modules.pop("conduit_test_caller", None)
    assert os.path.isdir(tmp_path / "run")
