"""Typed algorithm configs: one frozen dataclass per algorithm, checked before anything runs.

Each config is the one place that declares its algorithm's hyperparameters (default and
one-line doc); the algorithm class takes the config object. A graph's ``algorithm:`` block
becomes a config here (:func:`parse`); code and tests build one directly
(``DqnConfig(gamma=0.9)``, lists may be given as tuples); :func:`algorithms.make` builds the
algorithm from it. This module imports no torch, so graph
load (and the evaluator, before its first evaluation) can check a config cheaply.

Every field has a one-line ``doc``; ``minimum`` (inclusive) and ``range`` (an interval such as
``"(0, 1]"``, applied to each element of a list) say which values are allowed. A mistake is a
:class:`typedconfig.ConfigError` whose ``key`` is the dotted path, e.g.
``algorithm.gamam: unknown key`` or ``algorithm.learning_rate: expected a number, got str '3e-4'``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from typedconfig import ConfigError, build

Encoder = Literal["mlp", "nature_cnn", "impala", "minatar_cnn"]
ImageLayout = Literal["auto", "hwc", "chw"]


def _f(default, doc: str, *, minimum=None, range=None):  # noqa: A002
    """A field with its doc and checks; list defaults are copied per instance."""
    meta: dict[str, Any] = {"doc": doc}
    if minimum is not None:
        meta["minimum"] = minimum
    if range is not None:
        meta["range"] = range
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


class _Lists:
    """Base of every config: a list field given as a tuple is stored as a list, so a config
    built in code equals the one parsed from YAML (and :func:`to_dict` round-trips)."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                object.__setattr__(self, f.name, list(value))


_POSITIVE = "(0, inf)"
_UNIT = "[0, 1]"
_DISCOUNT = "(0, 1]"


# ----- data transformers ------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ObservationNormalizerConfig(_Lists):
    """``(obs - mean) / std`` with running statistics updated on training data."""

    name: Literal["observation_normalizer"] = _f("observation_normalizer", "transformer name")
    clipping: float = _f(0.0, "clip normalized observations to [-clipping, clipping] (0 = off)",
                         minimum=0.0)
    zero_mean: bool = _f(True, "subtract the running mean (else only divide by the std)")
    update_rate: float | None = _f(None, "EMA rate of the statistics (null = exact running "
                                         "mean/variance)", range="(0, 1]")


@dataclass(frozen=True, kw_only=True)
class RewardClippingConfig(_Lists):
    """Clip rewards to ``minmax``."""

    name: Literal["reward_clipping"] = _f("reward_clipping", "transformer name")
    minmax: list[float] = _f([-1.0, 1.0], "[low, high] bounds of the reward")


@dataclass(frozen=True, kw_only=True)
class RewardScalingConfig(_Lists):
    """Multiply rewards by ``scale``."""

    name: Literal["reward_scaling"] = _f("reward_scaling", "transformer name")
    scale: float = _f(1.0, "factor applied to every reward")


@dataclass(frozen=True, kw_only=True)
class RewardNormalizerConfig(_Lists):
    """Divide rewards by their running std, updated on training data."""

    name: Literal["reward_normalizer"] = _f("reward_normalizer", "transformer name")
    update_max_calls: int = _f(0, "stop updating the statistics after this many updates "
                                  "(0 = never stop)", minimum=0)
    clip_value: float = _f(-1.0, "clip normalized rewards to [-clip_value, clip_value] "
                                 "(<= 0 = off)")


@dataclass(frozen=True, kw_only=True)
class FrameStackerConfig(_Lists):
    """Stack the last ``stack_size`` observations (a FIRST step starts a fresh stack). List it
    before an observation normalizer: on-policy, the learner recognizes the frame an unroll
    continues from by its raw value."""

    name: Literal["frame_stacker"] = _f("frame_stacker", "transformer name")
    stack_size: int = _f(4, "number of frames in a stack", minimum=1)
    stack_axis: int | None = _f(None, "axis of one observation to concatenate on (null = the "
                                      "image's channel axis, or axis 0)")


