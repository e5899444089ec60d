#!/usr/bin/env python
"""Conduit's one command-line entry point: ``python run.py --help`` lists every command, with
examples (the commands are in :mod:`pipeline.cli`; ``nodes`` adds ``play`` and ``export``).

``python run.py GRAPH.yaml`` runs a graph; ``python run.py node LAUNCH_JSON [LOG]`` is one node
process (internal: the supervisor starts it). User mistakes print one line and exit 2; a run
that fails exits 1.
"""

from __future__ import annotations

import sys

import nodes  # noqa: F401 - registers the built-in node kinds with pipeline.kinds
from pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
