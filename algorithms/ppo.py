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
"""

from __future__ import annotations

import math

import torch
from torch import nn

from algorithms.base import RLAlgorithm, _scalars
from algorithms.data import AlgStep, Experience, LossInfo, TimeStep, TrainResult
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


class PPOAlgorithm(RLAlgorithm):
    """PPO for discrete or continuous actions.

    actor_fc_layer_params: hidden sizes of the actor.
    value_fc_layer_params: hidden sizes of the value network.
    learning_rate: Adam learning rate (one optimizer for actor and value).
    gamma: discount factor.
    td_lambda: λ of GAE.
    importance_ratio_clipping: epsilon of the clipped objective.
    log_prob_clipping: if > 0, clip log-probs to ``(-c, c)`` in the ratio.
    normalize_advantages: normalize advantages per mini-batch.
    advantage_clip: clip advantages to ``[-x, x]`` if set.
    entropy_regularization: entropy coefficient.
    td_loss_weight: value-loss coefficient.
    num_epochs: passes over each unroll (ALF's ``num_updates_per_train_iter``).
    mini_batch_size: samples per gradient step.
    max_grad_norm: gradient clipping norm (None = off).
    init_std: initial std of the Gaussian policy (continuous actions).
    activation: ``tanh`` or ``relu``, after every hidden layer (conv layers included).
    orthogonal_init: orthogonal initialization (see the module doc); else torch's default,
        with the policy head scaled by 0.01.
    learning_rate_anneal_steps: trained env steps over which the learning rate decays
        linearly to 0 (None = constant).
    shared_encoder_fc_layer_params: None = separate actor and value networks; a list = one
        encoder plus these layers shared by both (see ``actor_critic_trunk``).
    """

    on_policy = True
    _policy_modules = ("encoding_network", "actor_network", "value_network")

    def __init__(self, observation_space, action_space, *, actor_fc_layer_params=(64, 64),
                 value_fc_layer_params=(64, 64), learning_rate: float = 3e-4,
                 gamma: float = 0.99, td_lambda: float = 0.95,
                 importance_ratio_clipping: float = 0.2, log_prob_clipping: float = 0.0,
                 normalize_advantages: bool = True, advantage_clip: float | None = None,
                 entropy_regularization: float = 0.0, td_loss_weight: float = 0.5,
                 num_epochs: int = 4, mini_batch_size: int = 64,
                 max_grad_norm: float | None = 0.5, init_std: float = 1.0,
                 activation: str = "tanh", orthogonal_init: bool = False,
                 learning_rate_anneal_steps: int | None = None, device="cpu",
                 encoder: str = "mlp", image_layout: str = "auto", data_transformers=(),
                 precision: str = "float32", shared_encoder_fc_layer_params=None):
        super().__init__(observation_space, action_space, device, max_grad_norm,
                         encoder=encoder, image_layout=image_layout,
                         data_transformers=data_transformers, precision=precision)
        act = ACTIVATIONS[activation]
        self.encoding_network, heads_in, heads_kwargs = actor_critic_trunk(
            self.input_space, shared_encoder_fc_layer_params, self.net_kwargs, act)
        self.actor_network = ActorDistributionNetwork(
            heads_in, action_space, actor_fc_layer_params, activation=act,
            continuous_projection="normal", init_std=init_std, last_layer_scale=0.01,
            **heads_kwargs)
        self.value_network = ValueNetwork(heads_in, value_fc_layer_params, activation=act,
                                          **heads_kwargs)
        if orthogonal_init:
            orthogonal_init_(self.encoding_network)
            orthogonal_init_(self.actor_network, 0.01)
            orthogonal_init_(self.value_network, 1.0)
        self.gamma, self.td_lambda = gamma, td_lambda
        self.loss = PPOLoss(importance_ratio_clipping=importance_ratio_clipping,
                            log_prob_clipping=log_prob_clipping,
                            normalize_advantages=normalize_advantages,
                            advantage_clip=advantage_clip,
                            entropy_regularization=entropy_regularization,
                            td_loss_weight=td_loss_weight)
        self.num_epochs, self.mini_batch_size = num_epochs, mini_batch_size
        self.learning_rate = learning_rate
        self.learning_rate_anneal_steps = learning_rate_anneal_steps
        self.register_buffer("trained_env_steps", torch.zeros((), dtype=torch.int64))
        self.to(self.device)
        self._add_optimizer("ac", self.parameters(), learning_rate, eps=1e-5)

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

    @torch.no_grad()
    def predict_step(self, time_step: TimeStep, state=()) -> AlgStep:
        dist = self.actor_network(self.encoding_network(self._policy_input(time_step)))
        return AlgStep(output=distribution_mode(dist), state=state, info={})

    @torch.no_grad()
    def rollout_step(self, time_step: TimeStep, state=()) -> AlgStep:
        obs = self._policy_input(time_step)
        features = self.encoding_network(obs)
        dist = self.actor_network(features)
        action = dist.sample()
        self._count_env_steps(obs.shape[0])
        return AlgStep(output=action, state=state, info={
            "log_prob": dist.log_prob(action), "value": self.value_network(features)})

    def train_step(self, experience: Experience, state=()) -> AlgStep:
        """A flat mini-batch ``[N]`` of ``observation``, ``action`` and ``rollout_info``
        (``log_prob``, ``advantages``, ``returns``)."""
        exp = experience
        features = self.encoding_network(exp.observation)
        dist = self.actor_network(features)
        return AlgStep(info={
            "log_prob": dist.log_prob(exp.action), "entropy": dist.entropy(),
            "value": self.value_network(features), "rollout": exp.rollout_info})

    def calc_loss(self, info) -> LossInfo:
        r = info["rollout"]
        return self.loss(info["log_prob"], r["log_prob"], r["advantages"], r["returns"],
                         info["value"], info["entropy"])

    def train_on(self, experience: Experience, importance_weights=None) -> TrainResult:
        """``experience``: time-major unroll ``[T, B]``; trains on rows ``0..T-2``."""
        exp = self._experience(experience)
        info = exp.rollout_info
        adv, ret = advantages_and_returns(exp.step_type, exp.reward, exp.discount,
                                          info["value"], self.gamma, self.td_lambda)
        keep = valid_mask(exp.step_type).flatten().bool()
        flat = lambda x: x[:-1].flatten(0, 1)[keep]  # noqa: E731
        data = Experience(observation=flat(exp.observation), action=flat(exp.action),
                          rollout_info={"log_prob": flat(info["log_prob"]),
                                        "advantages": adv.flatten()[keep],
                                        "returns": ret.flatten()[keep]})
        n = int(keep.sum())
        lr = self.current_learning_rate()
        for opt in self.optimizers.values():
            for group in opt.param_groups:
                group["lr"] = lr
        # Metrics stay on the device until the end: one host copy per train_on, not one per
        # metric and mini-batch.
        sums: dict[str, torch.Tensor] = {}
        count = 0
        for _ in range(self.num_epochs):
            perm = torch.randperm(n, device=self.device)
            for start in range(0, n, self.mini_batch_size):
                idx = perm[start:start + self.mini_batch_size]
                mb = Experience(observation=data.observation[idx], action=data.action[idx],
                                rollout_info={k: v[idx] for k, v in data.rollout_info.items()})
                with self.training_precision():
                    loss_info = self.calc_loss(self.train_step(mb).info)
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
