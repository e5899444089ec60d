"""DDPG (Lillicrap et al. 2015) and, with its options, TD3 (Fujimoto et al. 2018).

TD3 = ``num_critic_replicas=2`` (clipped double Q), ``target_policy_noise`` (target policy
smoothing) and ``actor_update_period=2`` (delayed actor and target updates); ``Td3Config``
sets them. Training batches are batch-major ``[B, T]`` windows (default ``T = 2``)::

    a'        = clip(mu_target(s') + clip(N(0, sigma), -c, c))      (sigma = 0 for DDPG)
    td_target = r + gamma * d * min_i Q_target_i(s', a')
    actor     = -Q_1(s, mu(s))            (critic parameters held fixed)

Noise scales are fractions of the action half-range (the policy acts in ``[-1, 1]``).
"""

from __future__ import annotations

import copy

import torch

from algorithms.base import RLAlgorithm
from algorithms.config_core import DdpgConfig
from algorithms.data import AlgStep, Experience, LossInfo, StepType, TimeStep, to_tensor
from algorithms.losses import TDLoss, critic_td_loss, one_step_window
from algorithms.networks import ActorNetwork, ParallelCriticNetwork


class DdpgAlgorithm(RLAlgorithm):
    """DDPG / TD3 for a bounded ``Box`` action space; hyperparameters: see :class:`DdpgConfig`
    (TD3: :class:`Td3Config`)."""

    _policy_modules = ("actor_network",)

    def __init__(self, observation_space, action_space, config: DdpgConfig, device="cpu"):
        super().__init__(observation_space, action_space, config, device)
        c = config
        assert not self.discrete, "DdpgAlgorithm needs a Box action space"
        assert c.exploration_noise in ("ou", "gaussian"), c.exploration_noise
        self.actor_network = ActorNetwork(self.input_space, action_space,
                                          c.actor_fc_layer_params, **self.net_kwargs)
        self.critic_networks = ParallelCriticNetwork(self.input_space, action_space,
                                                     c.critic_fc_layer_params,
                                                     c.num_critic_replicas, **self.net_kwargs)
        self.target_actor_network = copy.deepcopy(self.actor_network).requires_grad_(False)
        self.target_critic_networks = copy.deepcopy(self.critic_networks).requires_grad_(False)
        self.mini_batch_length = c.mini_batch_length + self.history_length
        self.td_loss = TDLoss(gamma=c.gamma, td_error_loss_fn=c.td_error_loss_fn,
                              td_lambda=c.td_lambda if c.mini_batch_length > 2 else 0.0)
        self.exploration_noise, self.ou_stddev, self.ou_damping = (
            c.exploration_noise, c.ou_stddev, c.ou_damping)
        self.rollout_random_action = c.rollout_random_action
        self.target_policy_noise = c.target_policy_noise
        self.target_policy_noise_clip = c.target_policy_noise_clip
        self.actor_update_period = c.actor_update_period
        self.target_update_tau = c.target_update_tau
        self.target_update_period = c.target_update_period
        self.dqda_clipping = c.dqda_clipping
        self.action_l2 = c.action_l2
        self.initial_random_steps = c.initial_random_steps
        self._ou_state: torch.Tensor | None = None
        self.to(self.device)
        self._add_optimizer("actor", self.actor_network.parameters(), c.actor_learning_rate)
        self._add_optimizer("critic", self.critic_networks.parameters(), c.critic_learning_rate)

    def _normalize(self, a):
        return (a - self.actor_network.scaler.bias) / self.actor_network.scaler.scale

    def _denormalize(self, a):
        return self.actor_network.scaler(a)

    @torch.no_grad()
    def predict_step(self, time_step: TimeStep, state=()) -> AlgStep:
        return AlgStep(output=self.actor_network(self._policy_input(time_step)), state=state,
                       info={})

    @torch.no_grad()
    def rollout_step(self, time_step: TimeStep, state=()) -> AlgStep:
        obs = self._policy_input(time_step)
        b = obs.shape[0]
        a = self._normalize(self.actor_network(obs))
        if self.exploration_noise == "ou":
            if self._ou_state is None or self._ou_state.shape != a.shape:
                self._ou_state = torch.zeros_like(a)
            first = to_tensor(time_step.step_type, self.device) == StepType.FIRST
            self._ou_state[first] = 0.0
            self._ou_state += (-self.ou_damping * self._ou_state
                               + self.ou_stddev * torch.randn_like(a))
            noise = self._ou_state
        else:
            noise = self.ou_stddev * torch.randn_like(a)
        a = (a + noise).clamp(-1.0, 1.0)
        p_random = 1.0 if self.env_steps < self.initial_random_steps \
            else self.rollout_random_action
        if p_random > 0:
            rand = torch.rand(b, device=self.device) < p_random
            a = torch.where(rand[:, None], torch.rand_like(a) * 2 - 1, a)
        self._count_env_steps(b)
        return AlgStep(output=self._denormalize(a), state=state, info={})

    def _actor_turn(self) -> bool:
        return self.num_updates % self.actor_update_period == 0

    def train_step(self, experience: Experience, state=()) -> AlgStep:
        """``experience``: batch-major ``[B, T]``; rows ``0..T-2`` are trained on."""
        return self._train_step(experience, one_step_window(self.td_loss, experience))

    def _train_step(self, exp: Experience, one_step: bool) -> AlgStep:
        """``one_step``: the short target path of :func:`~algorithms.losses.critic_td_loss`."""
        B, T = exp.step_type.shape[:2]
        obs_cur = exp.observation[:, :-1].flatten(0, 1)
        obs_next = exp.observation[:, 1:].flatten(0, 1)
        q = self.critic_networks(obs_cur, exp.action[:, :-1].flatten(0, 1))          # [N, R]
        with torch.no_grad():
            a_next = self._normalize(self.target_actor_network(obs_next))
            if self.target_policy_noise > 0:
                c = self.target_policy_noise_clip
                a_next = a_next + (self.target_policy_noise * torch.randn_like(a_next)).clamp(-c, c)
            a_next = self._denormalize(a_next.clamp(-1.0, 1.0))
            target_value = self.target_critic_networks(obs_next, a_next).min(1).values  # [N]
        actor_loss = torch.zeros(B, T - 1, device=self.device)
        if self._actor_turn():
            a_pi = self.actor_network(obs_cur)
            if self.dqda_clipping:
                c = self.dqda_clipping
                a_pi.register_hook(lambda g: g.clamp(-c, c))
            # Critic weights are detached so the actor loss only trains the actor.
            q_pi = self.critic_networks(obs_cur, a_pi, detach_params=True)[:, 0]
            loss = -q_pi
            if self.action_l2:
                loss = loss + self.action_l2 * (self._normalize(a_pi) ** 2).sum(-1)
            actor_loss = loss.view(B, T - 1)
        R = q.shape[1]
        return AlgStep(info={"exp": exp, "one_step": one_step, "q": q.view(B, T - 1, R),
                             "next_value": target_value.view(B, T - 1),
                             "actor_loss": actor_loss})

    def calc_loss(self, info) -> LossInfo:
        q = info["q"]
        critic_loss, td_error = critic_td_loss(self.td_loss, info["exp"], q,
                                               info["next_value"], info["one_step"])
        actor_loss = info["actor_loss"].mean(1)
        return LossInfo(loss=critic_loss + actor_loss,
                        priority=td_error.abs().mean(-1).detach(),
                        extra={"loss/critic": critic_loss.detach(),
                               "loss/actor": actor_loss.detach(), "q/mean": q.detach()})

    def after_update(self, info=None) -> None:
        # train_steps was incremented by update_with_gradient: the step that just ran was an
        # actor step iff (train_steps - 1) % actor_update_period == 0.
        n = self.num_updates - 1
        if n % self.actor_update_period == 0 and \
                (n // self.actor_update_period) % self.target_update_period == 0:
            self._soft_update(self.target_actor_network, self.actor_network,
                              self.target_update_tau)
            self._soft_update(self.target_critic_networks, self.critic_networks,
                              self.target_update_tau)
