"""Node kinds: one module per kind, each with ``async def run(config, bus, ready)``.

The module name is the kind name used in graphs (``kind: replay_store``).
"""

# Importing the package registers every RL message type with the codec, so any process that
# loads a node kind (or a monitor) can decode what nodes send.
from nodes import messages as _messages  # noqa: E402,F401
