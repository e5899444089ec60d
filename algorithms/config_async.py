"""The asynchronous actor-learner family: IMPALA and APPO (V-trace targets on lagged data).

Both extend :class:`algorithms.config_core.PpoConfig`: the same networks (encoders, shared
encoder, orthogonal init, the GRU of ``rnn_size``), learning rate and its schedule, entropy and
value-loss weights, epochs and mini-batches, declared once there. What V-trace adds is
declared once here (:class:`VtraceConfig`); each config lists what is its own. :mod:`algorithms.configs`
gathers ``CONFIGS`` into the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from algorithms.config_base import POSITIVE, UNIT, hp
from algorithms.config_core import PpoConfig


@dataclass(frozen=True, kw_only=True)
class VtraceConfig(PpoConfig):
    """The V-trace truncation levels and the optimizer choice IMPALA and APPO share (not an
    algorithm of its own)."""

    clip_rho_threshold: float = hp(1.0, "rho-bar: V-trace truncates the importance weight "
                                        "pi/mu of the value targets at this level (the "
                                        "paper's 1)", range=POSITIVE)
    clip_c_threshold: float = hp(1.0, "c-bar: V-trace truncates the trace coefficients at "
                                      "this level (the paper's 1)", range=POSITIVE)
    clip_pg_rho_threshold: float | None = hp(None, "truncation of the policy-gradient "
                                                   "advantage's weight (null = "
                                                   "clip_rho_threshold)", range=POSITIVE)
    optimizer: Literal["adam", "rmsprop"] = hp(
        "adam", "adam (eps 1e-5, as PPO) or rmsprop (the IMPALA paper's: decay 0.99, no "
                "momentum, epsilon rmsprop_epsilon)")
    rmsprop_epsilon: float = hp(0.01, "RMSProp's epsilon (added to the root, torch's "
                                      "convention; the paper's 0.1 was added inside it)",
                                range=POSITIVE)


@dataclass(frozen=True, kw_only=True)
class ImpalaConfig(VtraceConfig):
    """IMPALA (Espeholt et al. 2018): actor-critic with V-trace value targets and the V-trace
    policy gradient, recomputed with the current network for every mini-batch of whole env
    columns (``algorithms.impala``). PPO's ``importance_ratio_clipping`` and
    ``log_prob_clipping`` do not apply."""

    algorithm: ClassVar[str] = "algorithms.impala:ImpalaAlgorithm"
    on_policy: ClassVar[bool] = True  # trains on unrolls from ``trajectories``, lagged or not
    name: Literal["impala"] = hp("impala", "algorithm name")
    td_lambda: float = hp(1.0, "lambda of the V-trace traces (c_t = lambda min(c-bar, "
                               "pi/mu); the paper's 1)", range=UNIT)
    num_epochs: int = hp(1, "passes over each unroll (the paper's 1: one gradient step per "
                            "batch of mini_batch_size)", minimum=1)
    normalize_advantages: bool = hp(False, "normalize the policy-gradient advantages per "
                                           "mini-batch")


@dataclass(frozen=True, kw_only=True)
class AppoConfig(VtraceConfig):
    """Asynchronous PPO as Sample Factory runs it: PPO's clipped surrogate whose advantages and
    value targets come from V-trace, computed once per batch with the current network's values
    and log-probs, before the epochs (``algorithms.appo``)."""

    algorithm: ClassVar[str] = "algorithms.appo:AppoAlgorithm"
    on_policy: ClassVar[bool] = True  # trains on unrolls from ``trajectories``, lagged or not
    name: Literal["appo"] = hp("appo", "algorithm name")
    vtrace: bool = hp(True, "V-trace advantages and value targets (td_lambda is then the "
                            "traces' lambda); false: PPO's GAE from the rollout values, "
                            "uncorrected for the lag")
    proximal_policy: Literal["behaviour", "learner"] = hp(
        "behaviour", "the policy PPO's ratio is clipped against: behaviour (the one that "
                     "acted, as Sample Factory) or learner (the current network when the batch "
                     "arrives: decoupled PPO, Hilton et al. 2021; the lag is then corrected by "
                     "V-trace's truncated weights alone and each batch gets a full trust "
                     "region however old it is)")


CONFIGS: tuple[type, ...] = (ImpalaConfig, AppoConfig)
