"""The algorithm part of node configs, apart from :mod:`nodes._common` so that a node can
declare and check its config without importing torch (graphs are checked at load, before any
process starts; the evaluator imports torch only when it first evaluates)."""

from __future__ import annotations

import dataclasses

# Algorithms that train on whole unrolls (``trajectories``) rather than replay samples. Kept
# here, torch-free, for the ports a graph is checked against; a test checks it against the
# algorithm classes' ``on_policy``.
ON_POLICY = frozenset({"ppo", "a2c"})


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig:
    """The fields every node that builds the graph's algorithm shares (unroller, learner,
    evaluator): declared once so the three stay in step. Node configs extend it."""

    env_id: str = dataclasses.field(metadata={"doc": "Gymnasium id (for the spaces)"})
    algorithm: dict = dataclasses.field(metadata={
        "doc": "{name: ..., hyperparameters..., data_transformers: [...]} "
               "(algorithms.configs; checked at graph load)"})
    env_kwargs: dict = dataclasses.field(default_factory=dict,
                                         metadata={"doc": "gymnasium.make kwargs"})
    probe_observation: list | None = dataclasses.field(default=None, metadata={
        "doc": "a raw observation whose transformed value (data transformers applied) the "
               "node reports in its status per parameter version, to check that unroller, "
               "learner and evaluator see the same"})


def typed_algorithm(config: AlgorithmConfig):
    """The typed algorithm config (:func:`algorithms.configs.parse`); a mistake is a
    ``ConfigError`` whose key is relative to the node's config (``algorithm.gamam``)."""
    from algorithms import configs

    return configs.parse(config.algorithm, "algorithm")


def is_on_policy(config: AlgorithmConfig) -> bool:
    return config.algorithm.get("name") in ON_POLICY


def is_random(config: AlgorithmConfig) -> bool:
    return config.algorithm.get("name") == "random"


def validate(config: AlgorithmConfig) -> None:
    """The ``validate`` hook of the kinds that build the algorithm: the algorithm block is
    checked at graph load (names, types, ranges), not when a process first builds it."""
    typed_algorithm(config)
