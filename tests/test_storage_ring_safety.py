"""Memory-mapped rings under kill -9 and a second writer.

A child process appends to a buffer on ``storage_dir`` and is killed (SIGKILL, by itself,
at a chosen point of an append); the parent then re-attaches to the files as a restarted
replay store would and checks that every step the cursors count holds the data written
for it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from collections import namedtuple

import pytest
import torch

from storage import ReplayBuffer, StepType, StorageLocked, TensorSpec
from storage.ring import RingStorage

Step = namedtuple("Step", ["step_type", "reward", "discount", "observation"])
SPEC = Step(
    TensorSpec((), torch.int64), TensorSpec(()), TensorSpec(()), TensorSpec((3,), torch.int64)
)
NUM_ENVS, LENGTH = 3, 8


def _batch(t: int) -> Step:
    """Step ``t`` of every env: each field says which (env, t) it belongs to."""
    envs = torch.arange(NUM_ENVS)
    return Step(
        torch.full((NUM_ENVS,), int(StepType.MID)),
        envs * 1000.0 + t,
        torch.ones(NUM_ENVS),
        torch.stack([envs, torch.full((NUM_ENVS,), t), envs * 1000 + t], 1),
    )


def _kill_self(*_args, **_kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


def _writers():
    """Where the writer processes come from: forks of a fork server started clean, never of
    the test process itself, which earlier tests may have left with threads (a Ray cluster's
    gRPC threads made a fork of it die of SIGSEGV instead of the SIGKILL it sent itself)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])  # the fork server imports torch once, not each child
    return ctx


def _writer(directory: str, steps: int, kill_at: str, backend: str) -> None:
    rb = ReplayBuffer(
        SPEC, NUM_ENVS, LENGTH, storage_dir=directory, backend=backend, keep_episodic_info=True
    )
    for t in range(steps):
        rb.add_batch(_batch(t))
    if kill_at == "half-written":

        def write_one_field_then_die(self, slots, batch):
            self._host.observation[slots] = batch.observation.numpy()
            _kill_self()

        RingStorage.write_slots = write_one_field_then_die
    else:  # every field written, the cursors not yet moved
        type(rb.writer).commit = _kill_self
    rb.add_batch(_batch(steps))


@pytest.mark.parametrize("backend", ["fused", "reference"])
@pytest.mark.parametrize("kill_at", ["half-written", "before-commit"])
@pytest.mark.parametrize("steps", [5, 11])  # before and after the rings wrap
def test_kill_mid_append_never_exposes_a_stale_slot(tmp_path, backend, kill_at, steps):
    directory = str(tmp_path / "replay")
    child = _writers().Process(target=_writer, args=(directory, steps, kill_at, backend))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    rb = ReplayBuffer(
        SPEC, NUM_ENVS, LENGTH, storage_dir=directory, backend=backend, keep_episodic_info=True
    )
    assert rb.reattached
    assert rb.writer.current_pos.tolist() == [steps] * NUM_ENVS  # the killed step is not in
    data, info = rb.gather_all()
    # A full ring has dropped its oldest step (its slot was being overwritten).
    size = min(steps, LENGTH - 1)
    first = steps - size
    for env in range(NUM_ENVS):
        expected_t = list(range(first, steps))
        assert data.observation[env, :, 1].tolist() == expected_t
        assert data.observation[env, :, 0].tolist() == [env] * size
        assert data.reward[env].tolist() == [env * 1000.0 + t for t in expected_t]
    # Sampling afterwards reads only what was written.
    sample, info = rb.get_batch(32, 2)
    assert torch.equal(sample.observation[:, :, 1], info.positions[:, None] + torch.arange(2))
    rb.add_batch(_batch(steps))  # and the store carries on from there
    assert rb.writer.current_pos.tolist() == [steps + 1] * NUM_ENVS
    rb.close()


def test_second_writer_on_a_directory_is_refused_until_the_first_is_gone(tmp_path):
    directory = str(tmp_path / "replay")
    first = ReplayBuffer(SPEC, NUM_ENVS, LENGTH, storage_dir=directory)
    code = (
        "import sys, torch\n"
        "from tests.test_storage_ring_safety import SPEC\n"
        "from storage import ReplayBuffer, StorageLocked\n"
        "try:\n"
        f"    ReplayBuffer(SPEC, 3, 8, storage_dir={directory!r})\n"
        "except StorageLocked as exc:\n"
        "    print(exc); sys.exit(3)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    other = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert other.returncode == 3, other.stderr
    line = other.stdout.strip()
    assert "\n" not in line and directory in line and str(os.getpid()) in line
    with pytest.raises(StorageLocked, match="in use by another writer"):
        ReplayBuffer(SPEC, NUM_ENVS, LENGTH, storage_dir=directory)  # same process too
    first.close()
    again = ReplayBuffer(SPEC, NUM_ENVS, LENGTH, storage_dir=directory)
    assert again.reattached
    again.close()


def test_a_killed_writer_releases_its_directory(tmp_path):
    directory = str(tmp_path / "replay")
    child = _writers().Process(target=_writer, args=(directory, 3, "before-commit", "fused"))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    ReplayBuffer(SPEC, NUM_ENVS, LENGTH, storage_dir=directory).close()


def _evicting_writer(directory: str) -> None:
    """Fill a prioritized ring, evict every step, raise one priority, then die right after
    committing one more step (before the sampler booked it)."""
    from storage import MaxUse

    rb = ReplayBuffer(
        SPEC,
        NUM_ENVS,
        LENGTH,
        storage_dir=directory,
        prioritized_sampling=True,
        controls=(MaxUse(1),),
        seed=0,
        with_replacement=True,
    )
    for t in range(LENGTH):
        rb.add_batch(_batch(t))
    rb.update_priority(torch.tensor([0]), torch.tensor([LENGTH - 1]), torch.tensor([9.0]))
    while rb.num_sampleable:
        rb.get_batch(4, 1)
    type(rb.sampler).on_write = _kill_self
    rb.add_batch(_batch(LENGTH))


@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_kill_after_commit_leaves_the_new_step_sampleable_with_the_initial_priority(
    tmp_path, backend
):
    directory = str(tmp_path / "replay")
    child = _writers().Process(target=_evicting_writer, args=(directory,))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    rb = ReplayBuffer(
        SPEC,
        NUM_ENVS,
        LENGTH,
        storage_dir=directory,
        prioritized_sampling=True,
        seed=0,
        backend=backend,
    )
    assert rb.writer.current_pos.tolist() == [LENGTH + 1] * NUM_ENVS
    # Every older step was evicted; the new ones (which overwrote evicted slots) were not.
    assert rb.num_sampleable == NUM_ENVS
    _, info = rb.get_batch(16, 1)
    assert set(info.positions.tolist()) == {LENGTH}
    slots = torch.arange(NUM_ENVS) * LENGTH + LENGTH % LENGTH
    assert rb.sampler.priority[slots].tolist() == [9.0] * NUM_ENVS  # max priority then
    rb.close()
