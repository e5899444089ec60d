"""Run a whole graph as tasks in one event loop: same nodes, same sockets, no processes.

For fast tests and for debugging with one debugger. There is no supervisor here: no restarts,
no control endpoint; the run ends when the ``run.stop_when`` nodes finish (or ``duration_s``),
and the other nodes are then stopped in :meth:`Graph.stop_order`.
"""

from __future__ import annotations

import asyncio
import os

from pipeline import wiring
from pipeline.graph import Graph
from pipeline.node import run_instance


async def run_graph(graph: Graph, run_dir: str) -> dict[str, dict]:
    """Run every node instance as a task; return each instance's summary."""
    os.makedirs(run_dir, exist_ok=True)
    sock_dir = wiring.run_socket_dir(run_dir)
    launches = [wiring.make_launch(graph, name, r, 0, run_dir, sock_dir, control=None)
                for name, node in graph.nodes.items() for r in range(node.replicas)]
    all_peers = wiring.peers(graph, launches)
    stops = {}
    tasks = {}
    for launch in launches:
        launch.peers = all_peers
        stops[launch.instance] = asyncio.Event()
        tasks[launch.instance] = asyncio.ensure_future(
            run_instance(launch, stop=stops[launch.instance]))
    by_node = {name: [t for i, t in tasks.items() if i.startswith(f"{name}.")]
               for name in graph.nodes}
    watched = [t for name in graph.run.stop_when for t in by_node[name]] or list(tasks.values())
    try:
        # Any watched node finishing ends the run (as with the supervisor); wait() does not
        # cancel the nodes on timeout, they are stopped in order below.
        await asyncio.wait(watched, timeout=graph.run.duration_s,
                           return_when=asyncio.FIRST_COMPLETED if graph.run.stop_when
                           else asyncio.ALL_COMPLETED)
    finally:
        for wave in graph.stop_order():
            for name in wave:
                for launch in launches:
                    if launch.node == name:
                        stops[launch.instance].set()
            await asyncio.gather(*(t for n in wave for t in by_node[n]), return_exceptions=True)
    failed = {i: t.exception() for i, t in tasks.items()
              if not t.cancelled() and t.exception() is not None}
    if failed:
        instance, error = next(iter(failed.items()))
        raise RuntimeError(f"{instance} failed: {error}") from error
    return {i: t.result() for i, t in tasks.items()}
