"""The experience schema: the fields one stored step carries, with their dtypes and shapes,
declared once per agent and checked at every hop (unroller or actor, replay store, learner).

A stored step is the time step at ``t`` (``step_type``, ``reward``, ``discount``,
``observation``, ``prev_action``, ``env_id``), the ``action`` taken at ``t`` and what the
algorithm's ``rollout_step`` kept for training (``rollout_info.<key>``, e.g. PPO's
``log_prob``, ``value`` and a recurrent policy's ``state``). The shapes and dtypes come from the
env's spaces and the algorithm's declaration (:meth:`rollout_info_spec` of each algorithm), so
a mistake in any producer is one line naming the hop, the field, what was expected and what
came, at the first batch: never a field silently dropped or a dtype silently widened.
Torch-free: numpy dtypes only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np


class SchemaError(ValueError):
    """A batch does not match the schema; the message names the hop and the field."""


@dataclass(frozen=True)
class FieldSpec:
    """One field of one step: its shape after the batch dimensions and its numpy dtype."""

    shape: tuple[int, ...]
    dtype: str

    def __str__(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


# Fields a hop adds to what it was given, by name prefix: the replay store's sample extras.
REPLAY_EXTRAS = ("nstep.", "episode.")


@dataclass(frozen=True)
class ExperienceSchema:
    """The fields of a stored step (name -> :class:`FieldSpec`)."""

    fields: Mapping[str, FieldSpec]
    extras: tuple[str, ...] = field(default=())  # name prefixes a hop may add

    def check(self, rows: Mapping, batch_dims: int, where: str, shapes: bool = True) -> None:
        """Raise :class:`SchemaError` unless ``rows`` (name -> array with ``batch_dims``
        leading dimensions) holds exactly these fields (and extras), with these dtypes and
        (unless ``shapes`` is false) shapes. ``where`` names the hop:
        ``"unroller: experience"``. Replay samples are checked without shapes: a replay
        store that stacks frames at sample time changes the observation's."""
        for name, spec in self.fields.items():
            if name not in rows:
                raise SchemaError(f"{where}: field {name!r} is missing (expected {spec})")
            value = rows[name]
            dtype = _dtype_name(value)
            shape = tuple(np.shape(value))[batch_dims:]
            if dtype != spec.dtype or (shapes and shape != spec.shape):
                raise SchemaError(f"{where}: field {name!r}: expected {spec}, got "
                                  f"{dtype}{list(shape)}")
        for name in rows:
            if name not in self.fields and not name.startswith(self.extras):
                raise SchemaError(f"{where}: field {name!r} is not in the schema (fields: "
                                  f"{', '.join(self.fields)})")

    def with_extras(self, *prefixes: str) -> ExperienceSchema:
        return ExperienceSchema(self.fields, tuple(self.extras) + prefixes)

    def without_extras(self, rows: Mapping) -> tuple[dict, list[str]]:
        """``rows`` without the extras, and the extras' names."""
        kept = {k: v for k, v in rows.items() if not k.startswith(self.extras)}
        return kept, sorted(k for k in rows if k not in kept)


def experience_schema(observation_space: gym.Space, action_space: gym.Space,
                      rollout_info: Mapping[str, FieldSpec] | None = None) -> ExperienceSchema:
    """The schema of a stored step for these spaces and the algorithm's ``rollout_info``."""
    action = action_spec(action_space)
    fields = {
        "step_type": FieldSpec((), "int64"),
        "reward": FieldSpec((), "float32"),
        "discount": FieldSpec((), "float32"),
        **observation_fields(observation_space),
        "prev_action": action,
        "env_id": FieldSpec((), "int64"),
        "action": action,
    }
    fields.update({f"rollout_info.{k}": v for k, v in (rollout_info or {}).items()})
    return ExperienceSchema(fields)


def observation_fields(space: gym.Space) -> dict[str, FieldSpec]:
    """``{"observation": spec}``, or for a ``Dict`` space one field per key,
    ``observation.<key>`` (:func:`algorithms.steps.flat_fields`: how the wire and the replay
    rings carry a dict observation)."""
    if isinstance(space, gym.spaces.Dict):
        return {f"observation.{key}": observation_spec(sub) for key, sub in space.spaces.items()}
    return {"observation": observation_spec(space)}


def observation_spec(space: gym.Space) -> FieldSpec:
    """As :func:`algorithms.steps.observation_array` carries it: uint8, bool and float32 stay,
    any other dtype becomes float32."""
    dtype = np.dtype(space.dtype)
    kept = dtype if dtype in (np.uint8, np.bool_, np.float32) else np.dtype(np.float32)
    return FieldSpec(tuple(space.shape), kept.name)


def action_spec(space: gym.Space) -> FieldSpec:
    """Discrete actions are int64 indices; Box actions keep the space's dtype and shape."""
    if isinstance(space, gym.spaces.Discrete):
        return FieldSpec((), "int64")
    if isinstance(space, gym.spaces.Box):
        return FieldSpec(tuple(space.shape), np.dtype(space.dtype).name)
    raise ValueError(f"no experience schema for action space {space}")


def _dtype_name(value) -> str:
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return type(value).__name__
    return str(dtype).removeprefix("torch.")


def agent_schema(config, observation_space: gym.Space,
                 action_space: gym.Space) -> ExperienceSchema:
    """The schema of the algorithm ``config`` describes (its class's ``rollout_info_spec``,
    a classmethod of the config and spaces; none: the algorithm keeps no rollout info)."""
    from algorithms import registry

    cls = registry.algorithm_class(config.name)
    declared = getattr(cls, "rollout_info_spec", None)
    info = declared(config, observation_space, action_space) if declared else {}
    return experience_schema(observation_space, action_space, info)
