"""Phasic Policy Gradient (Cobbe et al. 2020, "Phasic Policy Gradient"; ALF's
``PPGAlgorithm``): PPO whose policy network also learns the value, in a phase of its own.

PPO with separate actor and value networks keeps the value's features out of the policy; with
one shared network the two objectives interfere. PPG keeps them apart in the policy phase and
then, every ``aux_interval`` (``N_pi``) unrolls, runs an auxiliary phase on all the unrolls
stored since the last one, which trains an auxiliary value head on the policy network's
features while a behaviour-cloning KL holds the policy where it was::

    policy phase (each unroll):  PPO (algorithms.ppo): clipped objective, value loss, GAE;
                                 store (s, V_targ) with V_targ = GAE advantage + V_rollout(s)
    auxiliary phase (every N_pi unrolls), pi_old = the policy at its start, aux_epochs passes
    of shuffled mini-batches of the stored states:
        L_aux = 0.5 (V_aux(s) - V_targ)^2 + 0.5 (V(s) - V_targ)^2
                + aux_kl_weight * KL(pi_old(.|s) || pi(.|s))

The networks are PPO's separate ones (ALF's ``DisjointPolicyValueNetwork`` "dual"
architecture): the actor's encoder feeds the policy head and the auxiliary value head
(``aux_head``, a linear layer), the value network has its own. ``train_on`` takes PPO's
time-major unrolls ``[T, B]``; the auxiliary phase runs inside the ``train_on`` that completes
``N_pi`` unrolls, and its metrics (``aux/...``) are that call's. The stored unrolls are part of
``checkpoint_state``, so a restored learner makes the same auxiliary phase.

Differences from ALF: ``pi_old`` is the policy at the start of the auxiliary phase, as in the
paper (ALF's loss takes the distribution recorded at rollout, up to ``N_pi`` policies old);
the squared errors carry the paper's 1/2; one Adam serves both phases (ALF has two), the
auxiliary head being a group of its own.
"""

from __future__ import annotations

import torch
import torch.distributions as td
from torch import nn

from algorithms.base import _scalars
from algorithms.config_alf import PpgConfig
from algorithms.data import Experience, LossInfo, TrainResult
from algorithms.losses import advantages_and_returns
from algorithms.ppo import PPOAlgorithm
from algorithms.value_ops import valid_mask


def aux_phase_loss(value: torch.Tensor, aux_value: torch.Tensor, returns: torch.Tensor,
                   old_dist: td.Distribution, dist: td.Distribution,
                   kl_weight: float) -> LossInfo:
    """The auxiliary phase's per-sample loss ``[N]`` (see the module doc) and its parts in
    ``extra``: ``aux/value`` and ``aux/aux_value`` (the halved squared errors), ``aux/kl``."""
    value_loss = 0.5 * (value - returns).square()
    aux_loss = 0.5 * (aux_value - returns).square()
    kl = td.kl_divergence(old_dist, dist)
    return LossInfo(loss=value_loss + aux_loss + kl_weight * kl,
                    extra={"aux/value": value_loss.detach(), "aux/aux_value": aux_loss.detach(),
                           "aux/kl": kl.detach()})


