#!/usr/bin/env bash
# Builds bench/.venv-peers: the replay benchmark's peers (cpprb, TorchRL's C++ segment trees
# and prioritized buffer) with the torch that TorchRL 0.14.1's compiled extension was built
# for (2.14.1). The project's own venv keeps its pinned torch; bench/replay.py runs the peers
# in this venv as a subprocess (bench/peers/measure.py).
#
#     bash bench/peers/setup.sh            # PYTHON=python3.11 PEERS_VENV=dir to override
#
# torch 2.14.1 exists on the package index for Linux x86_64 only as the CUDA build (a 555 MB
# wheel; with the CUDA libraries it loads at import and triton, about 4.5 GB installed).
# There is no CPU-only 2.14.1 wheel there, and torch without those libraries fails to import
# (libcudnn.so.9 missing), so the venv holds the CUDA build; the benchmark runs it on the CPU.
# TorchRL 0.14.1 pins tensordict < 0.15; TorchRL, tensordict and hoptorch go in with
# --no-deps so that pip cannot swap the torch above.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${PEERS_VENV:-$here/../.venv-peers}
python=${PYTHON:-python3}
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" torch==2.14.1 numpy cloudpickle packaging importlib_metadata orjson \
    'pyvers>=0.2.3,<0.3' cpprb==11.0.0
"${pip[@]}" --no-deps torchrl==0.14.1 tensordict==0.14.3 hoptorch==0.1.4
"$venv/bin/python" - <<'PY'
import importlib.metadata, torch
from torchrl._torchrl import SumSegmentTreeFp64  # the compiled extension loads
print(f"peers ready: torch {torch.__version__}, cpprb {importlib.metadata.version('cpprb')}, TorchRL C++ trees")
PY