@dataclass(frozen=True, kw_only=True)
class ImageScaleConfig(_Lists):
    """Map uint8 images in [0, 255] linearly to [min, max] (float32, outside the network)."""

    name: Literal["image_scale"] = _f("image_scale", "transformer name")
    min: float = _f(-1.0, "value of pixel 0")
    max: float = _f(1.0, "value of pixel 255")


TRANSFORMER_CONFIGS: dict[str, type] = {
    c.name: c for c in (ObservationNormalizerConfig, RewardClippingConfig, RewardScalingConfig,
                        RewardNormalizerConfig, FrameStackerConfig, ImageScaleConfig)}


# ----- algorithms -------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class _Common(_Lists):
    """Fields every algorithm has (``name`` first: each subclass narrows it).

    ``on_policy`` (a class fact, not a field): the algorithm trains on whole unrolls
    (``trajectories``) rather than replay samples; the graph wires its nodes by it."""

    on_policy: ClassVar[bool] = False
    name: str = _f("", "algorithm name")
    encoder: Encoder = _f("mlp", "observation encoder: mlp (flatten), nature_cnn, impala "
                                 "(residual) or minatar_cnn (one 3x3 conv); images are "
                                 "scaled inside the network")
    image_layout: ImageLayout = _f("auto", "image axis order: hwc, chw or auto (chw unless "
                                           "the first axis is larger than the last)")
    data_transformers: list = _f([], "list of {name: ..., <options>}: "
                                     + ", ".join(TRANSFORMER_CONFIGS))
    precision: Literal["float32", "bfloat16"] = _f(
        "float32", "training precision: bfloat16 runs the hidden layers' matrix products of "
                   "an update in bfloat16 (mixed precision; about twice as fast on CPUs with "
                   "AVX512-BF16 or AMX and on recent GPUs, slower elsewhere); parameters, "
                   "optimizer, output layers and losses stay float32")


@dataclass(frozen=True, kw_only=True)
class DqnConfig(_Common):
    """DQN / Double DQN with n-step targets (``algorithms.dqn``)."""

    name: Literal["dqn"] = _f("dqn", "algorithm name")
    fc_layer_params: list[int] = _f([256, 256], "hidden sizes of the Q network", range=_POSITIVE)
    learning_rate: float = _f(1e-3, "Adam learning rate", range=_POSITIVE)
    gamma: float = _f(0.99, "discount factor", range=_DISCOUNT)
    n_step: int = _f(1, "length of the bootstrapped return (batches are n_step + 1 long)",
                     minimum=1)
    td_lambda: float = _f(1.0, "lambda of the target within the window (n_step > 1)",
                          range=_UNIT)
    td_error_loss_fn: Literal["huber", "squared"] = _f("huber", "TD error loss")
    double_q: bool = _f(True, "pick the target action with the online network (Double DQN)")
    target_update_tau: float = _f(1.0, "soft-update factor of the target (1 = hard copy)",
                                  range=_DISCOUNT)
    target_update_period: int = _f(100, "update the target every this many gradient steps",
                                   minimum=1)
    rollout_epsilon_greedy: float = _f(0.05, "final exploration epsilon", range=_UNIT)
    epsilon_greedy_start: float = _f(1.0, "initial exploration epsilon", range=_UNIT)
    epsilon_decay_steps: int = _f(10000, "env steps over which epsilon decays linearly",
                                  minimum=0)
    initial_random_steps: int = _f(0, "env steps with uniformly random actions", minimum=0)
    max_grad_norm: float | None = _f(10.0, "gradient clipping norm (null = off)",
                                     range=_POSITIVE)


