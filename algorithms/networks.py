"""Networks with ALF's constructor names: encoders, actors, critics, Q and value networks.

Inputs are ``[B, ...]`` (any leading batch dims are flattened and restored by the callers).
Spaces are Gymnasium spaces: ``Box`` observations, ``Discrete`` or bounded ``Box`` actions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
import torch.distributions as td
from torch import nn

from algorithms.encoders import make_encoder
from algorithms.precision import compute_input


def _flat_dim(space: gym.spaces.Space) -> int:
    return int(np.prod(space.shape))


class EncodingNetwork(nn.Module):
    """An observation encoder (:mod:`algorithms.encoders`) followed by fully connected layers.

    input_shape: shape of one observation.
    conv_layer_params: sequence of ``(filters, kernel_size, stride)``: a custom conv stack
        (overrides ``encoder``); None = use ``encoder``.
    fc_layer_params: hidden sizes of the fully connected layers.
    activation: activation class used after every layer.
    encoder: ``mlp`` (flatten), ``nature_cnn``, ``impala`` or ``minatar_cnn``.
    image_layout: ``auto``, ``hwc`` or ``chw`` (see :func:`algorithms.encoders.image_layout`).
    """

    def __init__(self, input_shape: Sequence[int], conv_layer_params=None,
                 fc_layer_params: Sequence[int] = (256, 256), activation=nn.ReLU,
                 encoder: str = "mlp", image_layout: str = "auto"):
        super().__init__()
        body = make_encoder(input_shape, encoder, image_layout, conv_layer_params, activation)
        layers: list[nn.Module] = [body]
        n = body.output_size
        for size in fc_layer_params:
            layers += [nn.Linear(n, size), activation()]
            n = size
        self.net = nn.Sequential(*layers)
        self.output_size = n
        # The encoder and the fully connected layers after it (tuples: not registered twice).
        self._body, self._fc = (layers[0],), tuple(layers[1:])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self._body[0](x)
        if self._fc:
            h = compute_input(h, self._fc[0].weight)
            for layer in self._fc:
                h = layer(h)
        return h


class OutputLinear(nn.Linear):
    """A network's output layer (values, logits, action means): float32 even inside a
    bfloat16 autocast (:meth:`RLAlgorithm.training_precision`). A Q value near 100 has a
    bfloat16 step of 0.5, as large as the TD errors it is trained on; the layer is one small
    product, so computing it in float32 costs nothing worth having."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return output_layer(super().forward, x)


def output_layer(layer, x: torch.Tensor, *args) -> torch.Tensor:
    """``layer(x, *args)`` in float32: ``x`` from bfloat16 hidden layers (see
    :mod:`algorithms.precision`) is cast back, and autocast is off where a caller turned it on."""
    if torch.is_autocast_enabled(x.device.type):
        with torch.autocast(x.device.type, enabled=False):
            return layer(x.float(), *args)
    return layer(x if x.dtype == torch.float32 else x.float(), *args)


def _head(n_in: int, n_out: int, scale: float = 1.0) -> nn.Linear:
    layer = OutputLinear(n_in, n_out)
    if scale != 1.0:
        with torch.no_grad():
            layer.weight.mul_(scale)
            layer.bias.zero_()
    return layer


class QNetwork(nn.Module):
    """``Q(s, .)`` for a ``Discrete`` action space: ``[B, num_actions]``."""

    def __init__(self, observation_space, action_space, fc_layer_params=(256, 256),
                 conv_layer_params=None, activation=nn.ReLU, encoder: str = "mlp",
                 image_layout: str = "auto"):
        super().__init__()
        self.encoder = EncodingNetwork(observation_space.shape, conv_layer_params,
                                       fc_layer_params, activation, encoder, image_layout)
        self.head = _head(self.encoder.output_size, int(action_space.n))

    def forward(self, obs):
        return self.head(self.encoder(obs))


class ValueNetwork(nn.Module):
    """``V(s)``: ``[B]``."""

    def __init__(self, observation_space, fc_layer_params=(256, 256), conv_layer_params=None,
                 activation=nn.ReLU, encoder: str = "mlp", image_layout: str = "auto"):
        super().__init__()
        self.encoder = EncodingNetwork(observation_space.shape, conv_layer_params,
                                       fc_layer_params, activation, encoder, image_layout)
        self.head = _head(self.encoder.output_size, 1)

    def forward(self, obs):
        return self.head(self.encoder(obs)).squeeze(-1)


