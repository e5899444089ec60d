"""The policy's tensors for the wire: one flat array per dtype, and a fingerprint of the layout.

Why: a learner publishes its policy after every update (SAC's actor: 262 KiB in eight
tensors). Taking a state dict, copying each tensor and encoding each array is Python work that
right after an update runs with cold caches: measured in the SAC graph it took ~0.4 of the
learner's ~8 ms per update. One concatenation per dtype, and one array per dtype on the wire,
cost a fraction of that; the receiver (the unroller loads parameters before every step) copies
views of the flat array into its tensors with one foreach copy instead of ``load_state_dict``'s
per-key checks.

Both ends build the policy from the same algorithm config, so they agree on the layout (names,
dtypes, shapes, in state-dict order); ``layout`` is its fingerprint, and a packed policy whose
fingerprint differs is refused. The tensors are looked up once and re-checked by identity at
every call, so a module whose tensors were replaced is looked up again, never copied stale.
"""

from __future__ import annotations

import zlib

import torch
from torch import nn

from algorithms.data import to_tensor

LAYOUT_KEY = "layout"


class PolicyPack:
    """An algorithm's policy: what ``predict_step``/``rollout_step`` need (``modules``: prefix
    -> module; the prefix is the attribute name), exported as a state dict or packed, and
    loaded from either."""

    def __init__(self, modules: dict[str, nn.Module]):
        self.modules = modules
        self._entries: list[tuple[dict, str, torch.Tensor]] = []
        # dtype name -> its tensors, in layout order, and their sizes (the flat array's split)
        self._groups: list[tuple[str, list[torch.Tensor], list[int]]] = []
        self.fingerprint = 0

    def _current(self) -> None:
        if not self._entries or any(owner.get(key) is not t for owner, key, t in self._entries):
            self._look_up()

    def _look_up(self) -> None:
        entries, layout = [], []
        groups: dict[str, list[torch.Tensor]] = {}
        for prefix, module in self.modules.items():
            for name, m in module.named_modules(prefix=prefix):
                for owner, key in _own_state(m):
                    t = owner[key]
                    entries.append((owner, key, t))
                    layout.append(f"{name}.{key}:{t.dtype}:{tuple(t.shape)}")
                    groups.setdefault(str(t.dtype).removeprefix("torch."), []).append(t)
        self._entries = entries
        self._groups = [(dtype, ts, [t.numel() for t in ts]) for dtype, ts in groups.items()]
        self.fingerprint = zlib.crc32(";".join(layout).encode())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Flat ``{prefix.name: CPU tensor}`` of the modules' state, each a copy."""
        return {f"{prefix}.{k}": v.detach().to("cpu", copy=True)
                for prefix, module in self.modules.items()
                for k, v in module.state_dict().items()}

    def load(self, params: dict) -> None:
        """Load what :meth:`state_dict` (tensors or numpy arrays) or :meth:`pack` made."""
        if is_packed(params):
            self.unpack(params)
            return
        for prefix, module in self.modules.items():
            head = f"{prefix}."
            module.load_state_dict({k[len(head):]: to_tensor(v) for k, v in params.items()
                                    if k.startswith(head)})

    @torch.no_grad()
    def pack(self) -> dict:
        """``{"layout": fingerprint, dtype name: flat CPU tensor, ...}``: a copy, taken now."""
        self._current()
        out: dict = {LAYOUT_KEY: self.fingerprint}
        for dtype, tensors, _ in self._groups:
            out[dtype] = torch.cat([t.reshape(-1) for t in tensors]).cpu()
        return out

    @torch.no_grad()
    def unpack(self, packed: dict) -> None:
        """Copy a :meth:`pack` result (tensors or the numpy arrays a message carries) into
        the modules' tensors."""
        self._current()
        if packed.get(LAYOUT_KEY) != self.fingerprint:
            raise ValueError(f"packed policy has layout {packed.get(LAYOUT_KEY)}, this policy "
                             f"{self.fingerprint}: sender and receiver were built from "
                             f"different algorithm configs")
        for dtype, tensors, sizes in self._groups:
            flat = to_tensor(packed[dtype], tensors[0].device)
            if flat.numel() != sum(sizes):
                raise ValueError(f"packed policy's {dtype} array has {flat.numel()} values, "
                                 f"the policy {sum(sizes)}")
            torch._foreach_copy_(tensors, [v.view(t.shape) for v, t in
                                           zip(flat.split(sizes), tensors, strict=True)])


def _own_state(m: nn.Module) -> list[tuple[dict, str]]:
    """``(dict, key)`` of what ``m.state_dict()`` holds of ``m`` itself: its parameters and
    persistent buffers."""
    return [(m._parameters, k) for k, p in m._parameters.items() if p is not None] + \
        [(m._buffers, k) for k, b in m._buffers.items()
         if b is not None and k not in m._non_persistent_buffers_set]


def is_packed(params: dict) -> bool:
    return LAYOUT_KEY in params
