"""Offline and hybrid RL: behaviour cloning, IQL and CQL, trained from datasets.

Each config extends :class:`algorithms.config_base.AlgorithmConfig` (or a class of
:mod:`algorithms.config_core`) and is listed in ``CONFIGS``; :mod:`algorithms.configs` gathers
it into the table.

``needs_dataset`` (a class fact, read by the replay store's checks): the algorithm learns
nothing from its own experience alone, so a graph must give its replay store a dataset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from algorithms.config_base import DISCOUNT, POSITIVE, AlgorithmConfig, hp
from algorithms.config_core import SacConfig


@dataclass(frozen=True, kw_only=True)
class BcConfig(AlgorithmConfig):
    """Behaviour cloning (ALF's ``BcAlgorithm``): the policy imitates the dataset's actions,
    by cross-entropy for discrete actions and by the squared error of a deterministic actor
    (tanh into the bounds) for continuous ones (``algorithms.bc``)."""

    algorithm: ClassVar[str] = "algorithms.bc:BcAlgorithm"
    needs_dataset: ClassVar[bool] = True
    name: Literal["bc"] = hp("bc", "algorithm name")
    actor_fc_layer_params: list[int] = hp([256, 256], "hidden sizes of the actor",
                                          range=POSITIVE)
    actor_learning_rate: float = hp(1e-4, "Adam learning rate of the actor", range=POSITIVE)
    rollout_noise: float = hp(0.0, "acting (not evaluation) in an env: Gaussian noise of "
                                    "this std times the half-range added to continuous "
                                    "actions, or epsilon of a uniform discrete action",
                              minimum=0.0)
    max_grad_norm: float | None = hp(None, "gradient clipping norm (null = off)",
                                     range=POSITIVE)


@dataclass(frozen=True, kw_only=True)
class IqlConfig(AlgorithmConfig):
    """Implicit Q-learning (Kostrikov et al. 2021; ALF's ``IqlAlgorithm``), continuous
    actions: an expectile value ``V(s)`` of the target critics, critics trained towards
    ``r + gamma * d * V(s')`` on dataset actions only, and a Gaussian policy extracted by
    advantage-weighted regression (``algorithms.iql``). Defaults are ALF's."""

    algorithm: ClassVar[str] = "algorithms.iql:IqlAlgorithm"
    name: Literal["iql"] = hp("iql", "algorithm name")
    actor_fc_layer_params: list[int] = hp([256, 256], "hidden sizes of the actor",
                                          range=POSITIVE)
    critic_fc_layer_params: list[int] = hp([256, 256], "hidden sizes of each critic",
                                           range=POSITIVE)
    value_fc_layer_params: list[int] = hp([256, 256], "hidden sizes of the value network",
                                          range=POSITIVE)
    actor_learning_rate: float = hp(1e-4, "Adam learning rate of the actor", range=POSITIVE)
    critic_learning_rate: float = hp(1e-4, "Adam learning rate of the critics",
                                     range=POSITIVE)
    value_learning_rate: float = hp(1e-4, "Adam learning rate of the value network",
                                    range=POSITIVE)
    gamma: float = hp(0.99, "discount factor", range=DISCOUNT)
    num_critic_replicas: int = hp(2, "critics; the value and the advantage use their "
                                     "minimum (target critics)", minimum=1)
    expectile: float = hp(0.8, "tau of the expectile value loss: |tau - 1(Q - V < 0)| "
                               "(Q - V)^2 (0.5: the mean; towards 1: the best in-sample "
                               "action)", range="(0, 1)")
    temperature: float = hp(1.0, "the actor's weight is exp((Q - V) / temperature) "
                                 "(temperature = 1 / beta of the paper)", range=POSITIVE)
    max_exp_advantage: float = hp(100.0, "clip of the exponentiated advantage",
                                  range=POSITIVE)
    target_update_tau: float = hp(0.005, "soft-update factor of the target critics",
                                  range=DISCOUNT)
    target_update_period: int = hp(1, "soft-update every this many gradient steps", minimum=1)
    actor_lr_decay_updates: int | None = hp(
        None, "cosine decay of the actor's learning rate to 0 over this many gradient updates "
              "(the IQL paper's policy schedule: the policy extracted at the end is not one "
              "step of a still-large learning rate; null: constant)", minimum=1)
    log_std_bounds: list[float] = hp([-5.0, 2.0], "[min, max] of the policy's "
                                                  "state-independent log std")
    rollout_noise: float = hp(1.0, "acting in an env: scale of the policy's std (0: its "
                                   "mean, as in evaluation)", minimum=0.0)
    td_error_loss_fn: Literal["huber", "squared"] = hp("squared", "critic TD error loss")
    max_grad_norm: float | None = hp(None, "gradient clipping norm (null = off)",
                                     range=POSITIVE)


@dataclass(frozen=True, kw_only=True)
class CqlConfig(SacConfig):
    """Conservative Q-learning, CQL(H) (Kumar et al. 2020) on SAC, continuous actions: SAC's
    losses plus a term that lowers each critic's soft maximum over sampled actions and raises
    it at the dataset's action (``algorithms.cql``). Defaults are the paper's MuJoCo ones
    (``cql_alpha`` 5, 10 actions per kind, actor 1e-4, no entropy in the target)."""

    algorithm: ClassVar[str] = "algorithms.cql:CqlAlgorithm"
    name: Literal["cql"] = hp("cql", "algorithm name")
    actor_learning_rate: float = hp(1e-4, "Adam learning rate of the actor", range=POSITIVE)
    use_entropy_reward: bool = hp(False, "include -alpha * log pi in the critics' target "
                                         "(off in CQL's reference settings)")
    cql_alpha: float = hp(5.0, "weight of the conservative term in each critic's loss",
                          minimum=0.0)
    cql_num_actions: int = hp(10, "actions sampled per state from each of: uniform, the "
                                  "policy at s, the policy at s'", minimum=1)
    cql_temperature: float = hp(1.0, "temperature T of the soft maximum "
                                     "T * logsumexp(Q / T)", range=POSITIVE)


CONFIGS: tuple[type, ...] = (BcConfig, IqlConfig, CqlConfig)
