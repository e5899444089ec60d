"""Typed algorithm configs: one frozen dataclass per algorithm, checked before anything runs.

Each config is the one place that declares its algorithm's hyperparameters (default and
one-line doc); the algorithm class takes the config object. A graph's ``algorithm:`` block
becomes a config here (:func:`parse`); code and tests build one directly
(``DqnConfig(gamma=0.9)``, lists may be given as tuples); :func:`algorithms.make` builds the
algorithm from it (the class a config names in its ``algorithm`` class variable). This module imports no torch, so graph
load (and the evaluator, before its first evaluation) can check a config cheaply.

Every field has a one-line ``doc``; ``minimum`` (inclusive) and ``range`` (an interval such as
``"(0, 1]"``, applied to each element of a list) say which values are allowed. A mistake is a
:class:`typedconfig.ConfigError` whose ``key`` is the dotted path, e.g.
``algorithm.gamam: unknown key`` or ``algorithm.learning_rate: expected a number, got str '3e-4'``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from algorithms import config_alf, config_async, config_core, config_offline
from algorithms.config_base import (  # noqa: F401  (re-exported: the one import for callers)
    DISCOUNT,
    POSITIVE,
    TRANSFORMER_CONFIGS,
    UNIT,
    AlgorithmConfig,
    ConfigBase,
    FrameStackerConfig,
    ImageScaleConfig,
    ObservationNormalizerConfig,
    RewardClippingConfig,
    RewardNormalizerConfig,
    RewardScalingConfig,
    hp,
)
from algorithms.config_core import (  # noqa: F401
    A2cConfig,
    DdpgConfig,
    DqnConfig,
    PpoConfig,
    QrsacConfig,
    RandomConfig,
    SacConfig,
    SoftActorCriticConfig,
    Td3Config,
)
from typedconfig import ConfigError, build

CONFIGS: dict[str, type] = {
    c.__dataclass_fields__["name"].default: c
    for family in (config_core, config_async, config_offline, config_alf)
    for c in family.CONFIGS}


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
