"""The type of a reference task (:class:`Preset`), apart from the tables of
:mod:`algorithms.presets` so that each family's table (``algorithms.presets_<family>``) can
declare its own without importing the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Preset:
    """One reference task.

    env_id: Gymnasium id.
    budget: env-step budget of the issue.
    threshold: mean greedy return over 10 episodes to reach within the budget.
    algorithm: the algorithm's config.
    trainer: ``TrainerConfig`` fields.
    seed: representative seed for the CI run.
    """

    env_id: str
    budget: int
    threshold: float
    algorithm: Any
    trainer: dict = field(default_factory=dict)
    seed: int = 0

    @property
    def algo(self) -> str:
        """The algorithm's registry name (its config's ``name``)."""
        return self.algorithm.name
