"""``make(config, observation_space, action_space, device)``: the one place that maps algorithm
configs (:mod:`algorithms.configs`) to algorithm classes.

The older keyword form ``make(name, observation_space, action_space, device, **kwargs)`` stays
for scripts and tests; unknown keyword arguments raise ``TypeError`` naming the key.
"""

from __future__ import annotations

import importlib
import inspect

from algorithms import configs

# name -> (module, class)
_ALGORITHMS: dict[str, tuple[str, str]] = {
    "dqn": ("algorithms.dqn", "DqnAlgorithm"),
    "sac": ("algorithms.sac", "SacAlgorithm"),
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


def hyperparameters(name: str) -> dict[str, object]:
    """Default keyword arguments of algorithm ``name`` (variant defaults applied)."""
    cls = algorithm_class(name)
    sig = inspect.signature(cls.__init__)
    out = {k: p.default for k, p in sig.parameters.items()
           if p.kind is inspect.Parameter.KEYWORD_ONLY}
    out.update(configs.hyperparameters(configs.config_class(name)()))
    return out


def make(config, observation_space, action_space, device="cpu", **kwargs):
    """Build the algorithm a config (from :func:`algorithms.configs.parse`) describes.

    ``config`` may also be a name (``dqn``, ``sac``, ``ppo``, ``a2c``, ``ddpg``, ``td3``) with
    the hyperparameters as keyword arguments; the variant's defaults (td3) apply.
    """
    if isinstance(config, str):
        name = config
        cls = algorithm_class(name)
        allowed = set(hyperparameters(name)) - {"device"}
        for key in kwargs:
            if key not in allowed:
                raise TypeError(f"{name}: unknown hyperparameter {key!r}")
        params = {**configs.hyperparameters(configs.config_class(name)()), **kwargs}
        return cls(observation_space, action_space, device=device, **params)
    if kwargs:
        raise TypeError(f"make(config, ...) takes no hyperparameters: {sorted(kwargs)}")
    cls = algorithm_class(config.name)
    if config.name == "random":
        return cls(action_space, seed=config.seed)
    return cls(observation_space, action_space, device=device,
               encoder=config.encoder, image_layout=config.image_layout,
               data_transformers=config.data_transformers, precision=config.precision,
               **configs.hyperparameters(config))
