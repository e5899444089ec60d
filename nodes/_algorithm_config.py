"""The algorithm part of node configs, apart from :mod:`nodes._common` so that a node can
declare its config without importing torch (the evaluator imports it only when it first
evaluates, to keep the graph's start-up short)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig:
    """The fields every node that builds the graph's algorithm shares (unroller, learner,
    evaluator): declared once so the three stay in step. Node configs extend it."""

    env_id: str = dataclasses.field(metadata={"doc": "Gymnasium id (for the spaces)"})
    algorithm: dict = dataclasses.field(metadata={"doc": "{name: ..., hyperparameters...}"})
    env_kwargs: dict = dataclasses.field(default_factory=dict,
                                         metadata={"doc": "gymnasium.make kwargs"})