class CriticNetwork(nn.Module):
    """``Q(s, a)`` for a continuous action: ``[B]``. Observation and action are concatenated
    (ALF's ``joint_fc_layer_params``)."""

    def __init__(self, observation_space, action_space, joint_fc_layer_params=(256, 256),
                 activation=nn.ReLU, encoder: str = "mlp", image_layout: str = "auto"):
        super().__init__()
        self.obs_encoder = make_encoder(observation_space.shape, encoder, image_layout)
        n_in = self.obs_encoder.output_size + _flat_dim(action_space)
        self.encoder = EncodingNetwork((n_in,), None, joint_fc_layer_params, activation)
        self.head = _head(self.encoder.output_size, 1)

    def forward(self, obs, action):
        x = torch.cat([self.obs_encoder(obs), action.flatten(1)], -1)
        return self.head(self.encoder(x)).squeeze(-1)


class ParallelMLP(nn.Module):
    """``num_replicas`` independent MLPs evaluated with one batched matmul per layer.

    ``forward(x [N, in]) -> [N, R, out]``. With ``detach_params=True`` the output carries no
    gradient to the weights (used for actor losses that must not train the critics).
    """

    def __init__(self, n_in: int, hidden: Sequence[int], n_out: int, num_replicas: int,
                 activation=nn.ReLU):
        super().__init__()
        sizes = [n_in, *hidden, n_out]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            bound = 1.0 / math.sqrt(a)  # nn.Linear's default initialization
            self.weights.append(nn.Parameter(torch.empty(num_replicas, a, b).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(num_replicas, 1, b).uniform_(-bound, bound)))
        self.act = activation()
        self.num_replicas = num_replicas

    def hidden_parameter_slots(self) -> list[tuple[nn.Module, str]]:
        """Every layer's weight and bias but the output layer's (:mod:`algorithms.precision`)."""
        n = len(self.weights) - 1
        return [(params, str(i)) for i in range(n) for params in (self.weights, self.biases)]

    def forward(self, x: torch.Tensor, detach_params: bool = False) -> torch.Tensor:
        # The lists' own dicts: indexing a ParameterList costs ~2 µs a layer.
        weights, biases = self.weights._parameters, self.biases._parameters
        h = compute_input(x.unsqueeze(0).expand(self.num_replicas, *x.shape), weights["0"])
        n = len(weights)
        for i in range(n):
            w, b = weights[str(i)], biases[str(i)]
            if detach_params:
                w, b = w.detach(), b.detach()
            if i < n - 1:
                h = self.act(torch.baddbmm(b, h, w))
            else:
                h = output_layer(_parallel_output, h, w, b)
        return h.transpose(0, 1)


