"""Fixtures shared by several test files."""

import random

import numpy as np
import pytest
import torch

from storage import arrays

# The random state every test starts from. A test that needs other numbers draws them from a
# generator of its own; none may depend on what the tests before it drew.
TEST_SEED = 0


@pytest.fixture(autouse=True)
def _known_random_state():
    """Seed Python's ``random``, NumPy's global generator and torch (CPU and every CUDA device)
    before each test, so no test's outcome depends on which tests ran before it, or how far a
    threshold-stopped learning test got (the suite runs in random order: pytest-randomly)."""
    random.seed(TEST_SEED)
    np.random.seed(TEST_SEED)
    torch.manual_seed(TEST_SEED)  # seeds the CUDA generators too, where there are any


@pytest.fixture(params=["fused", "reference", "cpu-torch-path"])
def replay_backend(request, monkeypatch):
    """A replay backend on the CPU, for ``ReplayBuffer(backend=...)``: ``fused``, ``reference``,
    or ``cpu-torch-path``: the bookkeeping and torch trees a GPU runs, on the CPU
    (:data:`storage.arrays.TORCH_ON_CPU`; the buffer then picks that path itself: None)."""
    if request.param == "cpu-torch-path":
        monkeypatch.setattr(arrays, "TORCH_ON_CPU", True)
        return None
    return request.param


@pytest.fixture
def live_runs(tmp_path):
    """``start(graph, *overrides, run_dir=None, resume=False, seed=0)``: ``run.py`` on ``graph`` for
    real (a :class:`tests.pipeline_harness.LiveRun`), each run in a directory of its own under
    ``tmp_path`` unless given one; every run and its nodes are killed at teardown, whatever
    the test left running."""
    from tests.pipeline_harness import LiveRun

    runs = []

    def start(graph, *overrides, run_dir=None, resume=False, seed=0):
        run = LiveRun(run_dir or str(tmp_path / f"run{len(runs)}"), graph, *overrides,
                      resume=resume, seed=seed)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.kill()


@pytest.fixture(scope="session")
def dqn_cartpole_learned(tmp_path_factory):
    """``(run, (env_steps, return))``: ``graphs/dqn_cartpole.yaml`` trained through the real
    processes to 475 (:func:`tests.test_graphs_training.learned`), once per session. The tests
    that read a learned run (its accounting, its TensorBoard, the best policy it kept) share it:
    learning the same run twice cost CI a minute."""
    from tests.pipeline_harness import LiveRun
    from tests.test_graphs_training import graph, learned

    root = tmp_path_factory.mktemp("dqn_cartpole_learned")
    runs = []

    def start(seed):
        runs.append(LiveRun(str(root / f"run{seed}"), graph("dqn_cartpole"), seed=seed))
        return runs[-1]

    try:
        yield learned(start, 475, 50_000, 550)
    finally:
        for run in runs:
            run.kill()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The random order's seed at the end of every run, ``-q`` included: a failure that
    depends on the order is repeated with ``pytest --randomly-seed=N``."""
    seed = getattr(config.option, "randomly_seed", None)
    if seed is not None and config.pluginmanager.hasplugin("randomly"):
        terminalreporter.write_line(f"random order: --randomly-seed={seed}")
