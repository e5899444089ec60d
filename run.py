#!/usr/bin/env python
"""Conduit's one command-line entry point (``python run.py --help`` lists the commands).

    python run.py GRAPH.yaml [--set key.path=value ...]     run a graph (same as `run GRAPH`)
    python run.py check GRAPH.yaml [--set ...]               validate a graph; prints ok
    python run.py run --resume RUN_DIR                       continue a run from its checkpoint
    python run.py status RUN_DIR                             per-node state; a finished run's summary
    python run.py monitor RUN_DIR [--topic T]                live view; attaches to topics
    python run.py stop RUN_DIR                               graceful stop
    python run.py restart RUN_DIR NODE                       make-before-break restart
    python run.py swap RUN_DIR NODE [--set k=v] [--kind K]   replace a node's config or kind
    python run.py scale RUN_DIR NODE N                       change a node's replica count
    python run.py checkpoint RUN_DIR                         a checkpoint now; prints its path
    python run.py plot RUN_DIR [RUN_DIR ...] [--out PNG]     returns against steps and time
    python run.py node LAUNCH_JSON [LOG]                     (internal) one node process

User mistakes print one line and exit 2; a run that fails exits 1.
"""

from __future__ import annotations

import sys

import nodes  # noqa: F401 - registers the built-in node kinds with pipeline.kinds
from pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
