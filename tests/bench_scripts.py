"""The scripts of ``bench/`` as modules, for the tests of their parts: they are scripts, not
a package, so they are loaded from their files."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_bench(script: str, module_name: str) -> ModuleType:
    """``bench/<script>.py`` as the module ``module_name`` (registered in ``sys.modules`` so
    its dataclasses and pickling resolve; each test file names its own copy)."""
    spec = importlib.util.spec_from_file_location(module_name, ROOT / "bench" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
