"""Node kinds: one module per kind, each with ``async def run(config, node, ready)``.

The module name is the kind name used in graphs (``kind: replay_store``). Importing this package
registers every kind with :mod:`pipeline.kinds` (``pipeline/`` never imports ``nodes``).
"""

import pkgutil

# The graph-wide checks (env ids resolve, runners fit the replay stores, prioritized flags, ...).
from nodes import _checks  # noqa: E402,F401
from nodes import _commands as _commands  # noqa: F401 - run.py play and export (conduit)

# Importing the package registers every RL message type with the codec, so any process that
# loads a node kind (or a monitor) can decode what nodes send.
from nodes import messages as _messages  # noqa: E402,F401
from nodes._agent import Agent as _Agent
from pipeline import kinds as _kinds

# The graph's top-level ``agent:`` (env and algorithm), handed to every RL node kind.
_kinds.register_section("agent", _Agent)

_kinds.register_package(__name__, [m.name for m in pkgutil.iter_modules(__path__)
                                   if m.name != "messages"])
