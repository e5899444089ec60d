"""Implicit Q-learning (Kostrikov, Nair, Levine 2021; ALF's ``IqlAlgorithm``), continuous
actions.

Offline, a critic trained towards ``max_a' Q(s', a')`` is queried at actions the dataset never
took, where it is wrong and nothing corrects it. IQL never asks: every term uses the dataset's
own action. A state value ``V(s)`` is fitted to an upper expectile of the target critics' value
of the dataset action (it approaches the best in-sample action's value as ``expectile`` nears
1), the critics bootstrap from ``V(s')``, and the policy imitates the dataset's actions
weighted by their exponentiated advantage. Training batches are batch-major ``[B, 2]``
windows; row 0 is trained on, row 1 gives ``r``, ``d`` and ``s'``::

    Q_t(s, a)  = min_i Q_target_i(s, a)
    L_V        = |tau - 1(Q_t - V(s) < 0)| * (Q_t - V(s))^2                 (tau: expectile)
    L_Q        = sum_i (r + gamma * d * V(s') - Q_i(s, a))^2
    L_pi       = -min(exp((Q_t - V(s)) / temperature), max_exp_advantage) * log pi(a|s)

Rows whose step is ``LAST`` are masked (no transition leaves them). The policy is a Gaussian
with a state-independent std and a mean squashed into the bounds (not the sample: the
dataset's actions, some of them on the bounds, must have a finite log-probability).
"""

from __future__ import annotations

import copy
import math

import torch
from torch import distributions as td
from torch import nn

from algorithms.base import RLAlgorithm
from algorithms.config_offline import IqlConfig
from algorithms.data import AlgStep, Experience, LossInfo, TimeStep
from algorithms.losses import get_td_error_loss_fn
from algorithms.networks import ActorNetwork, ParallelCriticNetwork, ValueNetwork
from storage.nest import StepType


def expectile_loss(diff: torch.Tensor, expectile: float) -> torch.Tensor:
    """``|expectile - 1(diff < 0)| * diff^2`` element-wise (``diff``: target - prediction)."""
    weight = torch.where(diff < 0, 1.0 - expectile, expectile)
    return weight * diff.square()


def iql_losses(*, q: torch.Tensor, q_target: torch.Tensor, value: torch.Tensor,
               next_value: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor,
               log_prob: torch.Tensor, valid: torch.Tensor, gamma: float, expectile: float,
               temperature: float, max_exp_advantage: float,
               td_error_loss_fn="squared") -> dict[str, torch.Tensor]:
    """IQL's three per-sample losses ``[B]`` (see the module doc), masked by ``valid``.

    ``q``: ``[B, R]`` critics at the dataset action; ``q_target``: ``[B]`` minimum of the
    target critics there; ``value``/``next_value``: ``V(s)``, ``V(s')``; ``reward``,
    ``discount``: of the step that arrived at ``s'``; ``log_prob``: ``log pi(a|s)``. Only
    ``value`` (in ``L_V``), ``q`` (in ``L_Q``) and ``log_prob`` (in ``L_pi``) carry gradients."""
    with torch.no_grad():
        target = reward + gamma * discount * next_value.detach()
        advantage = q_target.detach() - value.detach()
        weight = torch.exp(advantage / temperature).clamp(max=max_exp_advantage)
    value_loss = expectile_loss(q_target.detach() - value, expectile) * valid
    td_loss = get_td_error_loss_fn(td_error_loss_fn)(target[:, None].expand_as(q), q)
    critic_loss = td_loss.sum(-1) * valid
    actor_loss = -weight * log_prob * valid
    return {"value": value_loss, "critic": critic_loss, "actor": actor_loss,
            "advantage": advantage, "weight": weight, "td_error": (target[:, None] - q) *
            valid[:, None]}


class GaussianActor(nn.Module):
    """``N(mu(s), std)``: ``mu`` squashed into the bounds by tanh, a learned log std per
    action dimension, clipped to ``log_std_bounds``."""

    def __init__(self, observation_space, action_space, fc_layer_params, log_std_bounds,
                 **net_kwargs):
        super().__init__()
        self.mean = ActorNetwork(observation_space, action_space, fc_layer_params, **net_kwargs)
        self.log_std = nn.Parameter(torch.zeros(action_space.shape))
        self.log_std_bounds = tuple(log_std_bounds)

    def forward(self, obs) -> td.Distribution:
        std = self.log_std.clamp(*self.log_std_bounds).exp()
        mean = self.mean(obs)
        return td.Independent(td.Normal(mean, std.expand_as(mean), validate_args=False),
                              len(self.log_std.shape), validate_args=False)


