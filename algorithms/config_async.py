"""The asynchronous actor-learner family: IMPALA and APPO (V-trace targets on lagged data).

Each config extends :class:`algorithms.config_base.AlgorithmConfig` (or a class of
:mod:`algorithms.config_core`) and is listed in ``CONFIGS``; :mod:`algorithms.configs` gathers
it into the table.
"""

from __future__ import annotations

CONFIGS: tuple[type, ...] = ()
