"""``make(config, observation_space, action_space, device)``: the one way to build an algorithm.

A config (:mod:`algorithms.configs`) comes from a graph (:func:`algorithms.configs.parse`) or
from code (``DqnConfig(gamma=0.9)``) and names its algorithm class in its ``algorithm`` class
variable (``"module:Class"``), so adding an algorithm is adding its config to a family's
``CONFIGS``; every class takes ``(observation_space, action_space, config, device)``.
"""

from __future__ import annotations

import importlib


def algorithm_names() -> list[str]:
    """Names of the learning algorithms (``random`` is a config too, but learns nothing)."""
    from algorithms.configs import CONFIGS

    return sorted(n for n in CONFIGS if n != "random")


def algorithm_class(name: str):
    """The class that config ``name`` builds (imported on first use: it needs torch)."""
    from algorithms.configs import CONFIGS

    if name not in CONFIGS:
        raise ValueError(f"unknown algorithm {name!r}; known: {algorithm_names()}")
    module, cls = CONFIGS[name].algorithm.split(":")
    return getattr(importlib.import_module(module), cls)


def make(config, observation_space, action_space, device="cpu"):
    """The algorithm ``config`` (an :mod:`algorithms.configs` dataclass) describes."""
    name = getattr(config, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"make takes an algorithm config (algorithms.configs.parse({{'name': "
                        f"...}}) or e.g. DqnConfig(...)), got {type(config).__name__}")
    return algorithm_class(name)(observation_space, action_space, config, device=device)
