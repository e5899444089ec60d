"""Node kinds: one module per kind, each with ``async def run(config, bus, ready)``.

The module name is the kind name used in graphs (``kind: replay_store``).
"""