@dataclass(frozen=True, kw_only=True)
class _SoftActorCritic(_Common):
    """The fields SAC and its variants share (ALF's names), declared once."""

    actor_fc_layer_params: list[int] = _f([256, 256], "hidden sizes of the actor",
                                          range=_POSITIVE)
    critic_fc_layer_params: list[int] = _f([256, 256], "hidden sizes of each critic",
                                           range=_POSITIVE)
    actor_learning_rate: float = _f(3e-4, "Adam learning rate of the actor", range=_POSITIVE)
    critic_learning_rate: float = _f(3e-4, "Adam learning rate of the critics",
                                     range=_POSITIVE)
    alpha_learning_rate: float = _f(3e-4, "Adam learning rate of log_alpha", range=_POSITIVE)
    gamma: float = _f(0.99, "discount factor", range=_DISCOUNT)
    num_critic_replicas: int = _f(2, "number of critics; the target takes their minimum (per "
                                     "quantile in QR-SAC)", minimum=1)
    target_entropy: float | None = _f(None, "entropy target (null = -action_dim, or "
                                            "target_entropy_scale * log(n) for discrete)")
    initial_log_alpha: float = _f(0.0, "initial log_alpha")
    max_log_alpha: float | None = _f(None, "cap of log_alpha (null = no cap)")
    use_entropy_reward: bool = _f(True, "include -alpha * log pi in the target value")
    target_update_tau: float = _f(0.005, "soft-update factor of the target critics",
                                  range=_DISCOUNT)
    target_update_period: int = _f(1, "soft-update every this many gradient steps", minimum=1)
    initial_random_steps: int = _f(0, "env steps with uniformly random actions", minimum=0)
    max_grad_norm: float | None = _f(None, "gradient clipping norm (null = off)",
                                     range=_POSITIVE)


@dataclass(frozen=True, kw_only=True)
class SacConfig(_SoftActorCritic):
    """Soft Actor-Critic, continuous or discrete actions (``algorithms.sac``)."""

    name: Literal["sac"] = _f("sac", "algorithm name")
    mini_batch_length: int = _f(2, "replay window length T (2 = one-step targets)", minimum=2)
    td_lambda: float = _f(0.95, "lambda of the critic target when mini_batch_length > 2",
                          range=_UNIT)
    td_error_loss_fn: Literal["huber", "squared"] = _f("squared", "TD error loss")
    target_entropy_scale: float = _f(0.5, "discrete default target entropy factor",
                                     range=_POSITIVE)
    parallel_update: bool = _f(False, "run the actor's and the critics' halves of an update "
                                      "on two threads (continuous actions, learner "
                                      "num_threads 1; the same update)")


@dataclass(frozen=True, kw_only=True)
class QrsacConfig(_SoftActorCritic):
    """SAC with quantile-regression critics, continuous actions (``algorithms.qrsac``)."""

    name: Literal["qrsac"] = _f("qrsac", "algorithm name")
    num_quantiles: int = _f(50, "quantiles each critic outputs, at fractions (2i+1)/(2N)",
                            minimum=1)
    huber_kappa: float = _f(1.0, "kappa of the quantile Huber loss", range=_POSITIVE)
    sum_over_quantiles: bool = _f(True, "sum the critic loss over the predicted quantiles "
                                        "(the paper's; false: average, ALF's default)")
    risk_measure: Literal["mean", "cvar"] = _f("mean", "the actor's value of the quantiles: "
                                                       "mean (risk-neutral) or cvar")
    risk_level: float = _f(0.25, "cvar's alpha: the mean of the lowest ceil(alpha * N) "
                                 "quantiles", range=_DISCOUNT)


