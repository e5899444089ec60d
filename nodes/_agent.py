"""The agent: what a graph trains, stated once in its top-level ``agent:`` section.

The env and the algorithm are facts about the whole graph: the graph loader builds the section
into one :class:`Agent` (registered with :func:`pipeline.kinds.register_section` by
:mod:`nodes`) and hands it to every node kind whose config has an ``agent`` field (env runner,
actor, unroller, learner, evaluator), so no two nodes can disagree on them. Node configs hold
only what is theirs. Torch-free: a graph is checked before any process starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _parse_algorithm(value: Any, path: str):
    from algorithms import configs

    return configs.parse(value, path)


@dataclass(frozen=True, kw_only=True)
class EnvSpec:
    """An environment: a Gymnasium id and its ``gymnasium.make`` kwargs."""

    env_id: str = field(metadata={
        "doc": "a Gymnasium id, ALE/<Game>-v5, <Game>NoFrameskip-v4 or MinAtar/<Game>-v1"})
    env_kwargs: dict = field(default_factory=dict, metadata={
        "doc": "gymnasium.make kwargs; Atari/MinAtar: preprocessing options (algorithms.envs)"})


@dataclass(frozen=True, kw_only=True)
class Agent(EnvSpec):
    """The env every RL node steps, sizes its networks for or evaluates on, and the algorithm
    (its typed config: hyperparameters, encoder, data transformers)."""

    algorithm: Any = field(metadata={
        "doc": "{name: ..., hyperparameters..., data_transformers: [...]} "
               "(algorithms.configs)", "parse": _parse_algorithm})
    probe_observation: list | None = field(default=None, metadata={
        "doc": "a raw observation whose transformed value (data transformers applied) each "
               "node that holds the policy reports in its status per parameter version, to "
               "check that unroller, learner and evaluator see the same"})

    @property
    def on_policy(self) -> bool:
        """Trains on whole unrolls (``trajectories``), not on replay samples (the algorithm
        config class says: torch-free, for the ports a graph is checked against)."""
        return self.algorithm.on_policy

    @property
    def is_random(self) -> bool:
        """Learns nothing: acts without parameters."""
        return self.algorithm.name == "random"


def agent_field():
    """The ``agent`` field of a node kind's config: filled from the graph's section."""
    return field(metadata={"doc": "the graph's top-level agent: section (filled in at load)"})
