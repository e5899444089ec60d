"""An algorithm's training precision (:class:`TrainingPrecision`); bfloat16 updates: the
hidden layers compute with bfloat16 copies of their parameters.

``precision: bfloat16`` runs the hidden layers' products of an update in bfloat16 (twice the
float32 rate on a CPU with AVX512-BF16 or AMX and on recent GPUs); parameters, gradients,
optimizer state, output layers and losses stay float32.

How: before an update's forward pass, :class:`BFloat16Shadows` refreshes a bfloat16 copy of
every hidden-layer parameter from its float32 master in one call and puts the copies in the
modules' place; after the forward pass the masters go back. The backward pass fills the
copies' gradients (bfloat16, as the products give them), and :meth:`gradients_to_masters`
copies them into the masters' float32 gradients in one call before clipping and the optimizer
step. Networks cast their input to their first layer's dtype (:func:`compute_input`) and
output layers cast back to float32 (:func:`algorithms.networks.output_layer`).

Why not ``torch.autocast``: it computes the same values, but casts each weight again in
every forward pass that is not its first (a target network, parameters detached for an actor
loss) and adds a dispatch step to every operation; on SAC's update of 256-unit networks the
casts and that step came to about 1 ms of ~7.5 ms.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
from torch import nn

HIDDEN_LAYERS = (nn.Linear, nn.Conv2d)

# ``precision`` values -> the dtype of an update's hidden-layer products (None: as they are).
TRAINING_PRECISIONS: dict[str, torch.dtype | None] = {
    "float32": None, "bfloat16": torch.bfloat16}


class TrainingPrecision:
    """The precision an algorithm's updates run in (its config's ``precision``).

    ``float32``: nothing changes. ``bfloat16``: mixed precision: the hidden layers' matrix
    products run in bfloat16, twice as fast as float32 on a CPU with AVX512-BF16 or AMX and on
    recent GPUs, which is most of an update of 256-unit networks; parameters, gradients,
    optimizer state, the output layers (values, logits, action means, see
    :func:`algorithms.networks.output_layer`) and the losses stay float32 (how: the module
    docstring). Acting always runs in float32 (one observation: nothing to gain)."""

    def __init__(self, name: str, device: torch.device):
        if name not in TRAINING_PRECISIONS:
            raise ValueError(f"precision: expected one of {', '.join(TRAINING_PRECISIONS)}, "
                             f"got {name!r}")
        self.name, self.device = name, device
        self._checked = False
        self._shadows: BFloat16Shadows | None = None  # made at the first bfloat16 update

    def context(self, module: nn.Module) -> contextlib.AbstractContextManager:
        """The context an update of ``module`` runs its forward pass and loss in."""
        if TRAINING_PRECISIONS[self.name] is None:
            return contextlib.nullcontext()
        if not self._checked:
            self._checked = True
            if native_bfloat16(self.device) is False:
                warnings.warn(f"precision: bfloat16 on {self.device.type} without native "
                              "bfloat16 arithmetic (no AVX512-BF16 or AMX): updates will be "
                              "slower than in float32", RuntimeWarning, stacklevel=3)
        if self._shadows is None or self._shadows.stale():
            self._shadows = BFloat16Shadows(module)
        return self._shadows.active()

    def gradients_to_masters(self) -> None:
        """After an update's backward passes: the bfloat16 copies' gradients to the float32
        parameters (nothing in float32)."""
        if self._shadows is not None:
            self._shadows.gradients_to_masters()


def native_bfloat16(device: torch.device) -> bool | None:
    """Whether ``device`` computes in bfloat16 natively: a GPU that supports it, or a CPU with
    AVX512-BF16 or AMX (Linux's CPU flags); None where that cannot be told."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    if device.type != "cpu":
        return None
    flags = _cpu_flags()
    return None if flags is None else bool(flags & {"avx512_bf16", "amx_bf16"})


def _cpu_flags() -> set[str] | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def hidden_parameters(module: nn.Module) -> list[tuple[nn.Module, str]]:
    """``(owner, name)`` of every hidden-layer parameter under ``module``, each once: weights
    and biases of ``nn.Linear`` and ``nn.Conv2d`` layers (an output layer is a subclass:
    :class:`~algorithms.networks.OutputLinear`), and those a module lists in its
    ``hidden_parameter_slots()`` (a ``ParallelMLP``: its layers but the last)."""
    out: list[tuple[nn.Module, str]] = []
    seen: set[int] = set()
    for layer in module.modules():
        if type(layer) in HIDDEN_LAYERS:
            slots = [(layer, n) for n, _ in layer.named_parameters(recurse=False)]
        else:
            slots = getattr(layer, "hidden_parameter_slots", list)()
        for owner, name in slots:
            param = owner._parameters[name]
            if id(param) not in seen:
                seen.add(id(param))
                out.append((owner, name))
    return out


def compute_input(x: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """``x`` in the dtype of a network's first hidden parameter ``first``: bfloat16 during a
    bfloat16 update, else as it is."""
    return x if x.dtype == first.dtype or not x.is_floating_point() else x.to(first.dtype)


class BFloat16Shadows:
    """bfloat16 copies of ``module``'s hidden-layer parameters (see the module docstring)."""

    def __init__(self, module: nn.Module):
        self.slots = hidden_parameters(module)
        self.masters = [owner._parameters[name] for owner, name in self.slots]
        self.shadows = [m.detach().to(torch.bfloat16).requires_grad_(m.requires_grad)
                        for m in self.masters]
        # The trained ones: their gradients go back to the masters.
        self._trained = [(m, s) for m, s in zip(self.masters, self.shadows, strict=True)
                         if m.requires_grad]
        self._grads = [torch.zeros_like(m) for m, _ in self._trained]

    def stale(self) -> bool:
        """The masters moved to another device since the copies were made."""
        return any(m.device != s.device for m, s in zip(self.masters, self.shadows, strict=True))

    @contextlib.contextmanager
    def active(self):
        """The forward pass of one update: the modules hold the refreshed copies."""
        with torch.no_grad():
            torch._foreach_copy_(self.shadows, self.masters)
        for (owner, name), shadow in zip(self.slots, self.shadows, strict=True):
            owner._parameters[name] = shadow
        try:
            yield
        finally:
            for (owner, name), master in zip(self.slots, self.masters, strict=True):
                owner._parameters[name] = master

    def gradients_to_masters(self) -> None:
        """After ``backward``: each copy's gradient becomes its master's (float32); a master
        whose copy got none keeps none, as a parameter the loss does not reach."""
        got = [(m, s, g) for (m, s), g in zip(self._trained, self._grads, strict=True)
               if s.grad is not None]
        if not got:
            return
        with torch.no_grad():
            torch._foreach_copy_([g for _, _, g in got], [s.grad for _, s, _ in got])
        for master, shadow, grad in got:
            master.grad = grad
            shadow.grad = None
