"""A ReLU MLP's forward and backward pass written out as matrix products, without autograd.

Why: DQN's update on CartPole (a 256x256 Q network, 64 samples) is bound by the cost of each
tensor operation, not by its arithmetic alone. Through autograd every forward operation also
records a graph node, and the backward pass walks those nodes through the engine, with the
views, transposes and accumulations it needs; written out, the backward pass of a ReLU MLP is
two products, a sum and a mask per layer. The online network's forward pass on ``s`` (the
trained rows) and on ``s'`` (the double-Q chooser) also becomes one product over both, where
autograd would have run the backward pass over the chooser's rows too. Measured in
``bench/updates.py`` (DQN, one thread, same batch): see ``docs/benchmarks.md``.

Only for networks this module reads exactly (:meth:`ReluMlp.of`): a flatten encoder, Linear
layers with ReLU between them, and a linear output layer. Anything else keeps autograd.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from algorithms.encoders import Flatten
from algorithms.networks import EncodingNetwork


class ReluMlp:
    """``flatten -> (Linear -> ReLU) x n -> Linear`` of a network built by
    :mod:`algorithms.networks`, run without autograd: call it under ``torch.no_grad()``
    (once around the whole update; a decorator on each method cost ~3 µs a call).

    The layers are read from the network's modules at every call (not their tensors kept),
    so a checkpoint loaded with ``assign=True`` is seen."""

    def __init__(self, flatten: Flatten, layers: list[nn.Linear]):
        self.flatten, self.layers = flatten, layers
        self._flat: torch.Tensor | None = None  # every parameter's gradient, see gradients()
        self._views: list[torch.Tensor] = []

    @classmethod
    def of(cls, network: nn.Module) -> ReluMlp | None:
        """The MLP of ``network`` (an ``encoder`` and a ``head``), or None if it is another
        shape: a conv encoder, another activation, a non-linear head."""
        encoder, head = getattr(network, "encoder", None), getattr(network, "head", None)
        if not isinstance(encoder, EncodingNetwork) or not isinstance(head, nn.Linear):
            return None
        body, fc = encoder._body[0], encoder._fc
        linears, activations = list(fc[0::2]), list(fc[1::2])
        if type(body) is not Flatten or len(linears) != len(activations) \
                or any(type(a) is not nn.ReLU for a in activations) \
                or any(type(layer) is not nn.Linear for layer in linears):
            return None
        return cls(body, [*linears, head])

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``(output, inputs)``: the network's output on ``obs`` and each layer's input (the
        flattened observation, then every hidden activation), which :meth:`backward` reads."""
        h = self.flatten.forward(obs)  # the module without its call machinery
        inputs = [h]
        for layer in self.layers[:-1]:
            h = torch.relu_(F.linear(h, layer.weight, layer.bias))
            inputs.append(h)
        head = self.layers[-1]
        return F.linear(h, head.weight, head.bias), inputs

    def backward(self, inputs: list[torch.Tensor], grad_output: torch.Tensor) -> None:
        """Set every parameter's ``.grad`` to the gradient of a loss whose gradient with
        respect to the output is ``grad_output [rows, out]``, through the first ``rows`` rows
        of the :meth:`forward` that gave ``inputs`` (the other rows had no gradient). The
        gradients are written into :meth:`gradients`, whose views they are."""
        views = self._gradient_views()
        rows = grad_output.shape[0]
        g = grad_output
        for i in range(len(self.layers) - 1, -1, -1):
            layer, x = self.layers[i], inputs[i][:rows]
            _weight_gradient(g, x, views[2 * i])
            torch.sum(g, 0, out=views[2 * i + 1])
            if i:  # through the ReLU whose output is ``x``: autograd's own ReLU backward
                g = torch.ops.aten.threshold_backward(g.mm(layer.weight), x, 0)

    def gradients(self) -> torch.Tensor | None:
        """Every parameter's gradient as the last :meth:`backward` wrote them, in one flat
        tensor of which the parameters' ``.grad`` are views (None before the first): the
        norm for clipping is one operation over it, not one per parameter and a second over
        their norms."""
        return self._flat

    def parameters(self) -> list[nn.Parameter]:
        """Weight and bias of each layer, in order."""
        return [t for layer in self.layers for t in (layer.weight, layer.bias)]

    def _gradient_views(self) -> list[torch.Tensor]:
        """The ``.grad`` of each parameter as a view of one flat tensor, made again where a
        parameter's ``.grad`` is not its view any more (gradients zeroed to None, parameters
        replaced by a checkpoint loaded with ``assign=True``)."""
        params = self.parameters()
        if len(self._views) == len(params) and \
                all(p.grad is v for p, v in zip(params, self._views, strict=True)):
            return self._views
        first = params[0]
        self._flat = torch.empty(sum(p.numel() for p in params), device=first.device,
                                 dtype=first.dtype)
        self._views, offset = [], 0
        for p in params:
            view = self._flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
            p.grad = view
            self._views.append(view)
        return self._views


def _weight_gradient(g: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> None:
    """``out = g.T @ x`` (``[out, in]``). A layer with more outputs than inputs (the first one
    of CartPole's network: 4 -> 256) gets it as ``(x.T @ g).T``: on this CPU the product with
    the small dimension innermost is 2-3x slower (21 against 9 µs, transposed copy included)."""
    if g.shape[1] <= x.shape[1]:
        torch.mm(g.t(), x, out=out)
    else:
        out.copy_(x.t().mm(g).t())
