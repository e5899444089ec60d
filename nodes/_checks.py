"""Graph-wide checks of the RL node kinds: settings that must agree across nodes.

Registered with :func:`pipeline.kinds.register_graph_check` when :mod:`nodes` is imported, so
``run.py run`` and ``run.py check`` reject these mistakes at load, one line with the key's
file:line, before any process starts.
"""

from __future__ import annotations

from pipeline.config import ConfigError
from pipeline.kinds import register_graph_check

# Kinds whose ``env_id``/``env_kwargs`` describe the one environment of the run, in the order
# the first one is taken as the reference (the runner steps it; the others size networks or
# evaluate on it).
ENV_KINDS = ("env_runner", "unroller", "learner", "evaluator")


def _nodes_of(graph, kind: str) -> list[str]:
    return [name for name, spec in graph.nodes.items() if spec.kind == kind]


@register_graph_check
def environments_agree(graph) -> None:
    """Every env id resolves here, and runner, unroller, learner and evaluator name the same
    environment with the same kwargs (else the networks are sized for, or evaluated on, a
    different environment than the one that is stepped)."""
    from algorithms.envs import check_env_id

    reference = None
    for kind in ENV_KINDS:
        for name in _nodes_of(graph, kind):
            config = graph.configs[name]
            try:
                check_env_id(config.env_id, config.env_kwargs)
            except ValueError as exc:
                raise ConfigError(f"nodes.{name}.config.env_id", str(exc)) from None
            if reference is None:
                reference = name
                continue
            ref = graph.configs[reference]
            if config.env_id != ref.env_id:
                raise ConfigError(f"nodes.{name}.config.env_id",
                                  f"{config.env_id!r} differs from node {reference!r}'s "
                                  f"{ref.env_id!r}; every RL node must use the same env")
            if config.env_kwargs != ref.env_kwargs:
                raise ConfigError(f"nodes.{name}.config.env_kwargs",
                                  f"{config.env_kwargs!r} differs from node {reference!r}'s "
                                  f"{ref.env_kwargs!r}")


@register_graph_check
def prioritized_agrees(graph) -> None:
    """A prioritized learner needs prioritized replay (importance weights, priorities to
    update), and prioritized replay needs a learner that sends priorities."""
    for name in _nodes_of(graph, "learner"):
        learner = graph.configs[name]
        if "sample" not in graph.nodes[name].calls:
            continue
        for store in _nodes_of(graph, "replay_store"):
            if "sample" not in graph.nodes[store].serves:
                continue
            replay = graph.configs[store].prioritized_sampling
            if learner.prioritized != replay:
                raise ConfigError(
                    f"nodes.{name}.config.prioritized",
                    f"is {str(learner.prioritized).lower()} but replay_store {store!r} has "
                    f"prioritized_sampling: {str(replay).lower()}; set both the same")