@dataclass(frozen=True, kw_only=True)
class PpoConfig(_Common):
    """PPO with the clipped surrogate objective (``algorithms.ppo``)."""

    on_policy: ClassVar[bool] = True
    name: Literal["ppo"] = _f("ppo", "algorithm name")
    actor_fc_layer_params: list[int] = _f([64, 64], "hidden sizes of the actor",
                                          range=_POSITIVE)
    value_fc_layer_params: list[int] = _f([64, 64], "hidden sizes of the value network",
                                          range=_POSITIVE)
    learning_rate: float = _f(3e-4, "Adam learning rate", range=_POSITIVE)
    gamma: float = _f(0.99, "discount factor", range=_DISCOUNT)
    td_lambda: float = _f(0.95, "lambda of GAE", range=_UNIT)
    importance_ratio_clipping: float = _f(0.2, "epsilon of the clipped objective",
                                          range=_POSITIVE)
    log_prob_clipping: float = _f(0.0, "clip log-probs to (-c, c) in the ratio (0 = off)",
                                  minimum=0.0)
    normalize_advantages: bool = _f(True, "normalize advantages per mini-batch")
    advantage_clip: float | None = _f(None, "clip advantages to [-x, x] (null = off)",
                                      range=_POSITIVE)
    entropy_regularization: float = _f(0.0, "entropy coefficient", minimum=0.0)
    td_loss_weight: float = _f(0.5, "value-loss coefficient", minimum=0.0)
    num_epochs: int = _f(4, "passes over each unroll", minimum=1)
    mini_batch_size: int = _f(64, "samples per gradient step", minimum=1)
    max_grad_norm: float | None = _f(0.5, "gradient clipping norm (null = off)",
                                     range=_POSITIVE)
    init_std: float = _f(1.0, "initial std of the Gaussian policy (continuous actions)",
                         range=_POSITIVE)
    activation: Literal["tanh", "relu"] = _f("tanh", "activation after every hidden layer, "
                                                     "conv layers included")
    orthogonal_init: bool = _f(False, "orthogonal weights (gain sqrt 2; policy head 0.01, value "
                                      "head 1) and zero biases, else torch's default init")
    learning_rate_anneal_steps: int | None = _f(None, "trained env steps over which the "
                                                      "learning rate decays linearly to 0 "
                                                      "(null = constant)", minimum=1)
    shared_encoder_fc_layer_params: list[int] | None = _f(
        None, "null: separate actor and value networks; a list: one encoder plus these "
              "layers shared by both (CleanRL's Atari PPO: [512] with empty actor and value "
              "layers), half the convolutions of an image update", range=_POSITIVE)
    rnn_size: int | None = _f(None, "hidden size of a GRU between the encoder and the heads: "
                                    "a recurrent policy trained on whole env columns of "
                                    "mini_batch_size // T each (null = feed-forward)",
                              minimum=1)


@dataclass(frozen=True, kw_only=True)
class A2cConfig(_Common):
    """Synchronous advantage actor-critic (``algorithms.actor_critic``)."""

    on_policy: ClassVar[bool] = True
    name: Literal["a2c"] = _f("a2c", "algorithm name")
    actor_fc_layer_params: list[int] = _f([64, 64], "hidden sizes of the actor",
                                          range=_POSITIVE)
    value_fc_layer_params: list[int] = _f([64, 64], "hidden sizes of the value network",
                                          range=_POSITIVE)
    learning_rate: float = _f(7e-4, "Adam learning rate", range=_POSITIVE)
    gamma: float = _f(0.99, "discount factor", range=_DISCOUNT)
    use_gae: bool = _f(False, "GAE advantages instead of return - value")
    td_lambda: float = _f(0.95, "lambda of GAE", range=_UNIT)
    use_td_lambda_return: bool = _f(True, "with GAE, train the value on the lambda-return")
    normalize_advantages: bool = _f(False, "normalize advantages over the unroll")
    advantage_clip: float | None = _f(None, "clip advantages to [-x, x] (null = off)",
                                      range=_POSITIVE)
    entropy_regularization: float = _f(0.0, "entropy coefficient", minimum=0.0)
    td_loss_weight: float = _f(0.5, "value-loss coefficient", minimum=0.0)
    max_grad_norm: float | None = _f(0.5, "gradient clipping norm (null = off)",
                                     range=_POSITIVE)
    init_std: float = _f(1.0, "initial std of the Gaussian policy (continuous actions)",
                         range=_POSITIVE)
    shared_encoder_fc_layer_params: list[int] | None = _f(
        None, "null: separate actor and value networks; a list: one encoder plus these ReLU "
              "layers shared by both (CleanRL's Atari PPO: [512] with empty actor and value "
              "layers), half the convolutions of an image update", range=_POSITIVE)


