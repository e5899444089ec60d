"""Behaviour cloning (Pomerleau 1988; ALF's ``BcAlgorithm``): supervised learning of the
dataset's actions, the baseline every offline RL method is measured against.

Training batches are batch-major ``[B, 1]`` single steps (``mini_batch_length`` 1: no target
needs the next step). A stored ``LAST`` step is masked: its action is never executed (the env
resets), so it is no demonstration::

    discrete    loss = -log softmax(logits(s))[a]                 (cross-entropy)
    continuous  loss = sum_k (mu_k(s) - a_k)^2,   mu(s) = tanh(.) into the action bounds

The continuous actor is deterministic, as ALF's is: the squared error fits the dataset's mean
action in each state, and the greedy action is that mean.
"""

from __future__ import annotations

import torch

from algorithms.base import RLAlgorithm
from algorithms.config_offline import BcConfig
from algorithms.data import AlgStep, Experience, LossInfo, TimeStep
from algorithms.networks import ActorNetwork, QNetwork
from storage.nest import StepType


def bc_discrete_loss(logits: torch.Tensor, action: torch.Tensor,
                     valid: torch.Tensor) -> torch.Tensor:
    """Per-sample cross-entropy ``[B]`` of the dataset's actions, zero where not ``valid``."""
    nll = -torch.log_softmax(logits, -1).gather(-1, action[:, None]).squeeze(-1)
    return nll * valid


def bc_continuous_loss(predicted: torch.Tensor, action: torch.Tensor,
                       valid: torch.Tensor) -> torch.Tensor:
    """Per-sample squared error ``[B]`` summed over the action's dimensions, zero where not
    ``valid``."""
    return (predicted - action).square().flatten(1).sum(-1) * valid


class BcAlgorithm(RLAlgorithm):
    """Behaviour cloning; hyperparameters: see :class:`BcConfig`."""

    _policy_modules = ("actor_network",)
    mini_batch_length = 1

    def __init__(self, observation_space, action_space, config: BcConfig, device="cpu"):
        super().__init__(observation_space, action_space, config, device)
        c = config
        if self.discrete:  # logits of each action: a Q network's shape
            self.actor_network = QNetwork(self.input_space, action_space,
                                          c.actor_fc_layer_params, **self.net_kwargs)
        else:
            self.actor_network = ActorNetwork(self.input_space, action_space,
                                              c.actor_fc_layer_params, **self.net_kwargs)
        self.rollout_noise = c.rollout_noise
        self.mini_batch_length = 1 + self.history_length
        self.to(self.device)
        self._add_optimizer("actor", self.actor_network.parameters(), c.actor_learning_rate)

    # ----- acting -----------------------------------------------------------------------------
    @torch.no_grad()
    def predict_step(self, time_step: TimeStep, state=()) -> AlgStep:
        out = self.actor_network(self._policy_input(time_step))
        return AlgStep(output=out.argmax(-1) if self.discrete else out, state=state, info={})

    @torch.no_grad()
    def rollout_step(self, time_step: TimeStep, state=()) -> AlgStep:
        """The greedy action, with ``rollout_noise`` for exploration (a cloned policy acting
        in a hybrid graph)."""
        action = self.predict_step(time_step, state).output
        b = action.shape[0]
        if self.rollout_noise > 0:
            if self.discrete:
                explore = torch.rand(b, device=self.device) < self.rollout_noise
                uniform = torch.randint(0, int(self.action_space.n), (b,), device=self.device)
                action = torch.where(explore, uniform, action)
            else:
                low = torch.as_tensor(self.action_space.low, device=self.device)
                high = torch.as_tensor(self.action_space.high, device=self.device)
                noise = torch.randn_like(action) * self.rollout_noise * (high - low) / 2
                action = torch.maximum(torch.minimum(action + noise, high), low)
        self._count_env_steps(b)
        return AlgStep(output=action, state=state, info={})

    # ----- training ---------------------------------------------------------------------------
    def train_step(self, experience: Experience, state=()) -> AlgStep:
        """``experience``: batch-major ``[B, T]``; the newest row of each window is trained on
        (earlier rows only give a frame stack its history)."""
        obs = experience.observation[:, -1]
        action = experience.action[:, -1]
        valid = (experience.step_type[:, -1] != StepType.LAST).float()
        return AlgStep(info={"output": self.actor_network(obs), "action": action,
                             "valid": valid})

    def calc_loss(self, info) -> LossInfo:
        if self.discrete:
            loss = bc_discrete_loss(info["output"], info["action"].long(), info["valid"])
        else:
            loss = bc_continuous_loss(info["output"], info["action"], info["valid"])
        share = info["valid"].mean().clamp(min=1e-8)
        return LossInfo(loss=loss, priority=loss.detach(), extra={"loss/bc": loss.detach().mean() / share,
                                          "bc/valid_share": share.detach()})
