"""Reference tasks of OAC, TAAC and PPG (see :class:`algorithms.preset_base.Preset`);
:mod:`algorithms.presets` merges this table into ``PRESETS``."""

from __future__ import annotations

from algorithms.config_alf import OacConfig
from algorithms.preset_base import SAC_PENDULUM, SAC_PENDULUM_TRAINER, Preset

PRESETS: dict[str, Preset] = {
    # SAC-Pendulum's settings with optimistic exploration (ALF's beta_ub, explore_delta).
    "oac-Pendulum-v1": Preset(
        "Pendulum-v1", 20_000, -200.0,
        algorithm=OacConfig(**SAC_PENDULUM), trainer=SAC_PENDULUM_TRAINER),
}