def _parallel_output(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if w.shape[-1] == 1:
        # A one-unit layer (a critic's head) as multiply-and-sum: a batched matmul with one
        # output column takes MKL's slow path (~160 µs forward and the same for each gradient
        # at [2, 256, 256], against ~25 µs this way).
        return torch.add(b, (h * w.transpose(1, 2)).sum(-1, keepdim=True))
    return torch.baddbmm(b, h, w)


class ParallelCriticNetwork(nn.Module):
    """``num_replicas`` critics ``Q_i(s, a)`` in one module: ``forward(obs, action) -> [N, R]``."""

    def __init__(self, observation_space, action_space, joint_fc_layer_params=(256, 256),
                 num_replicas: int = 2, activation=nn.ReLU, encoder: str = "mlp",
                 image_layout: str = "auto"):
        super().__init__()
        # One observation encoder shared by the replicas (parameterless for ``mlp``).
        self.obs_encoder = make_encoder(observation_space.shape, encoder, image_layout)
        n_in = self.obs_encoder.output_size + _flat_dim(action_space)
        self.mlp = ParallelMLP(n_in, joint_fc_layer_params, 1, num_replicas, activation)

    def forward(self, obs, action, detach_params: bool = False):
        x = torch.cat([_encode(self.obs_encoder, obs, detach_params), action.flatten(1)], -1)
        return self.mlp(x, detach_params).squeeze(-1)


class ParallelQNetwork(nn.Module):
    """``num_replicas`` Q networks for discrete actions: ``forward(obs) -> [N, R, A]``."""

    def __init__(self, observation_space, action_space, fc_layer_params=(256, 256),
                 num_replicas: int = 2, activation=nn.ReLU, encoder: str = "mlp",
                 image_layout: str = "auto"):
        super().__init__()
        self.obs_encoder = make_encoder(observation_space.shape, encoder, image_layout)
        self.mlp = ParallelMLP(self.obs_encoder.output_size, fc_layer_params,
                               int(action_space.n), num_replicas, activation)

    def forward(self, obs, detach_params: bool = False):
        return self.mlp(_encode(self.obs_encoder, obs, detach_params), detach_params)


def _encode(encoder: nn.Module, obs: torch.Tensor, detach_params: bool) -> torch.Tensor:
    """Shared observation features; without gradient to the encoder when ``detach_params``
    (nothing upstream of the observation needs one)."""
    if detach_params:
        with torch.no_grad():
            return encoder(obs)
    return encoder(obs)


class _ActionScaler(nn.Module):
    """Maps ``[-1, 1]`` to the bounds of a ``Box`` action space and back."""

    def __init__(self, action_space: gym.spaces.Box):
        super().__init__()
        low = torch.as_tensor(action_space.low, dtype=torch.float32)
        high = torch.as_tensor(action_space.high, dtype=torch.float32)
        self.register_buffer("scale", (high - low) / 2)
        self.register_buffer("bias", (high + low) / 2)

    def forward(self, x):
        return x * self.scale + self.bias


class ActorNetwork(nn.Module):
    """Deterministic actor ``mu(s)`` squashed by tanh into the action bounds (DDPG/TD3)."""

    def __init__(self, observation_space, action_space, fc_layer_params=(256, 256),
                 conv_layer_params=None, activation=nn.ReLU, encoder: str = "mlp",
                 image_layout: str = "auto"):
        super().__init__()
        self.encoder = EncodingNetwork(observation_space.shape, conv_layer_params,
                                       fc_layer_params, activation, encoder, image_layout)
        self.head = _head(self.encoder.output_size, _flat_dim(action_space))
        self.scaler = _ActionScaler(action_space)
        self._shape = action_space.shape

    def forward(self, obs):
        a = torch.tanh(self.head(self.encoder(obs)))
        return self.scaler(a).reshape(-1, *self._shape)


_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


class SquashedNormal(td.TransformedDistribution):
    """``Normal(loc, scale)`` squashed by tanh and scaled into ``[low, high]`` (SAC's policy)."""

    def __init__(self, loc, scale, action_scale, action_bias):
        base = td.Independent(td.Normal(loc, scale, validate_args=False), 1,
                              validate_args=False)
        # Not TransformedDistribution.__init__: it derives the shapes with
        # torch.broadcast_shapes, which imports sympy on first use (0.6 s in the first update
        # and the first sampled action of every process). Tanh and an affine map with a
        # per-dimension scale keep the base's shapes, so they are set here directly.
        self.transforms = [td.TanhTransform(cache_size=1),
                           td.AffineTransform(action_bias, action_scale, event_dim=1,
                                              cache_size=1)]
        self.base_dist = base
        td.Distribution.__init__(self, base.batch_shape, base.event_shape, validate_args=False)

    @property
    def mode(self):
        x = self.base_dist.mean
        for t in self.transforms:
            x = t(x)
        return x

    def rsample_and_log_prob(self, eps: torch.Tensor | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterized sample and its log-probability in one pass: what
        ``rsample()`` then ``log_prob()`` compute through the transforms' caches and
        Jacobians, written out (about 20 tensor ops fewer per call; same values up to
        rounding and the same gradients)::

            u = loc + std * eps,  a = tanh(u) * scale + bias
            log pi(a) = sum(-eps^2 / 2 - log std - log sqrt(2 pi)
                            - 2 (log 2 - u - softplus(-2u)) - log scale)

        ``eps``: the standard normal noise, when drawn beforehand (default: drawn here).
        """
        normal = self.base_dist.base_dist
        loc, std = normal.loc, normal.scale
        if eps is None:
            eps = torch.randn_like(loc)
        u = loc + std * eps
        affine = self.transforms[1]
        action = torch.tanh(u) * affine.scale + affine.loc
        log_det = 2.0 * (math.log(2.0) - u - nn.functional.softplus(-2.0 * u))
        log_prob = (-0.5 * eps.square() - std.log() - _LOG_SQRT_2PI - log_det
                    - affine.scale.abs().log()).sum(-1)
        return action, log_prob


class ActorDistributionNetwork(nn.Module):
    """Stochastic actor ``pi(.|s)`` returning a ``torch.distributions.Distribution``.

    ``Discrete`` actions: ``Categorical``. ``Box`` actions: ``continuous_projection`` is
    ``"tanh_normal"`` (state-dependent std, squashed into the bounds; SAC) or ``"normal"``
    (state-independent log-std parameter; PPO/A2C; samples are clipped to the bounds by the
    algorithm, not here).
    """

    def __init__(self, observation_space, action_space, fc_layer_params=(256, 256),
                 conv_layer_params=None, activation=nn.ReLU,
                 continuous_projection: str = "tanh_normal", init_std: float = 1.0,
                 log_std_bounds=(-5.0, 2.0), last_layer_scale: float = 1.0,
                 encoder: str = "mlp", image_layout: str = "auto"):
        super().__init__()
        self.encoder = EncodingNetwork(observation_space.shape, conv_layer_params,
                                       fc_layer_params, activation, encoder, image_layout)
        n = self.encoder.output_size
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.projection = continuous_projection
        self.log_std_bounds = log_std_bounds
        if self.discrete:
            self.head = _head(n, int(action_space.n), last_layer_scale)
        else:
            dim = _flat_dim(action_space)
            self.scaler = _ActionScaler(action_space)
            if continuous_projection == "tanh_normal":
                self.head = _head(n, 2 * dim, last_layer_scale)
            elif continuous_projection == "normal":
                self.head = _head(n, dim, last_layer_scale)
                self.log_std = nn.Parameter(torch.full((dim,), math.log(init_std)))
            else:
                raise ValueError(f"unknown continuous_projection {continuous_projection!r}")

    def forward(self, obs) -> td.Distribution:
        h = self.head(self.encoder(obs))
        if self.discrete:
            return td.Categorical(logits=h, validate_args=False)
        if self.projection == "tanh_normal":
            mean, log_std = h.chunk(2, -1)
            lo, hi = self.log_std_bounds
            log_std = lo + 0.5 * (hi - lo) * (torch.tanh(log_std) + 1)
            return SquashedNormal(mean, log_std.exp(), self.scaler.scale, self.scaler.bias)
        mean = h
        return td.Independent(td.Normal(mean, self.log_std.exp().expand_as(mean),
                                        validate_args=False), 1, validate_args=False)


def distribution_mode(dist: td.Distribution) -> torch.Tensor:
    """Greedy action of a distribution (argmax for categorical, mean/squashed mean else)."""
    if isinstance(dist, td.Categorical):
        return dist.probs.argmax(-1)
    if isinstance(dist, SquashedNormal):
        return dist.mode
    return dist.mean


def actor_critic_trunk(input_space: gym.Space, shared_fc_layer_params, net_kwargs: dict,
                       activation=nn.ReLU):
    """What an actor and a value network sit on: ``(trunk, heads' input space, heads' kwargs)``.

    ``shared_fc_layer_params`` None: no trunk (``nn.Identity``); each network has its own
    encoder. A list: one encoder (``net_kwargs``) plus these ReLU layers, shared by both, as
    CleanRL's Atari PPO does: half the convolutions per step, which is most of the cost of an
    image update on a CPU; the heads then see a feature vector (``mlp``).
    """
    if shared_fc_layer_params is None:
        return nn.Identity(), input_space, net_kwargs
    trunk = EncodingNetwork(input_space.shape, None, shared_fc_layer_params, activation,
                            **net_kwargs)
    features = gym.spaces.Box(-np.inf, np.inf, (trunk.output_size,), np.float32)
    return trunk, features, {"encoder": "mlp", "image_layout": "auto"}
