"""RL algorithms (PyTorch) with ALF's interface; nothing here knows about ZeroMQ or pipeline/.

Entry points: :func:`make` (algorithms by name), :func:`make_transformer` (data transformers),
and the data conventions in :mod:`algorithms.data`.
"""

from algorithms.data import (
    AlgStep,
    Experience,
    LossInfo,
    StepType,
    TimeStep,
    TrainResult,
    make_experience,
)
from algorithms.registry import algorithm_names, hyperparameters, make


def make_transformer(name: str, observation_space=None, **kwargs):
    """Build a data transformer by name (see :mod:`algorithms.data_transformer`)."""
    from algorithms.data_transformer import make_transformer as _make

    return _make(name, observation_space, **kwargs)


__all__ = [
    "AlgStep", "Experience", "LossInfo", "StepType", "TimeStep", "TrainResult",
    "algorithm_names", "hyperparameters", "make", "make_experience", "make_transformer",
]