@dataclass(frozen=True, kw_only=True)
class DdpgConfig(_Common):
    """DDPG (``algorithms.ddpg``); TD3 is the same algorithm with :class:`Td3Config`."""

    name: Literal["ddpg"] = _f("ddpg", "algorithm name")
    actor_fc_layer_params: list[int] = _f([256, 256], "hidden sizes of the actor",
                                          range=_POSITIVE)
    critic_fc_layer_params: list[int] = _f([256, 256], "hidden sizes of each critic",
                                           range=_POSITIVE)
    actor_learning_rate: float = _f(1e-3, "Adam learning rate of the actor", range=_POSITIVE)
    critic_learning_rate: float = _f(1e-3, "Adam learning rate of the critics",
                                     range=_POSITIVE)
    gamma: float = _f(0.99, "discount factor", range=_DISCOUNT)
    mini_batch_length: int = _f(2, "replay window length T (2 = one-step targets)", minimum=2)
    td_lambda: float = _f(0.95, "lambda of the critic target when mini_batch_length > 2",
                          range=_UNIT)
    td_error_loss_fn: Literal["huber", "squared"] = _f("squared", "TD error loss")
    num_critic_replicas: int = _f(1, "number of critics; targets take their minimum",
                                  minimum=1)
    exploration_noise: Literal["ou", "gaussian"] = _f("ou", "rollout noise process")
    ou_stddev: float = _f(0.2, "stddev of the exploration noise", minimum=0.0)
    ou_damping: float = _f(0.15, "damping of the OU process", range=_UNIT)
    rollout_random_action: float = _f(0.0, "probability of a uniformly random rollout action",
                                      range=_UNIT)
    target_policy_noise: float = _f(0.0, "stddev of target policy smoothing (0 = off)",
                                    minimum=0.0)
    target_policy_noise_clip: float = _f(0.5, "clip of the smoothing noise", minimum=0.0)
    actor_update_period: int = _f(1, "update actor and targets every this many critic updates",
                                  minimum=1)
    target_update_tau: float = _f(0.005, "soft-update factor of the targets", range=_DISCOUNT)
    target_update_period: int = _f(1, "soft-update every this many actor updates", minimum=1)
    dqda_clipping: float | None = _f(None, "clip dQ/da element-wise (null = off)",
                                     range=_POSITIVE)
    action_l2: float = _f(0.0, "weight of the squared action norm in the actor loss",
                          minimum=0.0)
    initial_random_steps: int = _f(0, "env steps with uniformly random actions", minimum=0)
    max_grad_norm: float | None = _f(None, "gradient clipping norm (null = off)",
                                     range=_POSITIVE)


@dataclass(frozen=True, kw_only=True)
class Td3Config(DdpgConfig):
    """TD3: DDPG with twin critics, target policy smoothing and delayed actor updates."""

    name: Literal["td3"] = _f("td3", "algorithm name")
    num_critic_replicas: int = _f(2, "number of critics; targets take their minimum",
                                  minimum=1)
    exploration_noise: Literal["ou", "gaussian"] = _f("gaussian", "rollout noise process")
    ou_stddev: float = _f(0.1, "stddev of the exploration noise", minimum=0.0)
    target_policy_noise: float = _f(0.2, "stddev of target policy smoothing (0 = off)",
                                    minimum=0.0)
    target_policy_noise_clip: float = _f(0.5, "clip of the smoothing noise", minimum=0.0)
    actor_update_period: int = _f(2, "update actor and targets every this many critic updates",
                                  minimum=1)


@dataclass(frozen=True, kw_only=True)
class RandomConfig(_Lists):
    """Uniformly random actions (measuring the pipeline; no parameters to wait for)."""

    on_policy: ClassVar[bool] = False
    name: Literal["random"] = _f("random", "algorithm name")
    seed: int = _f(0, "seed of the action sampler")


CONFIGS: dict[str, type] = {
    c.__dataclass_fields__["name"].default: c
    for c in (DqnConfig, SacConfig, QrsacConfig, PpoConfig, A2cConfig, DdpgConfig, Td3Config,
              RandomConfig)}


