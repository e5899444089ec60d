"""Frames stored once, stacks of the last k rebuilt at sample time, never across an episode."""

from __future__ import annotations

import random
from collections import deque, namedtuple

import numpy as np
import pytest
import torch

from storage import ReplayBuffer, StepType, TensorSpec
from storage.frame_stack import check_stackable, stack_shape, stacked_frames

Step = namedtuple("Step", ["step_type", "reward", "discount", "observation"])
FRAME = (2, 3)


def spec(frame=FRAME):
    return Step(
        TensorSpec((), torch.int64), TensorSpec(()), TensorSpec(()), TensorSpec(frame, torch.uint8)
    )


def frame_of(value: int, frame=FRAME) -> np.ndarray:
    return np.full(frame, value % 256, dtype=np.uint8)


def add(rb, env_frames: list[tuple[int, int, StepType]]):
    """One step for the given ``(env, frame value, step type)``s."""
    rb.add_batch(
        Step(
            torch.tensor([int(t) for _, _, t in env_frames]),
            torch.ones(len(env_frames)),
            torch.ones(len(env_frames)),
            torch.from_numpy(np.stack([frame_of(v) for _, v, _ in env_frames])),
        ),
        torch.tensor([e for e, _, _ in env_frames]),
    )


def stack_values(stacks) -> list:
    """The frame value of each stacked frame (frames are constant arrays)."""
    return stacks[..., 0, 0].tolist()


def test_stack_repeats_the_first_frame_of_an_episode_and_never_crosses_it():
    rb = ReplayBuffer(spec(), 1, 16, num_earliest_frames_ignored=3, keep_episodic_info=True)
    kinds = [
        StepType.FIRST,
        StepType.MID,
        StepType.MID,
        StepType.MID,
        StepType.LAST,
        StepType.FIRST,
        StepType.MID,
        StepType.MID,
        StepType.MID,
    ]
    for t, kind in enumerate(kinds):
        add(rb, [(0, t, kind)])
    positions = torch.tensor([3, 4, 5, 6, 7])
    stacks = stacked_frames(rb, "observation", torch.zeros(5, dtype=torch.int64), positions, 1, 4)
    assert stacks.shape == (5, 1, 4, *FRAME) and stacks.dtype == torch.uint8
    assert stack_values(stacks[:, 0]) == [
        [0, 1, 2, 3],
        [1, 2, 3, 4],  # the first episode
        [5, 5, 5, 5],
        [5, 5, 5, 6],
        [5, 5, 6, 7],  # the second: its first frame repeats
    ]
    # A sequence of two steps stacks each step on its own.
    pair = stacked_frames(rb, "observation", torch.tensor([0]), torch.tensor([4]), 2, 4)
    assert stack_values(pair[0]) == [[1, 2, 3, 4], [5, 5, 5, 5]]


def test_stack_shapes():
    assert stack_shape((84, 84), 4) == (4, 84, 84)
    assert stack_shape((1, 84, 84), 4) == (4, 84, 84)
    assert stack_shape((3, 8, 8), 2) == (6, 8, 8)
    assert stack_shape((5,), 3) == (15,)


@pytest.mark.parametrize("mmap", [False, True])
def test_rebuilt_stacks_equal_those_of_a_frame_stacker_in_the_env_loop(tmp_path, replay_backend,
                                                                         mmap):
    """Random episodes in 3 envs over wrapping rings: every sampled step's rebuilt stack is
    the one a running frame stacker (reset on FIRST) had built when the step was taken."""
    k, num_envs, length = 4, 3, 24
    rng = random.Random(0)
    rb = ReplayBuffer(
        spec(),
        num_envs,
        length,
        num_earliest_frames_ignored=k - 1,
        keep_episodic_info=True,
        backend=replay_backend,
        seed=1,
        storage_dir=str(tmp_path / "replay") if mmap else None,
    )
    check_stackable(rb, "observation", k)
    running = [deque(maxlen=k) for _ in range(num_envs)]
    truth = {}  # (env, position) -> the stack the env loop saw
    remaining = [0] * num_envs
    value = 0
    for pos in range(100):
        batch = []
        for env in range(num_envs):
            if remaining[env] == 0:
                kind, remaining[env] = StepType.FIRST, rng.randint(1, 9)
            elif remaining[env] == 1:
                kind, remaining[env] = StepType.LAST, 0
            else:
                kind, remaining[env] = StepType.MID, remaining[env] - 1
            value += 1
            if kind == StepType.FIRST:
                running[env].clear()
                running[env].extend([value] * k)
            else:
                running[env].append(value)
            truth[env, pos] = [v % 256 for v in running[env]]
            batch.append((env, value, kind))
        add(rb, batch)
        if pos >= 10 and pos % 7 == 0:
            _, info = rb.get_batch(16, 2)
            stacks = stacked_frames(rb, "observation", info.env_ids, info.positions, 2, k)
            for row, (env, start) in enumerate(
                zip(info.env_ids.tolist(), info.positions.tolist(), strict=True)
            ):
                for t in range(2):
                    assert stack_values(stacks[row, t]) == truth[env, start + t]
    rb.close()


def test_check_stackable_says_what_is_missing():
    with pytest.raises(ValueError, match="keep_episodic_info"):
        plain = ReplayBuffer(spec(), 1, 8, num_earliest_frames_ignored=3, keep_episodic_info=False)
        check_stackable(plain, "observation", 4)
    rb = ReplayBuffer(spec(), 1, 8, num_earliest_frames_ignored=2, keep_episodic_info=True)
    with pytest.raises(ValueError, match="num_earliest_frames_ignored >= 3"):
        check_stackable(rb, "observation", 4)
    with pytest.raises(ValueError, match="'pixels' is not in the stored data"):
        check_stackable(rb, "pixels", 2)
    check_stackable(rb, "observation", 3)
