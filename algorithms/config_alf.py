"""ALF's wider family: OAC, TAAC and PPG.

Each config extends a class of :mod:`algorithms.config_core` (OAC and TAAC SAC's, PPG PPO's),
so a hyperparameter they share is declared once, and is listed in ``CONFIGS``;
:mod:`algorithms.configs` gathers it into the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from algorithms.config_base import DISCOUNT, hp
from algorithms.config_core import PpoConfig, SacConfig, SoftActorCriticConfig


@dataclass(frozen=True, kw_only=True)
class OacConfig(SacConfig):
    """Optimistic Actor-Critic: SAC whose rollout samples around a mean shifted up the
    gradient of an upper bound of Q (``algorithms.oac``); continuous actions only."""

    algorithm: ClassVar[str] = "algorithms.oac:OacAlgorithm"
    name: Literal["oac"] = hp("oac", "algorithm name")
    beta_ub: float = hp(4.6, "weight of the critics' spread in the upper bound "
                             "Q_UB = mean_r Q_r + beta_ub * std_r Q_r", minimum=0.0)
    explore_delta: float = hp(6.8, "how far the exploration mean moves: the KL between the "
                                   "shifted and the policy's Gaussian is delta^2 / 2",
                              minimum=0.0)


@dataclass(frozen=True, kw_only=True)
class PpgConfig(PpoConfig):
    """Phasic Policy Gradient: PPO's policy phase, and every ``aux_interval`` unrolls an
    auxiliary phase that distills the value into the policy network (``algorithms.ppg``)."""

    algorithm: ClassVar[str] = "algorithms.ppg:PpgAlgorithm"
    name: Literal["ppg"] = hp("ppg", "algorithm name")
    aux_interval: int = hp(32, "unrolls of policy phase between auxiliary phases (N_pi)",
                           minimum=1)
    aux_epochs: int = hp(6, "passes over the stored unrolls in an auxiliary phase (E_aux)",
                         minimum=1)
    aux_mini_batch_size: int = hp(512, "samples per gradient step of the auxiliary phase",
                                  minimum=1)
    aux_kl_weight: float = hp(1.0, "weight of the behaviour-cloning KL(pi_old || pi) in the "
                                   "auxiliary loss (beta_clone)", minimum=0.0)


@dataclass(frozen=True, kw_only=True)
class TaacConfig(SoftActorCriticConfig):
    """Temporally abstract actor-critic: each step, repeat the previous action or take the
    actor's new one, chosen by their Q values (``algorithms.taac``); continuous actions. Its
    ``target_entropy`` is the action's (null: ALF's default from ``action_min_prob``)."""

    algorithm: ClassVar[str] = "algorithms.taac:TaacAlgorithm"
    name: Literal["taac"] = hp("taac", "algorithm name")
    mini_batch_length: int = hp(6, "replay window length T: the compare-through target runs "
                                    "along it while the action is repeated", minimum=2)
    action_min_prob: float = hp(0.1, "default action entropy target: sum over dimensions of "
                                     "log(action_min_prob * (high - low))", range=DISCOUNT)
    switch_min_prob: float = hp(0.05, "entropy target of the act-or-repeat choice: that of "
                                      "a two-way choice with this probability on its "
                                      "lesser side", range=DISCOUNT)


CONFIGS: tuple[type, ...] = (OacConfig, PpgConfig, TaacConfig)
