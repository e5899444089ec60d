"""NodeContext: what a node kind gets besides its config, and its wait-or-stop helper."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.bus import Bus
from pipeline.node import NodeContext, NodeInfo


def _context() -> NodeContext:
    bus = Bus("n.0", "n", {}, {}, {})
    return NodeContext(bus, NodeInfo("n", "n.0", 0, "/tmp", "cpu", None))


def test_wait_or_stop_returns_the_result_or_none_on_stop():
    async def main():
        node = _context()
        try:
            assert await node.wait_or_stop(asyncio.sleep(0, "value")) == "value"
            blocked = asyncio.get_running_loop().create_future()
            waiting = asyncio.ensure_future(node.wait_or_stop(blocked))
            await asyncio.sleep(0)
            node.stopping.set()
            assert await asyncio.wait_for(waiting, 5) is None
            assert blocked.cancelled()
            kept = asyncio.get_running_loop().create_future()
            assert await node.wait_or_stop(kept, cancel=False) is None  # already stopping
            assert not kept.cancelled()
        finally:
            node.close()
            node.bus.close()

    asyncio.run(asyncio.wait_for(main(), 10))


def test_wait_or_stop_times_out_and_passes_errors_through():
    async def main():
        node = _context()
        try:
            never = asyncio.get_running_loop().create_future()
            with pytest.raises(TimeoutError):
                await node.wait_or_stop(never, timeout=0.01)
            assert never.cancelled()

            async def fail():
                raise ValueError("boom")

            with pytest.raises(ValueError, match="boom"):
                await node.wait_or_stop(fail())
        finally:
            node.close()
            node.bus.close()

    asyncio.run(asyncio.wait_for(main(), 10))


def test_pipeline_does_not_import_nodes():
    import subprocess
    import sys

    code = ("import sys, pipeline.node, pipeline.graph, pipeline.inloop, pipeline.supervisor, "
            "pipeline.cli; print(sorted(m for m in sys.modules if m.split('.')[0] == 'nodes'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
