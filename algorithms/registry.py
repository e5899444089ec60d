"""``make(config, observation_space, action_space, device)``: the one place that maps algorithm
configs (:mod:`algorithms.configs`) to algorithm classes, and the one way to build an
algorithm. A config comes from a graph (:func:`algorithms.configs.parse`) or from code
(``DqnConfig(gamma=0.9)``); every class takes ``(observation_space, action_space, config,
device)``.
"""

from __future__ import annotations

import importlib

# name -> (module, class)
_ALGORITHMS: dict[str, tuple[str, str]] = {
    "dqn": ("algorithms.dqn", "DqnAlgorithm"),
    "sac": ("algorithms.sac", "SacAlgorithm"),
    "qrsac": ("algorithms.qrsac", "QrsacAlgorithm"),
    "ppo": ("algorithms.ppo", "PPOAlgorithm"),
    "a2c": ("algorithms.actor_critic", "ActorCriticAlgorithm"),
    "ddpg": ("algorithms.ddpg", "DdpgAlgorithm"),
    "td3": ("algorithms.ddpg", "DdpgAlgorithm"),
    "random": ("algorithms.random_policy", "RandomPolicy"),
}


def algorithm_names() -> list[str]:
    """Names of the learning algorithms (``random`` is a config too, but learns nothing)."""
    return sorted(n for n in _ALGORITHMS if n != "random")


def algorithm_class(name: str):
    try:
        module, cls = _ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; known: {algorithm_names()}") from None
    return getattr(importlib.import_module(module), cls)


def make(config, observation_space, action_space, device="cpu"):
    """The algorithm ``config`` (an :mod:`algorithms.configs` dataclass) describes."""
    name = getattr(config, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"make takes an algorithm config (algorithms.configs.parse({{'name': "
                        f"...}}) or e.g. DqnConfig(...)), got {type(config).__name__}")
    return algorithm_class(name)(observation_space, action_space, config, device=device)