def config_class(name: str) -> type:
    """The config dataclass of algorithm ``name``; ``KeyError`` if there is none."""
    if name not in CONFIGS:
        raise KeyError(f"unknown algorithm {name!r} (known: {', '.join(CONFIGS)})")
    return CONFIGS[name]


def parse(mapping: Any, where: str = "algorithm") -> Any:
    """The typed config of a graph's ``algorithm:`` mapping (``name`` included).

    Raises :class:`ConfigError` naming the key path below ``where`` for an unknown algorithm
    or key, a value of the wrong type, or one out of its range.
    """
    if not isinstance(mapping, dict):
        raise ConfigError(where, f"expected a mapping with a name, got {type(mapping).__name__}")
    name = mapping.get("name")
    if name is None:
        raise ConfigError(_join(where, "name"), f"required key is missing "
                                                f"(one of {', '.join(CONFIGS)})")
    if name not in CONFIGS:
        raise ConfigError(_join(where, "name"), f"unknown algorithm {name!r} "
                                                f"(known: {', '.join(CONFIGS)})")
    cls = CONFIGS[name]
    rest = dict(mapping)
    transformers = rest.pop("data_transformers", None)
    config = build(cls, rest, where)
    _check_ranges(config, where)
    if transformers is not None:
        if "data_transformers" not in cls.__dataclass_fields__:
            raise ConfigError(_join(where, "data_transformers"), "unknown key")
        config = dataclasses.replace(
            config, data_transformers=parse_transformers(
                transformers, _join(where, "data_transformers")))
    return config


def parse_transformers(entries: Any, where: str = "data_transformers") -> list:
    """``[{name: ..., <options>}, ...]`` -> list of transformer configs."""
    if not isinstance(entries, list):
        raise ConfigError(where, f"expected a list, got {type(entries).__name__}")
    out = []
    for i, entry in enumerate(entries):
        path = f"{where}[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(path, f"expected a mapping with a name, got {entry!r}")
        name = entry.get("name")
        if name not in TRANSFORMER_CONFIGS:
            raise ConfigError(_join(path, "name"), f"unknown data transformer {name!r} "
                                                   f"(known: {', '.join(TRANSFORMER_CONFIGS)})")
        config = build(TRANSFORMER_CONFIGS[name], entry, path)
        _check_ranges(config, path)
        if isinstance(config, RewardClippingConfig) and (
                len(config.minmax) != 2 or config.minmax[0] > config.minmax[1]):
            raise ConfigError(_join(path, "minmax"), f"must be [low, high] with low <= high, "
                                                     f"got {config.minmax!r}")
        out.append(config)
    return out


def to_dict(config: Any) -> dict[str, Any]:
    """The plain mapping a config was parsed from (``parse(to_dict(c)) == c``)."""
    return dataclasses.asdict(config)


def hyperparameters(config: Any) -> dict[str, Any]:
    """The algorithm's own hyperparameters in ``config``: every field but ``name`` and those
    every algorithm has (encoder, image layout, data transformers, precision)."""
    skip = {"name", "encoder", "image_layout", "data_transformers", "precision"}
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
            if f.name not in skip}


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _check_ranges(config: Any, where: str) -> None:
    for f in dataclasses.fields(config):
        spec = f.metadata.get("range")
        value = getattr(config, f.name)
        if spec is None or value is None:
            continue
        for v in value if isinstance(value, list) else [value]:
            if not _in_range(v, spec):
                raise ConfigError(_join(where, f.name), f"must be in {spec}, got {value!r}")


def _in_range(value: float, spec: str) -> bool:
    lo_open, hi_open = spec[0] == "(", spec[-1] == ")"
    lo_s, hi_s = (s.strip() for s in spec[1:-1].split(","))
    lo, hi = float(lo_s), (math.inf if hi_s == "inf" else float(hi_s))
    above = value > lo if lo_open else value >= lo
    below = value < hi if hi_open else value <= hi
    return above and below
