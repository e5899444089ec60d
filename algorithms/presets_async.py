"""Reference tasks of IMPALA and APPO (see :class:`algorithms.preset_base.Preset`);
:mod:`algorithms.presets` merges this table into ``PRESETS``."""

from __future__ import annotations

from algorithms.preset_base import Preset

PRESETS: dict[str, Preset] = {}
