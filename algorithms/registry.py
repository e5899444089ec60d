"""``make(name, observation_space, action_space, device, **kwargs)``: the one place that maps
config names to algorithm classes. Unknown keyword arguments raise ``TypeError`` naming the key.
"""

from __future__ import annotations

import importlib
import inspect

# name -> (module, class, defaults that distinguish the variant)
_ALGORITHMS: dict[str, tuple[str, str, dict]] = {
    "dqn": ("algorithms.dqn", "DqnAlgorithm", {}),
    "sac": ("algorithms.sac", "SacAlgorithm", {}),
    "ppo": ("algorithms.ppo", "PPOAlgorithm", {}),
    "a2c": ("algorithms.actor_critic", "ActorCriticAlgorithm", {}),
    "ddpg": ("algorithms.ddpg", "DdpgAlgorithm", {}),
    "td3": ("algorithms.ddpg", "DdpgAlgorithm", {
        "num_critic_replicas": 2, "target_policy_noise": 0.2, "target_policy_noise_clip": 0.5,
        "actor_update_period": 2, "exploration_noise": "gaussian", "ou_stddev": 0.1}),
}


def algorithm_names() -> list[str]:
    return sorted(_ALGORITHMS)


def algorithm_class(name: str):
    try:
        module, cls, _ = _ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; known: {algorithm_names()}") from None
    return getattr(importlib.import_module(module), cls)


def hyperparameters(name: str) -> dict[str, object]:
    """Default keyword arguments of algorithm ``name`` (variant defaults applied)."""
    cls = algorithm_class(name)
    sig = inspect.signature(cls.__init__)
    out = {k: p.default for k, p in sig.parameters.items()
           if p.kind is inspect.Parameter.KEYWORD_ONLY}
    out.update(_ALGORITHMS[name][2])
    return out


def make(name: str, observation_space, action_space, device="cpu", **kwargs):
    """Build algorithm ``name`` (``dqn``, ``sac``, ``ppo``, ``a2c``, ``ddpg``, ``td3``)."""
    cls = algorithm_class(name)
    allowed = set(hyperparameters(name)) - {"device"}
    for key in kwargs:
        if key not in allowed:
            raise TypeError(f"{name}: unknown hyperparameter {key!r}")
    params = {**_ALGORITHMS[name][2], **kwargs}
    return cls(observation_space, action_space, device=device, **params)
