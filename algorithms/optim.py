"""An algorithm's optimizers (:class:`Optimizers`): Adam on torch's fused kernel, without
``torch.optim`` (:class:`FusedAdam`), with per-optimizer gradient clipping.

Why not ``torch.optim.Adam(fused=True)``: every ``torch.optim`` optimizer imports
``torch._dynamo`` when it is built (``_disable_dynamo`` wrappers), 1.1-1.7 s of CPU on this
machine. In a learner node that cost lands on its first update, on the critical path of every
run, while the other nodes are still starting. This class calls the same ATen kernel
(``torch._fused_adam_``) that ``torch.optim.Adam(fused=True)`` calls, so updates are bitwise the
same, and reads and writes the same ``state_dict`` layout, so checkpoints move between the two.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

FUSED_DEVICES = ("cpu", "cuda")


class FusedAdam:
    """Adam (Kingma & Ba) with L2 ``weight_decay``, one fused kernel per bucket of parameters
    that share device, dtype and hyperparameters, across all parameter groups.

    An algorithm with several optimizers (SAC: actor, critic, alpha) declares them as groups of
    one ``FusedAdam``, so an update is one ``step()``: one kernel call where the groups share
    their hyperparameters, instead of one Python ``step`` and kernel per optimizer.
    ``state_dict(group=i)``/``load_state_dict(sd, group=i)`` read and write one group in the
    single-group layout, so per-optimizer checkpoints keep their format.

    params: parameters, or a list of ``{"params": [...], <hyperparameter overrides>}`` groups.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        params = list(params)
        if not params:
            raise ValueError("FusedAdam got an empty parameter list")
        specs = params if isinstance(params[0], dict) else [{"params": params}]
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        self.param_groups = []
        for spec in specs:
            group_params = list(spec["params"])
            if not group_params:
                raise ValueError("FusedAdam got an empty parameter list")
            for p in group_params:
                if p.device.type not in FUSED_DEVICES or not p.is_floating_point():
                    raise ValueError(f"FusedAdam needs floating-point parameters on "
                                     f"{'/'.join(FUSED_DEVICES)}, got {p.dtype} on {p.device}")
            hyper = {**defaults, **{k: v for k, v in spec.items() if k != "params"}}
            hyper["betas"] = tuple(hyper["betas"])
            self.param_groups.append({
                "params": group_params, **hyper, "amsgrad": False, "maximize": False,
                "foreach": None, "capturable": False, "differentiable": False, "fused": True,
                "decoupled_weight_decay": False})
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
        self._cache: tuple | None = None  # see _buckets

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_().zero_()

    def _state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        s = self.state.get(p)
        if s is None:
            s = self.state[p] = {
                "step": torch.zeros((), dtype=torch.float32, device=p.device),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        return s

    @torch.no_grad()
    def step(self) -> None:
        for bucket in self._buckets():
            params, (lr, (beta1, beta2), weight_decay, eps) = bucket[0], bucket[1]
            grads = [p.grad for p in params]
            if all(g is not None for g in grads):
                if bucket[2] is None:
                    bucket[2] = self._bucket_lists(params)
                exp_avgs, exp_avg_sqs, steps, all_steps = bucket[2]
                all_steps.add_(1)
            else:  # only the parameters with a gradient step; the others keep their state
                params = [p for p, g in zip(params, grads, strict=True) if g is not None]
                if not params:
                    continue
                grads = [p.grad for p in params]
                exp_avgs, exp_avg_sqs, steps = self._state_lists(params)
                torch._foreach_add_(steps, 1)
            torch._fused_adam_(
                params, grads, exp_avgs, exp_avg_sqs, [], steps, lr=lr, beta1=beta1,
                beta2=beta2, weight_decay=weight_decay, eps=eps,
                amsgrad=False, maximize=False, grad_scale=None, found_inf=None)

    def _state_lists(self, params: list) -> tuple[list, list, list]:
        """``(exp_avgs, exp_avg_sqs, steps)`` of ``params``, their state made if new."""
        states = [self._state(p) for p in params]
        return ([s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                [s["step"] for s in states])

    def _bucket_lists(self, params: list) -> tuple[list, list, list, torch.Tensor]:
        """:meth:`_state_lists` of a whole bucket, its step counters made views of one tensor,
        returned last: a step adds 1 to all of them in one operation. On a CPU
        ``_foreach_add_`` is a loop of one ``add_`` per tensor, each converting the scalar:
        12-15 µs per step for SAC's 13 and DQN's 6 parameters (A/B in one process: DQN's
        update 1.207 -> 1.190 ms, on 8-unit networks 0.560 -> 0.545 ms)."""
        exp_avgs, exp_avg_sqs, steps = self._state_lists(params)
        all_steps = torch.stack(steps)
        steps = list(all_steps.unbind())
        for p, step in zip(params, steps, strict=True):
            self.state[p]["step"] = step
        return exp_avgs, exp_avg_sqs, steps, all_steps

    def _buckets(self) -> list:
        """``[params, hyperparameters, state lists or None]`` per bucket of parameters that
        share device, dtype and hyperparameters. Built once, and again when a group's
        hyperparameters change (a learning-rate schedule) or its state is loaded: grouping
        the parameters and looking up their state on every update was per-parameter Python
        on the critical path (13 parameters for SAC)."""
        key = tuple((g["lr"], g["betas"], g["weight_decay"], g["eps"], len(g["params"]))
                    for g in self.param_groups)
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        grouped: dict[tuple, list[torch.Tensor]] = {}
        for group in self.param_groups:
            hyper = (group["lr"], group["betas"], group["weight_decay"], group["eps"])
            for p in group["params"]:
                grouped.setdefault((p.device, p.dtype, hyper), []).append(p)
        buckets = [[params, hyper, None] for (_, _, hyper), params in grouped.items()]
        self._cache = (key, buckets)
        return buckets

    def _group(self, group: int | None) -> dict:
        if group is None:
            if len(self.param_groups) != 1:
                raise ValueError("this FusedAdam has several groups: name one (group=i)")
            group = 0
        return self.param_groups[group]

    def state_dict(self, group: int | None = None) -> dict[str, Any]:
        """``torch.optim.Adam``'s single-group layout: state keyed by parameter index."""
        g = self._group(group)
        params = g["params"]
        return {"state": {i: dict(self.state[p]) for i, p in enumerate(params)
                          if p in self.state},
                "param_groups": [{**{k: v for k, v in g.items() if k != "params"},
                                  "params": list(range(len(params)))}]}

    def load_state_dict(self, state_dict: dict[str, Any], group: int | None = None) -> None:
        """Load what this class or ``torch.optim.Adam`` saved for the same parameters."""
        g = self._group(group)
        params = g["params"]
        (saved,) = state_dict["param_groups"]
        if len(saved["params"]) != len(params):
            raise ValueError(f"optimizer state holds {len(saved['params'])} parameters, "
                             f"this optimizer has {len(params)}")
        for key in ("lr", "betas", "eps", "weight_decay"):
            if key in saved:
                g[key] = tuple(saved[key]) if key == "betas" else saved[key]
        for p in params:
            self.state.pop(p, None)
        self._cache = None  # its lists hold the replaced state tensors
        by_id = dict(zip(saved["params"], params, strict=True))
        for key, s in state_dict["state"].items():
            p = by_id[int(key)]
            self.state[p] = {
                "step": torch.as_tensor(s["step"], dtype=torch.float32).to(p.device).clone(),
                "exp_avg": s["exp_avg"].to(p.device, p.dtype).clone(),
                "exp_avg_sq": s["exp_avg_sq"].to(p.device, p.dtype).clone()}


class Optimizers:
    """An algorithm's named Adam optimizers: declared with :meth:`add`, built on first use
    (a process that only acts, the unroller or the evaluator, never allocates their state),
    and stepped together after an update's backward passes, each optimizer's gradients
    clipped to ``max_grad_norm`` (None or 0: no clipping) by their own norm."""

    def __init__(self, max_grad_norm: float | None = None):
        self.max_grad_norm = max_grad_norm
        self._specs: dict[str, tuple[list, float, dict]] = {}
        self._built: dict | None = None  # name -> optimizer (a group of _fused, or Adam)
        self._fused: FusedAdam | None = None

    def add(self, name: str, params, lr: float, **kwargs) -> None:
        """Declare an Adam optimizer over ``params`` (``kwargs``: Adam's other settings)."""
        self._specs[name] = (list(params), lr, kwargs)
        self._built, self._fused = None, None

    @property
    def by_name(self) -> dict:
        """``{name: optimizer}``, built when first needed."""
        if self._built is None:
            self._built, self._fused = _adam(self._specs)
        return self._built

    @property
    def built(self) -> dict:
        """The optimizers if built, else ``{}`` (none has state to keep)."""
        return self._built or {}

    def zero_grad(self) -> None:
        """Before an update's backward passes."""
        optimizers = self.by_name.values()  # built at the first update, with _fused
        if self._fused is not None:
            self._fused.zero_grad(set_to_none=True)
        else:
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)

    def step(self, gradients: torch.Tensor | None = None) -> None:
        """Clipping and one step of every optimizer.

        ``gradients``: every gradient of an algorithm with one optimizer, as the one flat
        tensor their ``.grad`` are views of (:meth:`ReluMlp.gradients`): clipping is then one
        norm and one rescaling over it, not one per parameter and a norm of their norms
        (Adam's own ``grad_scale`` would do the rescaling, but its CPU kernel is ~30 µs slower
        with it than the pass it saves)."""
        optimizers = self.by_name.values()
        if self.max_grad_norm:
            if gradients is not None and len(optimizers) == 1:
                _clip_flat_gradients(gradients, self.max_grad_norm)
            else:
                for opt in optimizers:
                    _clip_grad_norm([p for g in opt.param_groups for p in g["params"]],
                                    self.max_grad_norm)
        if self._fused is not None:
            self._fused.step()
        else:
            for opt in optimizers:
                opt.step()


def _clip_coefficient(total_norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """What ``nn.utils.clip_grad_norm_`` multiplies the gradients by."""
    return (max_norm / (total_norm + 1e-6)).clamp_(max=1.0)


def _clip_flat_gradients(gradients: torch.Tensor, max_norm: float) -> None:
    """:func:`_clip_grad_norm` of gradients that are views of the one tensor ``gradients``."""
    gradients.mul_(_clip_coefficient(torch.linalg.vector_norm(gradients), max_norm))


def _clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> None:
    """``nn.utils.clip_grad_norm_`` (same arithmetic) in three foreach calls, without its
    wrappers and without a host sync."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    if len({(g.device, g.dtype) for g in grads}) > 1:
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        return
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, _clip_coefficient(total, max_norm))


class _Group:
    """One named optimizer that is a parameter group of a shared :class:`FusedAdam`: keeps
    the per-optimizer interface (``param_groups``, ``state_dict``, ``load_state_dict``) and
    checkpoint layout."""

    def __init__(self, optimizer: FusedAdam, index: int):
        self._opt, self._index = optimizer, index

    @property
    def param_groups(self) -> list[dict]:
        return [self._opt.param_groups[self._index]]

    def state_dict(self) -> dict[str, Any]:
        return self._opt.state_dict(group=self._index)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._opt.load_state_dict(state_dict, group=self._index)


def _adam(specs: dict[str, tuple[list, float, dict]]):
    """``({name: optimizer}, shared FusedAdam or None)`` for the declared optimizers.

    Adam on torch's fused kernel where it has one for the parameters' device (CPU and CUDA):
    measured 10-25% faster per update than the default per-tensor loop on the small networks
    here. :class:`FusedAdam` calls that kernel without ``torch.optim``, whose import of
    ``torch._dynamo`` delayed a learner's first update by 1.1-1.7 s. All optimizers are groups
    of one FusedAdam, so an update is one ``step`` (one kernel per bucket of equal
    hyperparameters). Other devices get one ``torch.optim.Adam`` per optimizer."""
    params = [p for ps, _, _ in specs.values() for p in ps]
    if all(p.device.type in FUSED_DEVICES and p.is_floating_point() for p in params):
        fused = FusedAdam([{"params": ps, "lr": lr, **kw} for ps, lr, kw in specs.values()])
        return {name: _Group(fused, i) for i, name in enumerate(specs)}, fused
    return {name: torch.optim.Adam(ps, lr=lr, **kw) for name, (ps, lr, kw) in specs.items()}, None
