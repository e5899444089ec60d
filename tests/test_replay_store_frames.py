"""The replay store keeps single uint8 frames and samples stacks of the last k (mmap too).

These drive the node's ``ReplayStore`` directly with the messages it receives (no sockets:
what is under test is what it stores and what it answers).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from nodes.messages import ExperienceBatch, SampleRequest
from nodes.replay_store import Config, ReplayStore
from storage import StepType
from typedconfig import ConfigError

FRAME = (84, 84)


def experience(values, kinds) -> dict:
    n = len(values)
    return {
        "step_type": np.array([int(k) for k in kinds], dtype=np.int32),
        "reward": np.ones(n, dtype=np.float32),
        "discount": np.ones(n, dtype=np.float32),
        "observation": np.stack([np.full(FRAME, v, dtype=np.uint8) for v in values]),
        "action": np.zeros(n, dtype=np.int64),
    }


def store_for(tmp_path, **config) -> ReplayStore:
    node = SimpleNamespace(bus=None, status={},
                           info=SimpleNamespace(device="cpu", run_dir=str(tmp_path)))
    return ReplayStore(Config(num_environments=2, max_length=32, min_size_to_sample=1,
                              frame_stack=4, **config), node)


def feed(store, steps: int, start: int = 0) -> None:
    """Two envs; env 0 starts an episode every 5 steps, env 1 every 7; frame = 2t + env."""
    for t in range(start, start + steps):
        kinds = [StepType.FIRST if t % period == 0 else StepType.MID for period in (5, 7)]
        store.insert(ExperienceBatch(np.array([0, 1]), experience([2 * t, 2 * t + 1], kinds),
                                     version=0))


def expected_stack(env: int, pos: int, k: int = 4) -> list[int]:
    period = (5, 7)[env]
    begin = pos - pos % period
    return [2 * max(p, begin) + env for p in range(pos - k + 1, pos + 1)]


@pytest.mark.parametrize("storage_dir", [None, "replay"])
def test_samples_carry_stacks_rebuilt_from_single_frames(tmp_path, storage_dir):
    store = store_for(tmp_path, storage_dir=storage_dir)
    feed(store, 40)  # the rings (32) wrap
    assert store.buffer.data_spec["observation"].shape == FRAME  # one frame per step stored
    assert store.describe()["num_earliest_frames_ignored"] == 3
    batch = store.sample(SampleRequest(16, 2, 0, 0))
    obs = np.asarray(batch.experience["observation"])
    assert obs.shape == (16, 2, 4, *FRAME) and obs.dtype == np.uint8
    for row, (env, pos) in enumerate(zip(np.asarray(batch.env_ids).tolist(),
                                         np.asarray(batch.positions).tolist(), strict=True)):
        for t in range(2):
            assert obs[row, t, :, 0, 0].tolist() == expected_stack(env, pos + t)
    if storage_dir is None:
        return
    # A restarted store re-attaches to the frames on disk and goes on stacking them.
    store.buffer.close()
    again = store_for(tmp_path, storage_dir=storage_dir)
    assert again.reattach()
    feed(again, 3, start=40)
    batch = again.sample(SampleRequest(16, 1, 0, 0))
    obs = np.asarray(batch.experience["observation"])
    for row, (env, pos) in enumerate(zip(np.asarray(batch.env_ids).tolist(),
                                         np.asarray(batch.positions).tolist(), strict=True)):
        assert obs[row, 0, :, 0, 0].tolist() == expected_stack(env, pos)
    again.buffer.close()


def test_a_missing_frame_field_is_one_line(tmp_path):
    store = store_for(tmp_path, frame_field="pixels")
    with pytest.raises(ValueError, match="frame_field: frame field 'pixels' is not"):
        feed(store, 1)


def test_frame_stack_longer_than_the_ring_is_a_config_error():
    with pytest.raises(ConfigError, match="frame_stack"):
        Config(num_environments=1, max_length=3, frame_stack=4)
