"""RL algorithms (PyTorch) with ALF's interface; nothing here knows about ZeroMQ or pipeline/.

Entry points: :mod:`algorithms.configs` (``parse``/``config_class``: typed, checked algorithm
configs, no torch; the one place each hyperparameter is declared), :func:`make` (the algorithm
a config describes, the one way to build one), :func:`make_transformer`
(data transformers), and the data conventions in :mod:`algorithms.data`.

The names below load on first use (PEP 562), so that importing a torch-free submodule such as
:mod:`algorithms.steps` (what an env runner needs) does not import torch.
"""

import importlib

_EXPORTS = {
    "AlgStep": "algorithms.data", "Experience": "algorithms.data",
    "LossInfo": "algorithms.data", "StepType": "algorithms.steps",
    "TimeStep": "algorithms.steps", "TrainResult": "algorithms.data",
    "make_experience": "algorithms.data", "algorithm_names": "algorithms.registry",
    "make": "algorithms.registry",
}


def make_transformer(name: str, observation_space=None, **kwargs):
    """Build a data transformer by name (see :mod:`algorithms.data_transformer`)."""
    from algorithms.data_transformer import make_transformer as _make

    return _make(name, observation_space, **kwargs)


def __getattr__(name: str):
    if name == "configs":
        return importlib.import_module("algorithms.configs")
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'algorithms' has no attribute {name!r}")


__all__ = [*_EXPORTS, "make_transformer"]
