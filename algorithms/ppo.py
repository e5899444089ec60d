"""Proximal Policy Optimization (Schulman et al. 2017), clipped surrogate objective.

``train_on`` takes a time-major on-policy unroll ``[T, B]`` whose ``rollout_info`` holds the
rollout ``log_prob`` and ``value``. Advantages (GAE) and returns are computed once from the
rollout values (ALF's ``PPOAlgorithm.preprocess``); the last row only bootstraps. Then
``num_epochs`` passes of shuffled mini-batches minimize::

    ratio   = exp(log pi(a|s) - log pi_old(a|s))
    L_CLIP  = -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)
    loss    = L_CLIP + td_loss_weight * (returns - V(s))^2 - entropy_regularization * H

With ``learning_rate_anneal_steps`` the learning rate falls linearly from ``learning_rate`` to 0
over that many trained env steps (counted here, in ``trained_env_steps``, so it is checkpointed
and a restarted learner resumes the schedule). ``orthogonal_init`` initializes every layer as
the PPO implementation study (Andrychowicz et al. 2021; Huang et al. 2022, "37 implementation
details") found to matter: orthogonal weights with gain sqrt(2), zero biases, gain 0.01 on the
policy head (near-uniform first policy) and 1 on the value head.

With ``rnn_size`` the policy is recurrent: GRU cells between the encoder and the heads, one for
the actor and one for the value network (:class:`RecurrentCores`), their hidden state carried
per environment by whoever acts (``get_initial_state``, ``AlgStep.state``) and zeroed at each
episode's FIRST step. ``rollout_step`` stores the state it started from in
``rollout_info["state"]``; training re-runs the GRU over each environment's rows from the state
of the unroll's first row (backpropagation through the unroll, no burn-in), so mini-batches are
whole environment columns, ``mini_batch_size // T`` of them (at least one).
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from algorithms.base import RLAlgorithm, _scalars, train_staged
from algorithms.config_core import PpoConfig
from algorithms.data import AlgStep, Experience, LossInfo, StepType, TimeStep, TrainResult
from algorithms.losses import PPOLoss, advantages_and_returns
from algorithms.networks import (
    ActorDistributionNetwork,
    ValueNetwork,
    actor_critic_trunk,
    distribution_mode,
)
from algorithms.value_ops import valid_mask

_RENAME = {"pg_loss": "loss/pg", "td_loss": "loss/td"}
ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


def orthogonal_init_(network: nn.Module, head_gain: float | None = None) -> None:
    """Orthogonal weights (gain sqrt(2)) and zero biases on every conv and linear layer of
    ``network``, then gain ``head_gain`` on its ``head`` if given (see the module doc)."""
    with torch.no_grad():
        for m in network.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                nn.init.orthogonal_(m.weight, math.sqrt(2))
                nn.init.zeros_(m.bias)
        if head_gain is not None:
            nn.init.orthogonal_(network.head.weight, head_gain)


def _zeroed_at(first: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """``state [B, H]`` with the rows of envs whose episode starts here (``first [B]``) zeroed."""
    return torch.where(first[:, None], torch.zeros_like(state), state)


class RecurrentCores(nn.Module):
    """A GRU cell for the actor and one for the value network, their states side by side in
    one ``[B, 2 * size]`` tensor (so whoever acts keeps one state per env).

    Why two (SB3's ``enable_critic_lstm``): through one shared cell the value loss's gradient,
    clipped together with the policy's (``max_grad_norm``), left the policy's too small to
    move it off uniform for tens of thousands of env steps."""

    def __init__(self, input_size: int, size: int):
        super().__init__()
        self.size, self.hidden_size = size, 2 * size
        self.actor = nn.GRUCell(input_size, size)
        self.value = nn.GRUCell(input_size, size)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.actor(x, h[:, :self.size]), self.value(x, h[:, self.size:])], 1)


class PPOAlgorithm(RLAlgorithm):
    """PPO for discrete or continuous actions; hyperparameters: see :class:`PpoConfig` (the
    options are described in the module doc)."""

    _policy_modules = ("encoding_network", "actor_network", "value_network")

    def __init__(self, observation_space, action_space, config: PpoConfig, device="cpu"):
        super().__init__(observation_space, action_space, config, device)
        c = config
        rnn_size = c.rnn_size
        shared_encoder_fc_layer_params = c.shared_encoder_fc_layer_params
        act = ACTIVATIONS[c.activation]
        if rnn_size is not None and shared_encoder_fc_layer_params is None:
            shared_encoder_fc_layer_params = []  # the GRU takes one feature vector
        self.encoding_network, heads_in, heads_kwargs = actor_critic_trunk(
            self.input_space, shared_encoder_fc_layer_params, self.net_kwargs, act)
        self.rnn = None
        if rnn_size is not None:
            self.rnn = RecurrentCores(heads_in.shape[0], rnn_size)
            heads_in = gym.spaces.Box(-np.inf, np.inf, (rnn_size,), np.float32)
            self._policy_modules = (*type(self)._policy_modules, "rnn")
        self.actor_network = ActorDistributionNetwork(
            heads_in, action_space, c.actor_fc_layer_params, activation=act,
            continuous_projection="normal", init_std=c.init_std, last_layer_scale=0.01,
            **heads_kwargs)
        self.value_network = ValueNetwork(heads_in, c.value_fc_layer_params, activation=act,
                                          **heads_kwargs)
        if c.orthogonal_init:
            orthogonal_init_(self.encoding_network)
            orthogonal_init_(self.actor_network, 0.01)
            orthogonal_init_(self.value_network, 1.0)
        self.gamma, self.td_lambda = c.gamma, c.td_lambda
        self.loss = PPOLoss(importance_ratio_clipping=c.importance_ratio_clipping,
                            log_prob_clipping=c.log_prob_clipping,
                            normalize_advantages=c.normalize_advantages,
                            advantage_clip=c.advantage_clip,
                            entropy_regularization=c.entropy_regularization,
                            td_loss_weight=c.td_loss_weight)
        self.num_epochs, self.mini_batch_size = c.num_epochs, c.mini_batch_size
        self.learning_rate = c.learning_rate
        self.learning_rate_anneal_steps = c.learning_rate_anneal_steps
        self.register_buffer("trained_env_steps", torch.zeros((), dtype=torch.int64))
        self.to(self.device)
        self._add_optimizer("ac", self.parameters(), c.learning_rate, eps=1e-5)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Checkpoints written before the schedule existed have no counter: start it at 0.
        state_dict.setdefault(prefix + "trained_env_steps",
                              torch.zeros((), dtype=torch.int64))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def current_learning_rate(self) -> float:
        """The learning rate of the next update (the schedule at ``trained_env_steps``)."""
        if not self.learning_rate_anneal_steps:
            return self.learning_rate
        done = int(self.trained_env_steps) / self.learning_rate_anneal_steps
        return self.learning_rate * max(0.0, 1.0 - done)

    @classmethod
    def rollout_info_spec(cls, config, observation_space, action_space) -> dict:
        """What ``rollout_step`` keeps of each step for training (:mod:`algorithms.schema`):
        the action's log-probability, the value, and a recurrent policy's starting state
        (the actor's and the value's cells side by side)."""
        from algorithms.schema import FieldSpec

        spec = {"log_prob": FieldSpec((), "float32"), "value": FieldSpec((), "float32")}
        if config.rnn_size is not None:
            spec["state"] = FieldSpec((2 * config.rnn_size,), "float32")
        return spec

    def get_initial_state(self, batch_size: int):
        """The GRU's zero state ``[batch_size, rnn_size]``, or ``()`` when feed-forward."""
        if self.rnn is None:
            return ()
        return torch.zeros(batch_size, self.rnn.hidden_size, device=self.device)

    def _recur(self, features: torch.Tensor, step_type, state):
        """One step of the recurrent core: ``(heads' input, new state, the state it started
        from)``; the state is zeroed where an episode starts. Feed-forward: the features."""
        if self.rnn is None:
            return features, state, None
        if not isinstance(state, torch.Tensor):  # a caller that keeps no state: zeros
            state = self.get_initial_state(features.shape[0])
        start = _zeroed_at(torch.as_tensor(step_type, device=self.device) == StepType.FIRST,
                           state)
        h = self.rnn(features, start)
        return h, h, start

    def _actor_in(self, core: torch.Tensor) -> torch.Tensor:
        return core if self.rnn is None else core[:, :self.rnn.size]

    def _value_in(self, core: torch.Tensor) -> torch.Tensor:
        return core if self.rnn is None else core[:, self.rnn.size:]

    @torch.no_grad()
    def predict_step(self, time_step: TimeStep, state=()) -> AlgStep:
        features = self.encoding_network(self._policy_input(time_step))
        core, state, _ = self._recur(features, time_step.step_type, state)
        return AlgStep(output=distribution_mode(self.actor_network(self._actor_in(core))),
                       state=state, info={})

    @torch.no_grad()
    def rollout_step(self, time_step: TimeStep, state=()) -> AlgStep:
        obs = self._policy_input(time_step)
        core, state, start = self._recur(self.encoding_network(obs), time_step.step_type, state)
        dist = self.actor_network(self._actor_in(core))
        action = dist.sample()
        self._count_env_steps(obs.shape[0])
        info = {"log_prob": dist.log_prob(action), "value": self.value_network(self._value_in(core))}
        if start is not None:
            info["state"] = start
        return AlgStep(output=action, state=state, info=info)

    def train_step(self, experience: Experience, state=()) -> AlgStep:
        """A flat mini-batch ``[N]`` of ``observation``, ``action`` and ``rollout_info``
        (``log_prob``, ``advantages``, ``returns``)."""
        exp = experience
        features = self.encoding_network(exp.observation)
        dist = self.actor_network(features)
        return AlgStep(info={
            "log_prob": dist.log_prob(exp.action), "entropy": dist.entropy(),
            "value": self.value_network(features), "rollout": exp.rollout_info})

    def _train_columns(self, exp: Experience, keep: torch.Tensor, targets: dict,
                       cols: torch.Tensor) -> dict:
        """The recurrent ``train_step``: the GRU re-run over rows ``0..T-1`` of env columns
        ``cols`` from the state their first row started from, then the heads on the rows
        that have a transition (``keep``)."""
        obs = exp.observation[:-1, cols]
        T, n = obs.shape[:2]
        features = self.encoding_network(obs.flatten(0, 1)).view(T, n, -1)
        first = exp.step_type[:-1, cols] == StepType.FIRST
        h = exp.rollout_info["state"][0, cols]
        outputs = []
        for t in range(T):
            h = self.rnn(features[t], _zeroed_at(first[t], h))
            outputs.append(h)
        mask = keep[:, cols].flatten()
        core = torch.stack(outputs).flatten(0, 1)[mask]
        dist = self.actor_network(self._actor_in(core))
        action = exp.action[:-1, cols].flatten(0, 1)[mask]
        return {"log_prob": dist.log_prob(action), "entropy": dist.entropy(),
                "value": self.value_network(self._value_in(core)),
                "rollout": {k: v[:, cols].flatten(0, 1)[mask] for k, v in targets.items()}}

    def _mini_batches(self, exp: Experience, keep: torch.Tensor, targets: dict):
        """``(epoch, step)``: ``epoch()`` yields one epoch's shuffled mini-batches and
        ``step(mini_batch)`` is their ``train_step`` info. Feed-forward: mini-batches of
        ``mini_batch_size`` rows; recurrent: of whole env columns (see the module doc)."""
        if self.rnn is not None:
            T, B = keep.shape
            per_batch = max(1, self.mini_batch_size // T)

            def columns():
                perm = torch.randperm(B, device=self.device)
                yield from (perm[i:i + per_batch] for i in range(0, B, per_batch))

            return columns, lambda cols: self._train_columns(exp, keep, targets, cols)
        flat_keep = keep.flatten()
        flat = lambda x: x.flatten(0, 1)[flat_keep]  # noqa: E731
        data = Experience(observation=flat(exp.observation[:-1]), action=flat(exp.action[:-1]),
                          rollout_info={k: flat(v) for k, v in targets.items()})
        n = int(flat_keep.sum())

        def rows():
            perm = torch.randperm(n, device=self.device)
            for start in range(0, n, self.mini_batch_size):
                idx = perm[start:start + self.mini_batch_size]
                yield Experience(observation=data.observation[idx], action=data.action[idx],
                                 rollout_info={k: v[idx] for k, v in data.rollout_info.items()})

        return rows, lambda mb: self.train_step(mb).info

    def calc_loss(self, info) -> LossInfo:
        r = info["rollout"]
        return self.loss(info["log_prob"], r["log_prob"], r["advantages"], r["returns"],
                         info["value"], info["entropy"])

    def train_on(self, experience: Experience, importance_weights=None) -> TrainResult:
        """``experience``: time-major unroll ``[T, B]``; trains on rows ``0..T-2``."""
        return train_staged(self.train_in_stages(experience, importance_weights))

    def train_in_stages(self, experience: Experience, importance_weights=None):
        """:meth:`train_on` pausing after every epoch but the last (see the base class)."""
        exp = self._experience(experience)
        info = exp.rollout_info
        adv, ret = advantages_and_returns(exp.step_type, exp.reward, exp.discount,
                                          info["value"], self.gamma, self.td_lambda)
        keep = valid_mask(exp.step_type).bool()
        epoch, step = self._mini_batches(exp, keep, {
            "log_prob": info["log_prob"][:-1], "advantages": adv, "returns": ret})
        lr = self.current_learning_rate()
        for opt in self.optimizers.values():
            for group in opt.param_groups:
                group["lr"] = lr
        # Metrics stay on the device until the end: one host copy per train_on, not one per
        # metric and mini-batch.
        sums: dict[str, torch.Tensor] = {}
        count = 0
        for e in range(self.num_epochs):
            if e:
                yield  # between epochs: the network is the policy after e of them
            for mb in epoch():
                with self.training_precision():
                    loss_info = self.calc_loss(step(mb))
                total = self._apply_gradient(loss_info)
                for k, v in {"loss/total": total, **loss_info.extra}.items():
                    if isinstance(v, torch.Tensor):
                        v = v.detach().float().mean()
                        sums[k] = sums[k] + v if k in sums else v
                count += 1
        # Env steps of this unroll: every row but the bootstrap row, LAST rows included.
        self.trained_env_steps += (exp.step_type.shape[0] - 1) * exp.step_type.shape[1]
        metrics = {_RENAME.get(k, k): v for k, v in
                   _scalars({k: v / max(count, 1) for k, v in sums.items()}).items()}
        metrics["learning_rate"] = lr
        return TrainResult(metrics, None)