class IqlAlgorithm(RLAlgorithm):
    """IQL; hyperparameters: see :class:`IqlConfig`."""

    _policy_modules = ("actor_network",)

    def __init__(self, observation_space, action_space, config: IqlConfig, device="cpu"):
        super().__init__(observation_space, action_space, config, device)
        if self.discrete:
            raise ValueError("iql: continuous (Box) actions only, as ALF's; for discrete "
                             "actions use bc")
        c = config
        self.actor_network = GaussianActor(self.input_space, action_space,
                                           c.actor_fc_layer_params, c.log_std_bounds,
                                           **self.net_kwargs)
        self.critic_networks = ParallelCriticNetwork(
            self.input_space, action_space, c.critic_fc_layer_params, c.num_critic_replicas,
            **self.net_kwargs)
        self.target_critic_networks = copy.deepcopy(self.critic_networks).requires_grad_(False)
        self.value_network = ValueNetwork(self.input_space, c.value_fc_layer_params,
                                          **self.net_kwargs)
        self.mini_batch_length = 2 + self.history_length
        self.to(self.device)
        self._add_optimizer("actor", self.actor_network.parameters(), c.actor_learning_rate)
        self._add_optimizer("critic", self.critic_networks.parameters(), c.critic_learning_rate)
        self._add_optimizer("value", self.value_network.parameters(), c.value_learning_rate)

    # ----- acting -----------------------------------------------------------------------------
    @torch.no_grad()
    def predict_step(self, time_step: TimeStep, state=()) -> AlgStep:
        mean = self.actor_network.mean(self._policy_input(time_step))
        return AlgStep(output=mean, state=state, info={})

    @torch.no_grad()
    def rollout_step(self, time_step: TimeStep, state=()) -> AlgStep:
        """The policy's mean plus ``rollout_noise`` times its std, clipped to the bounds."""
        dist = self.actor_network(self._policy_input(time_step))
        base = dist.base_dist
        action = base.loc + self.config.rollout_noise * base.scale * torch.randn_like(base.loc)
        low = torch.as_tensor(self.action_space.low, device=self.device)
        high = torch.as_tensor(self.action_space.high, device=self.device)
        action = torch.maximum(torch.minimum(action, high), low)
        self._count_env_steps(action.shape[0])
        return AlgStep(output=action, state=state, info={})

    # ----- training ---------------------------------------------------------------------------
    def train_step(self, experience: Experience, state=()) -> AlgStep:
        """``experience``: batch-major ``[B, 2]`` (plus a frame stack's history rows in
        front): the last two rows are ``s`` and ``s'``."""
        exp = experience
        obs, next_obs = exp.observation[:, -2], exp.observation[:, -1]
        action = exp.action[:, -2]
        with torch.no_grad():
            q_target = self.target_critic_networks(obs, action).min(1).values
            next_value = self.value_network(next_obs)
        return AlgStep(info={
            "q": self.critic_networks(obs, action), "q_target": q_target,
            "value": self.value_network(obs), "next_value": next_value,
            "reward": exp.reward[:, -1], "discount": exp.discount[:, -1],
            "log_prob": self.actor_network(obs).log_prob(action),
            "valid": (exp.step_type[:, -2] != StepType.LAST).float()})

    def calc_loss(self, info) -> LossInfo:
        c = self.config
        losses = iql_losses(**info, gamma=c.gamma, expectile=c.expectile,
                            temperature=c.temperature, max_exp_advantage=c.max_exp_advantage,
                            td_error_loss_fn=c.td_error_loss_fn)
        return LossInfo(
            loss=losses["value"] + losses["critic"] + losses["actor"],
            priority=losses["td_error"].abs().mean(-1).detach(),
            extra={"loss/value": losses["value"].detach(),
                   "loss/critic": losses["critic"].detach(),
                   "loss/actor": losses["actor"].detach(),
                   "iql/advantage": losses["advantage"], "iql/weight": losses["weight"],
                   "q/mean": info["q"].detach(), "v/mean": info["value"].detach(),
                   "policy/log_std": self.actor_network.log_std.detach().clone()})

    def actor_learning_rate(self) -> float:
        """The actor's learning rate for the next update: ``actor_learning_rate``, or its cosine
        decay over ``actor_lr_decay_updates`` (read from the update counter, so a restored
        learner resumes the schedule)."""
        c = self.config
        if not c.actor_lr_decay_updates:
            return c.actor_learning_rate
        done = min(self.num_updates / c.actor_lr_decay_updates, 1.0)
        return c.actor_learning_rate * 0.5 * (1.0 + math.cos(math.pi * done))

    def _step_optimizers(self, gradients=None) -> None:
        if self.config.actor_lr_decay_updates:
            self.optimizers["actor"].param_groups[0]["lr"] = self.actor_learning_rate()
        super()._step_optimizers(gradients)

    def after_update(self, info=None) -> None:
        if self.num_updates % self.config.target_update_period == 0:
            self._soft_update(self.target_critic_networks, self.critic_networks,
                              self.config.target_update_tau)
