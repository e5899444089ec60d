"""What every algorithm config is built from: the field helper :func:`hp` (default, one-line
doc, range), the base classes, the value ranges, and the data-transformer configs.

Torch-free, like :mod:`algorithms.configs`, which gathers the algorithm configs of every family
(this module's :class:`AlgorithmConfig` subclasses) into one table. A family of algorithms
declares its configs in its own module (``algorithms.config_<family>``) on top of this one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

Encoder = Literal["mlp", "nature_cnn", "impala", "minatar_cnn"]
ImageLayout = Literal["auto", "hwc", "chw"]


def hp(default, doc: str, *, minimum=None, range=None):  # noqa: A002
    """A hyperparameter field with its doc and checks; list defaults are copied per instance."""
    meta: dict[str, Any] = {"doc": doc}
    if minimum is not None:
        meta["minimum"] = minimum
    if range is not None:
        meta["range"] = range
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


class ConfigBase:
    """Base of every config: a list field given as a tuple is stored as a list, so a config
    built in code equals the one parsed from YAML (and :func:`to_dict` round-trips)."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                object.__setattr__(self, f.name, list(value))


POSITIVE = "(0, inf)"
UNIT = "[0, 1]"
DISCOUNT = "(0, 1]"


# ----- data transformers ------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ObservationNormalizerConfig(ConfigBase):
    """``(obs - mean) / std`` with running statistics updated on training data."""

    name: Literal["observation_normalizer"] = hp("observation_normalizer", "transformer name")
    clipping: float = hp(0.0, "clip normalized observations to [-clipping, clipping] (0 = off)",
                         minimum=0.0)
    zero_mean: bool = hp(True, "subtract the running mean (else only divide by the std)")
    update_rate: float | None = hp(None, "EMA rate of the statistics (null = exact running "
                                         "mean/variance)", range="(0, 1]")


@dataclass(frozen=True, kw_only=True)
class RewardClippingConfig(ConfigBase):
    """Clip rewards to ``minmax``."""

    name: Literal["reward_clipping"] = hp("reward_clipping", "transformer name")
    minmax: list[float] = hp([-1.0, 1.0], "[low, high] bounds of the reward")


@dataclass(frozen=True, kw_only=True)
class RewardScalingConfig(ConfigBase):
    """Multiply rewards by ``scale``."""

    name: Literal["reward_scaling"] = hp("reward_scaling", "transformer name")
    scale: float = hp(1.0, "factor applied to every reward")


@dataclass(frozen=True, kw_only=True)
class RewardNormalizerConfig(ConfigBase):
    """Divide rewards by their running std, updated on training data."""

    name: Literal["reward_normalizer"] = hp("reward_normalizer", "transformer name")
    update_max_calls: int = hp(0, "stop updating the statistics after this many updates "
                                  "(0 = never stop)", minimum=0)
    clip_value: float = hp(-1.0, "clip normalized rewards to [-clip_value, clip_value] "
                                 "(<= 0 = off)")


@dataclass(frozen=True, kw_only=True)
class FrameStackerConfig(ConfigBase):
    """Stack the last ``stack_size`` observations (a FIRST step starts a fresh stack). List it
    before an observation normalizer: on-policy, the learner recognizes the frame an unroll
    continues from by its raw value."""

    name: Literal["frame_stacker"] = hp("frame_stacker", "transformer name")
    stack_size: int = hp(4, "number of frames in a stack", minimum=1)
    stack_axis: int | None = hp(None, "axis of one observation to concatenate on (null = the "
                                      "image's channel axis, or axis 0)")


@dataclass(frozen=True, kw_only=True)
class ImageScaleConfig(ConfigBase):
    """Map uint8 images in [0, 255] linearly to [min, max] (float32, outside the network)."""

    name: Literal["image_scale"] = hp("image_scale", "transformer name")
    min: float = hp(-1.0, "value of pixel 0")
    max: float = hp(1.0, "value of pixel 255")


@dataclass(frozen=True, kw_only=True)
class ObservationConcatConfig(ConfigBase):
    """A Dict observation's arrays as one float32 vector (first in the list; added with every
    key when an env's Dict observation has none: docs/her.md)."""

    name: Literal["observation_concat"] = hp("observation_concat", "transformer name")
    keys: list[str] | None = hp(None, "the Dict observation's keys to concatenate, in this "
                                      "order (null = every key, sorted)")


TRANSFORMER_CONFIGS: dict[str, type] = {
    c.name: c for c in (ObservationNormalizerConfig, RewardClippingConfig, RewardScalingConfig,
                        RewardNormalizerConfig, FrameStackerConfig, ImageScaleConfig,
                        ObservationConcatConfig)}


# ----- algorithms -------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class AlgorithmConfig(ConfigBase):
    """Fields every algorithm has (``name`` first: each subclass narrows it).

    ``on_policy`` (a class fact, not a field): the algorithm trains on whole unrolls
    (``trajectories``) rather than replay samples; the graph wires its nodes by it.
    ``algorithm`` (a class fact too): ``"module:Class"`` of the algorithm this config builds,
    what :func:`algorithms.make` imports; a config's class is its registration."""

    on_policy: ClassVar[bool] = False
    algorithm: ClassVar[str] = ""
    name: str = hp("", "algorithm name")
    encoder: Encoder = hp("mlp", "observation encoder: mlp (flatten), nature_cnn, impala "
                                 "(residual) or minatar_cnn (one 3x3 conv); images are "
                                 "scaled inside the network")
    image_layout: ImageLayout = hp("auto", "image axis order: hwc, chw or auto (chw unless "
                                           "the first axis is larger than the last)")
    data_transformers: list = hp([], "list of {name: ..., <options>}: "
                                     + ", ".join(TRANSFORMER_CONFIGS))
    precision: Literal["float32", "bfloat16"] = hp(
        "float32", "training precision: bfloat16 runs the hidden layers' matrix products of "
                   "an update in bfloat16 (mixed precision; about twice as fast on CPUs with "
                   "AVX512-BF16 or AMX and on recent GPUs, slower elsewhere); parameters, "
                   "optimizer, output layers and losses stay float32")


