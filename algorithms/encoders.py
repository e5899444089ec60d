"""Observation encoders: the network's first stage, from a raw observation batch to features.

Images arrive as they are stored: uint8 (Atari, 0-255), bool or 0/1 floats (MinAtar), in
``[H, W, C]`` (Gymnasium, MinAtar) or ``[C, H, W]`` (stacked frames) order, or ``[H, W]``
grayscale. The encoder converts inside its forward pass (uint8 -> float in [0, 1], HWC -> CHW),
so no float copy of an image batch exists outside the network: replay, the wire and the
learner's batch stay uint8 (4x fewer bytes).

Kinds (``encoder:`` in an algorithm config):

* ``mlp``: flatten (the fully connected layers that follow are the MLP).
* ``nature_cnn``: Mnih et al. 2015: conv 32x8/4, 64x4/2, 64x3/1. On images too small for a
  layer (MinAtar's 10x10) that layer's kernel shrinks to the image and its stride to 1.
* ``impala``: Espeholt et al. 2018: three stages of conv 3x3, max-pool 3/2 and two residual
  blocks, with 16, 32, 32 channels.
* ``minatar_cnn``: Young & Tian 2019: one conv 16x3/1 (MinAtar's reference network).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from algorithms.precision import compute_input

ENCODERS = ("mlp", "nature_cnn", "impala", "minatar_cnn")


def image_layout(shape: Sequence[int], layout: str = "auto") -> str | None:
    """``"hwc"``, ``"chw"``, ``"hw"`` for an image shape, None for anything else.

    ``auto``: a 3-D shape is CHW when its first axis is not larger than its last
    (``[4, 84, 84]``; this project's Atari ``[1, 84, 84]`` and MinAtar ``[C, 10, 10]``, also
    Seaquest's ``[10, 10, 10]``), else HWC (Gymnasium's ``[84, 84, 4]``, the raw MinAtar
    package's ``[10, 10, C]``); a 2-D shape is a grayscale image. ``image_layout:`` in the
    config settles any other case.
    """
    if len(shape) == 2:
        return "hw"
    if len(shape) != 3:
        return None
    if layout != "auto":
        return layout
    return "chw" if shape[0] <= shape[-1] else "hwc"


def channel_axis(shape: Sequence[int], layout: str = "auto") -> int:
    """Axis of one observation along which frames stack (0 for vectors)."""
    kind = image_layout(shape, layout)
    return len(shape) - 1 if kind == "hwc" else 0


def chw_shape(shape: Sequence[int], layout: str = "auto") -> tuple[int, int, int]:
    kind = image_layout(shape, layout)
    if kind is None:
        raise ValueError(f"a conv encoder needs an image observation ([H, W], [H, W, C] or "
                         f"[C, H, W]); got shape {tuple(shape)}")
    if kind == "hw":
        return (1, *shape)
    if kind == "hwc":
        return (shape[2], shape[0], shape[1])
    return tuple(shape)


def as_float(x: torch.Tensor) -> torch.Tensor:
    """uint8 pixels -> [0, 1]; bool and other dtypes -> float32 (no copy for float32)."""
    if x.dtype == torch.uint8:
        return x.to(torch.float32).mul_(1.0 / 255.0)
    return x if x.dtype == torch.float32 else x.to(torch.float32)


class Flatten(nn.Module):
    """``[B, ...] -> [B, n]`` float32 (the ``mlp`` encoder)."""

    def __init__(self, shape: Sequence[int]):
        super().__init__()
        self.output_size = int(np.prod(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return as_float(x.flatten(1))


class _ImageInput(nn.Module):
    """Raw image batch -> float ``[B, C, H, W]``."""

    def __init__(self, shape: Sequence[int], layout: str):
        super().__init__()
        self.kind = image_layout(shape, layout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "hw":
            x = x.unsqueeze(1)
        elif self.kind == "hwc":
            x = x.permute(0, 3, 1, 2)
        return as_float(x)


class _Residual(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


def _impala_stage(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1),
                         nn.MaxPool2d(3, stride=2, padding=1), _Residual(c_out), _Residual(c_out))


def _conv_stack(c: int, size: tuple[int, int], params, activation) -> list[nn.Module]:
    """``(filters, kernel, stride)`` layers; a kernel larger than the image shrinks to it."""
    layers: list[nn.Module] = []
    h, w = size
    for filters, kernel, stride in params:
        k = (min(kernel, h), min(kernel, w))
        s = stride if (h >= kernel and w >= kernel) else 1
        layers += [nn.Conv2d(c, filters, k, s), activation()]
        c, h, w = filters, (h - k[0]) // s + 1, (w - k[1]) // s + 1
    return layers


class ConvEncoder(nn.Module):
    """Image batch (any layout, uint8/bool/float) -> ``[B, output_size]`` features."""

    def __init__(self, shape: Sequence[int], kind: str = "nature_cnn", layout: str = "auto",
                 conv_layer_params=None, activation=nn.ReLU):
        super().__init__()
        c, h, w = chw_shape(shape, layout)
        self.input = _ImageInput(shape, layout)
        if conv_layer_params:
            layers = _conv_stack(c, (h, w), conv_layer_params, activation)
        elif kind == "nature_cnn":
            layers = _conv_stack(c, (h, w), [(32, 8, 4), (64, 4, 2), (64, 3, 1)], activation)
        elif kind == "minatar_cnn":
            layers = _conv_stack(c, (h, w), [(16, 3, 1)], activation)
        elif kind == "impala":
            layers = [_impala_stage(c, 16), _impala_stage(16, 32), _impala_stage(32, 32),
                      nn.ReLU()]
        else:
            raise ValueError(f"unknown encoder {kind!r}; known: {', '.join(ENCODERS)}")
        self.body = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            self.output_size = int(self.body(torch.zeros(1, c, h, w)).shape[-1])
        # The first convolution (a tuple: not registered twice): its dtype is the input's
        # (bfloat16 during a bfloat16 update, see algorithms.precision).
        self._first = (next(m for m in self.body.modules() if isinstance(m, nn.Conv2d)),)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(compute_input(self.input(x), self._first[0].weight))


def make_encoder(shape: Sequence[int], kind: str = "mlp", layout: str = "auto",
                 conv_layer_params=None, activation=nn.ReLU) -> nn.Module:
    """The encoder ``kind`` for observations of ``shape``; it has an ``output_size``."""
    if kind == "mlp" and not conv_layer_params:
        return Flatten(shape)
    return ConvEncoder(shape, kind, layout, conv_layer_params, activation)
