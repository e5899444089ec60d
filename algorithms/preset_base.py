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


# SAC's Pendulum settings, shared by the SAC family's Pendulum presets (SAC, QR-SAC, OAC): the
# algorithm fields every variant keeps, and the trainer's.
SAC_PENDULUM = dict(actor_fc_layer_params=[256, 256], critic_fc_layer_params=[256, 256],
                    actor_learning_rate=1e-3, critic_learning_rate=1e-3,
                    alpha_learning_rate=1e-3, gamma=0.99, target_update_tau=0.005,
                    initial_random_steps=1000)
SAC_PENDULUM_TRAINER = dict(num_envs=1, unroll_length=1, initial_collect_steps=1000,
                            num_updates_per_train_iter=1, mini_batch_size=256,
                            replay_buffer_length=20_000, eval_interval=1000)
