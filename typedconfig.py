"""Build a frozen config dataclass from a plain mapping, rejecting unknown keys and bad types.

A neutral module below every package: ``pipeline`` builds node configs with it (so mistakes are
reported with the graph's file and line) and ``algorithms`` its algorithm configs, without
either layer importing the other. Supports the annotations configs use:
``int``, ``float``, ``str``, ``bool``, ``list``, ``dict``, ``X | None``, ``list[X]``,
``dict[str, X]``, ``Literal[...]`` and ``Any``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import types
import typing
from typing import Any, Literal


class ConfigError(ValueError):
    """A config value or key is wrong. ``key`` is the dotted path below the config root."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}" if key else message)
        self.key, self.message = key, message


# Set while ``run.py check`` loads a graph: where :func:`absent_input` notes what is missing.
_ABSENT_INPUTS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "absent_inputs", default=None)


@contextlib.contextmanager
def noting_absent_inputs():
    """Within this, :func:`absent_input` appends its message to the yielded list instead of
    raising. ``run.py check`` validates a graph that names a file still to be made (a dataset
    its header says how to write) as the valid graph it is, and says what is missing; ``run``
    refuses it until the file exists."""
    notes: list[str] = []
    token = _ABSENT_INPUTS.set(notes)
    try:
        yield notes
    finally:
        _ABSENT_INPUTS.reset(token)


def absent_input(key: str, message: str) -> None:
    """A file or directory the config names does not exist (yet): a :class:`ConfigError`,
    or a note within :func:`noting_absent_inputs`. ``message`` says what to make and how."""
    notes = _ABSENT_INPUTS.get()
    if notes is None:
        raise ConfigError(key, message)
    notes.append(message)


def build(cls: type, data: Any, where: str = "") -> Any:
    """``cls(**data)`` after checking keys, types and a field's ``minimum`` (metadata); raises
    :class:`ConfigError`. A field whose metadata has ``parse`` takes ``parse(value, path)``
    instead of the type check (a value whose type depends on its content, such as an
    algorithm config chosen by its ``name``)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(where, f"expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            raise ConfigError(_join(where, key), f"unknown key (known: {', '.join(fields)})")
    values = {}
    for name, f in fields.items():
        path = _join(where, name)
        if name in data:
            parse = f.metadata.get("parse")
            values[name] = parse(data[name], path) if parse else \
                check(hints[name], data[name], path)
            minimum = f.metadata.get("minimum")
            if minimum is not None and values[name] is not None and values[name] < minimum:
                raise ConfigError(path, f"must be >= {minimum}, got {values[name]!r}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(path, "required key is missing")
    return cls(**values)


def field_docs(cls: type) -> dict[str, str]:
    """One-line docs of fields, taken from ``metadata={"doc": ...}``."""
    return {f.name: f.metadata.get("doc", "") for f in dataclasses.fields(cls)}


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else str(key)


def check(annotation, value, path: str):
    """Return ``value`` (ints widened to float where a float is wanted) or raise ConfigError."""
    if annotation is Any:
        return value
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for option in args:
            try:
                return check(option, value, path)
            except ConfigError as exc:
                errors.append(exc.message)
        # A number that is not finite is that, not a wrong type (``float | None`` and .nan).
        finite = [e for e in errors if e.startswith("must be a finite")]
        raise ConfigError(path, finite[0] if finite else
                          f"expected {_name(annotation)}, got {_describe(value)}")
    if annotation is type(None):
        if value is None:
            return None
        raise ConfigError(path, f"expected null, got {_describe(value)}")
    if origin is Literal:
        if value in args:
            return value
        raise ConfigError(path, f"must be one of {', '.join(map(repr, args))}, got {value!r}")
    if annotation is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = float(value)
            # Durations, sizes, rates and coefficients are finite: every comparison with NaN
            # is false (a timeout of .nan never fires), and .inf turns a limit off unsaid.
            if not math.isfinite(value):
                raise ConfigError(path, f"must be a finite number, got {value}")
            return value
        raise ConfigError(path, f"expected a number, got {_describe(value)}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        # YAML 1.2 reads 1e5 as a float; a count written that way means the integer.
        if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 53:
            return int(value)
        raise ConfigError(path, f"expected an integer, got {_describe(value)}")
    if annotation in (str, bool):
        if isinstance(value, annotation):
            return value
        raise ConfigError(path, f"expected {annotation.__name__}, got {_describe(value)}")
    if annotation is list or origin is list:
        if not isinstance(value, list):
            raise ConfigError(path, f"expected a list, got {_describe(value)}")
        if args:
            return [check(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)]
        return value
    if annotation is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a mapping, got {_describe(value)}")
        if args:
            return {k: check(args[1], v, _join(path, k)) for k, v in value.items()}
        return value
    if dataclasses.is_dataclass(annotation):
        # One already built (a graph section shared by every node) is not built again.
        return value if isinstance(value, annotation) else build(annotation, value, path)
    return value


def _name(annotation) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def _describe(value) -> str:
    return "null" if value is None else f"{type(value).__name__} {value!r}"