class PpgAlgorithm(PPOAlgorithm):
    """PPG for discrete or continuous actions; hyperparameters: see :class:`PpgConfig`
    (PPO's, and the auxiliary phase's)."""

    def __init__(self, observation_space, action_space, config: PpgConfig, device="cpu"):
        if config.shared_encoder_fc_layer_params is not None or config.rnn_size is not None:
            raise ValueError("ppg keeps the policy and value networks apart (ALF's dual "
                             "architecture): shared_encoder_fc_layer_params and rnn_size "
                             "must be null")
        super().__init__(observation_space, action_space, config, device)
        self.aux_head = nn.Linear(self.actor_network.encoder.output_size, 1).to(self.device)
        if config.orthogonal_init:
            nn.init.orthogonal_(self.aux_head.weight, 1.0)
            nn.init.zeros_(self.aux_head.bias)
        # PPO's optimizer holds every other parameter; the head's group only moves in the
        # auxiliary phase (the policy phase leaves it without a gradient).
        self._add_optimizer("aux", self.aux_head.parameters(), config.learning_rate, eps=1e-5)
        self._stored: list[tuple[torch.Tensor, torch.Tensor]] = []  # (observations, V_targ)
        self._last_experience: Experience | None = None

    def _experience(self, exp: Experience) -> Experience:
        # PPO's train_on transforms the unroll once; the auxiliary phase stores those rows.
        self._last_experience = super()._experience(exp)
        return self._last_experience

    def train_in_stages(self, experience: Experience, importance_weights=None):
        """PPO's update of the unroll ``[T, B]``; its valid rows and value targets are
        stored, and every ``aux_interval``-th call ends with the auxiliary phase."""
        result = yield from super().train_in_stages(experience, importance_weights)
        exp, self._last_experience = self._last_experience, None
        value = exp.rollout_info["value"]
        _, returns = advantages_and_returns(exp.step_type, exp.reward, exp.discount, value,
                                            self.gamma, self.td_lambda)
        keep = valid_mask(exp.step_type).bool().flatten()
        self._stored.append((exp.observation[:-1].flatten(0, 1)[keep],
                             returns.flatten()[keep]))
        if len(self._stored) < self.config.aux_interval:
            return result
        metrics = dict(result.metrics)
        metrics.update(self.auxiliary_phase())
        return TrainResult(metrics, None)

    def _policy_and_aux(self, obs: torch.Tensor) -> tuple[td.Distribution, torch.Tensor]:
        """The policy's distribution and the auxiliary value, from one pass of the actor's
        encoder."""
        actor = self.actor_network
        features = actor.encoder(self.encoding_network(obs))
        head = actor.head(features)
        if actor.discrete:
            dist = td.Categorical(logits=head, validate_args=False)
        else:
            dist = td.Independent(td.Normal(head, actor.log_std.exp().expand_as(head),
                                            validate_args=False), 1, validate_args=False)
        return dist, self.aux_head(features).squeeze(-1)

    def auxiliary_phase(self) -> dict[str, float]:
        """``aux_epochs`` passes over the stored unrolls (then forgotten); the mean metrics."""
        c = self.config
        obs = torch.cat([o for o, _ in self._stored])
        returns = torch.cat([r for _, r in self._stored])
        self._stored = []
        n = obs.shape[0]
        with torch.no_grad():  # pi_old: the policy as the phase starts, in chunks
            old = [self._policy_and_aux(obs[i:i + 4096])[0] for i in range(0, n, 4096)]
            old_params = _distribution_params(old)
        sums: dict[str, torch.Tensor] = {}
        count = 0
        for _ in range(c.aux_epochs):
            perm = torch.randperm(n, device=self.device)
            for start in range(0, n, c.aux_mini_batch_size):
                idx = perm[start:start + c.aux_mini_batch_size]
                with self.training_precision():
                    dist, aux_value = self._policy_and_aux(obs[idx])
                    value = self.value_network(self.encoding_network(obs[idx]))
                    loss_info = aux_phase_loss(
                        value, aux_value, returns[idx],
                        _distribution(dist, {k: v[idx] for k, v in old_params.items()}),
                        dist, c.aux_kl_weight)
                total = self._apply_gradient(loss_info)
                for k, v in {"aux/total": total, **loss_info.extra}.items():
                    v = v.detach().float().mean()
                    sums[k] = sums[k] + v if k in sums else v
                count += 1
        return {**_scalars({k: v / count for k, v in sums.items()}),
                "aux/samples": float(n)}

    # ----- checkpoints: the stored unrolls are part of the learner's state ------------------
    def checkpoint_state(self) -> dict:
        state = super().checkpoint_state()
        state["ppg_stored"] = [(o.detach().cpu().clone(), r.detach().cpu().clone())
                               for o, r in self._stored]
        return state

    def load_checkpoint_state(self, state: dict) -> None:
        super().load_checkpoint_state(state)
        self._stored = [(o.to(self.device), r.to(self.device))
                        for o, r in state.get("ppg_stored", [])]


def _distribution_params(dists: list[td.Distribution]) -> dict[str, torch.Tensor]:
    """The parameters of chunked distributions of one kind, concatenated."""
    if isinstance(dists[0], td.Categorical):
        return {"logits": torch.cat([d.logits for d in dists])}
    return {"loc": torch.cat([d.base_dist.loc for d in dists]),
            "scale": torch.cat([d.base_dist.scale for d in dists])}


def _distribution(like: td.Distribution, params: dict[str, torch.Tensor]) -> td.Distribution:
    """A distribution of ``like``'s kind with ``params``."""
    if isinstance(like, td.Categorical):
        return td.Categorical(logits=params["logits"], validate_args=False)
    return td.Independent(td.Normal(params["loc"], params["scale"], validate_args=False), 1,
                          validate_args=False)
