"""A node kind for tests, plugged in as ``tests.crashing_node:run``: it fails at once."""


async def run(config, node, ready):
    raise RuntimeError(f"deliberate failure in {node.info.instance}")
