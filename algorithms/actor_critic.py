"""Advantage actor-critic (A2C; Mnih et al. 2016, synchronous).

``train_on`` takes a time-major on-policy unroll ``[T, B]``; the last row only bootstraps.
One gradient step per unroll on::

    A    = discounted_return - V(s)          (or GAE with use_gae)
    loss = -A * log pi(a|s) + td_loss_weight * (return - V(s))^2 - entropy_regularization * H
"""

from __future__ import annotations

import torch
from torch import nn

from algorithms.base import RLAlgorithm
from algorithms.config_core import A2cConfig
from algorithms.data import AlgStep, Experience, LossInfo, TimeStep
from algorithms.losses import ActorCriticLoss
from algorithms.networks import (
    ActorDistributionNetwork,
    ValueNetwork,
    actor_critic_trunk,
    distribution_mode,
)


class ActorCriticAlgorithm(RLAlgorithm):
    """A2C for discrete or continuous actions; hyperparameters: see :class:`A2cConfig`."""

    _policy_modules = ("encoding_network", "actor_network")

    def __init__(self, observation_space, action_space, config: A2cConfig, device="cpu"):
        super().__init__(observation_space, action_space, config, device)
        c = config
        self.encoding_network, heads_in, heads_kwargs = actor_critic_trunk(
            self.input_space, c.shared_encoder_fc_layer_params, self.net_kwargs)
        self.actor_network = ActorDistributionNetwork(
            heads_in, action_space, c.actor_fc_layer_params, activation=nn.Tanh,
            continuous_projection="normal", init_std=c.init_std, last_layer_scale=0.01,
            **heads_kwargs)
        self.value_network = ValueNetwork(heads_in, c.value_fc_layer_params,
                                          activation=nn.Tanh, **heads_kwargs)
        self.loss = ActorCriticLoss(gamma=c.gamma, use_gae=c.use_gae, td_lambda=c.td_lambda,
                                    use_td_lambda_return=c.use_td_lambda_return,
                                    normalize_advantages=c.normalize_advantages,
                                    advantage_clip=c.advantage_clip,
                                    entropy_regularization=c.entropy_regularization,
                                    td_loss_weight=c.td_loss_weight)
        self.to(self.device)
        self._add_optimizer("ac", self.parameters(), c.learning_rate)

    @torch.no_grad()
    def predict_step(self, time_step: TimeStep, state=()) -> AlgStep:
        dist = self.actor_network(self.encoding_network(self._policy_input(time_step)))
        return AlgStep(output=distribution_mode(dist), state=state, info={})

    @torch.no_grad()
    def rollout_step(self, time_step: TimeStep, state=()) -> AlgStep:
        obs = self._policy_input(time_step)
        self._count_env_steps(obs.shape[0])
        dist = self.actor_network(self.encoding_network(obs))
        return AlgStep(output=dist.sample(), state=state, info={})

    def train_step(self, experience: Experience, state=()) -> AlgStep:
        """``experience``: time-major unroll ``[T, B]``."""
        exp = experience
        T, B = exp.step_type.shape[:2]
        features = self.encoding_network(exp.observation.flatten(0, 1))
        dist = self.actor_network(features)
        action = exp.action.flatten(0, 1)
        return AlgStep(info={
            "exp": exp, "value": self.value_network(features).view(T, B),
            "log_prob": dist.log_prob(action).view(T, B), "entropy": dist.entropy().view(T, B)})

    def calc_loss(self, info) -> LossInfo:
        exp = info["exp"]
        li = self.loss(exp.step_type, exp.reward, exp.discount, info["value"], info["log_prob"],
                       info["entropy"])
        rename = {"pg_loss": "loss/pg", "td_loss": "loss/td"}
        extra = {rename.get(k, k): v for k, v in li.extra.items()}
        return li._replace(extra=extra)
