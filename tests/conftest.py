"""Fixtures shared by several test files."""

import pytest

from storage import arrays


@pytest.fixture(params=["fused", "reference", "cpu-torch-path"])
def replay_backend(request, monkeypatch):
    """A replay backend on the CPU, for ``ReplayBuffer(backend=...)``: ``fused``, ``reference``,
    or ``cpu-torch-path``: the bookkeeping and torch trees a GPU runs, on the CPU
    (:data:`storage.arrays.TORCH_ON_CPU`; the buffer then picks that path itself: None)."""
    if request.param == "cpu-torch-path":
        monkeypatch.setattr(arrays, "TORCH_ON_CPU", True)
        return None
    return request.param
