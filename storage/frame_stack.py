"""Frames stored once, stacks rebuilt at sample time (ALF's FrameStacker with replay).

A stacked observation of k frames shares k - 1 frames with its neighbours, so storing the
stacks costs k times the memory of storing each frame once (1M Atari steps: ~28 GiB against
~7 GiB). The buffer keeps single frames; a sampled step at position p gets the frames at
p - k + 1 .. p of its environment, where a position before the step's episode began is
replaced by the episode's first frame (so no frame of a previous episode is ever in a stack,
and the first steps of an episode repeat its first frame, as ALF's frame stacker does).

The positions a stack reads must still be stored: a sample must start at least k - 1 steps
after the earliest stored step (``num_earliest_frames_ignored >= k - 1``, ALF's rule), and
the episode index must be kept (``keep_episodic_info``).

A ``[H, W]`` frame stacks to ``[k, H, W]``; a ``[C, H, W]`` frame to ``[k * C, H, W]``; a
``[D]`` vector to ``[k * D]`` (oldest first).
"""

from __future__ import annotations

import numpy as np
import torch

from storage.nest import get_field, has_field


def stack_shape(frame_shape: tuple, k: int) -> tuple:
    """The shape of a stack of ``k`` frames of ``frame_shape`` (see module docstring)."""
    frame_shape = tuple(frame_shape)
    if len(frame_shape) == 2:
        return (k, *frame_shape)
    if not frame_shape:
        raise ValueError("frame stacking needs frames of at least one dimension")
    return (k * frame_shape[0], *frame_shape[1:])


def check_stackable(buffer, field: str, k: int) -> None:
    """``ValueError`` unless ``buffer`` can rebuild stacks of ``k`` frames of ``field``."""
    if k < 1:
        raise ValueError(f"frame stack must be at least 1, got {k}")
    if not has_field(buffer.data_spec, field):
        raise ValueError(f"frame field {field!r} is not in the stored data")
    stack_shape(get_field(buffer.data_spec, field).shape, k)
    if k > 1 and buffer.episodes is None:
        raise ValueError("frame stacking needs keep_episodic_info (episode starts)")
    if k > 1 and buffer.sampler.num_earliest_frames_ignored < k - 1:
        raise ValueError(
            f"frame stacking of {k} needs num_earliest_frames_ignored >= {k - 1}, got "
            f"{buffer.sampler.num_earliest_frames_ignored}"
        )


def stacked_frames(buffer, field: str, env_ids, positions, batch_length: int, k: int):
    """Stacks of the last ``k`` frames of ``field`` for each step of sampled sequences.

    ``env_ids``, ``positions``: ``[B]`` from ``BatchInfo`` (each sequence's first step).
    Returns ``[B, batch_length, *stack_shape]``, in the stored dtype.
    """
    length = buffer.max_length
    env_ids = torch.as_tensor(env_ids, device=buffer.device)
    positions = torch.as_tensor(positions, device=buffer.device)
    steps = torch.arange(batch_length, device=buffer.device)
    pos = positions[:, None] + steps[None, :]  # [B, T]
    env = env_ids[:, None].expand_as(pos)
    begin = buffer.episodes.begin[env, pos % length]  # [B, T]
    offsets = torch.arange(1 - k, 1, device=buffer.device)  # oldest first
    stack_pos = torch.maximum(pos[..., None] + offsets, begin[..., None])  # [B, T, k]
    slots = env[..., None] * length + stack_pos % length
    data = buffer.storage.field(field)
    frame_shape = tuple(data.shape[2:])
    if data.device.type == "cpu":
        flat = data.numpy().reshape((-1, *frame_shape))
        frames = torch.from_numpy(np.take(flat, slots.numpy().reshape(-1), axis=0))
    else:
        frames = data.reshape((-1, *frame_shape)).index_select(0, slots.reshape(-1))
    return frames.reshape((*pos.shape, *stack_shape(frame_shape, k)))
