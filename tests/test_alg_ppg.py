"""PPG: the auxiliary phase's loss against numbers worked by hand, the value targets it stores,
and when it runs (the contract every algorithm keeps is checked for PPG with the others, in
``tests/test_alg_interface.py``)."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.distributions as td

import algorithms
from algorithms.config_alf import PpgConfig
from algorithms.data import Experience, StepType
from algorithms.ppg import aux_phase_loss

OBS = gym.spaces.Box(-1, 1, (3,), np.float32)


def t(*x):
    return torch.tensor(x, dtype=torch.float32)


def test_aux_phase_loss_by_hand():
    # Values [1, 2] and auxiliary values [0, 3] against targets [2, 2]:
    #   0.5 (1-2)^2 + 0.5 (0-2)^2 = 2.5;  0.5 (2-2)^2 + 0.5 (3-2)^2 = 0.5.
    # pi_old (1/2, 1/2) against pi (1/4, 3/4): KL = 1/2 ln 2 + 1/2 ln(2/3) = 1/2 ln(4/3);
    # identical policies on the second row: KL 0. Weight 2.
    old = td.Categorical(probs=torch.tensor([[0.5, 0.5], [0.3, 0.7]]))
    new = td.Categorical(probs=torch.tensor([[0.25, 0.75], [0.3, 0.7]]))
    info = aux_phase_loss(t(1.0, 2.0), t(0.0, 3.0), t(2.0, 2.0), old, new, 2.0)
    kl = 0.5 * math.log(4 / 3)
    torch.testing.assert_close(info.loss, t(0.5 + 2.0 + 2 * kl, 0.5))
    torch.testing.assert_close(info.extra["aux/kl"], t(kl, 0.0), rtol=0, atol=1e-6)
    torch.testing.assert_close(info.extra["aux/value"], t(0.5, 0.0))
    torch.testing.assert_close(info.extra["aux/aux_value"], t(2.0, 0.5))


def test_aux_phase_kl_of_gaussians_by_hand():
    # KL(N(0, 1) || N(1, 2)) = ln 2 + (1 + 1) / 8 - 1/2 per dimension.
    old = td.Independent(td.Normal(t(0.0, 0.0).view(1, 2), t(1.0, 1.0).view(1, 2)), 1)
    new = td.Independent(td.Normal(t(1.0, 1.0).view(1, 2), t(2.0, 2.0).view(1, 2)), 1)
    info = aux_phase_loss(t(0.0), t(0.0), t(0.0), old, new, 1.0)
    torch.testing.assert_close(info.loss, t(2 * (math.log(2) + 0.25 - 0.5)))


def _unroll(alg, rewards, values, step_types, discounts=None):
    """A time-major ``[T, 1]`` unroll with the given rewards, rollout values and step types."""
    T = len(rewards)
    obs = torch.arange(T * 3, dtype=torch.float32).view(T, 1, 3) / 10
    with torch.no_grad():
        dist = alg.actor_network(obs.flatten(0, 1))
        action = dist.sample()
    return Experience(
        step_type=torch.tensor(step_types).view(T, 1), reward=t(*rewards).view(T, 1),
        discount=t(*(discounts or [1.0] * T)).view(T, 1), observation=obs,
        action=action.view(T, 1), rollout_info={"log_prob": dist.log_prob(action).view(T, 1),
                                                "value": t(*values).view(T, 1)})


def _ppg(**kw):
    config = dict(actor_fc_layer_params=[8], value_fc_layer_params=[8], mini_batch_size=4,
                  num_epochs=1, aux_epochs=1, aux_mini_batch_size=4)
    return algorithms.make(PpgConfig(**{**config, **kw}), OBS, gym.spaces.Discrete(2))


def test_stored_value_targets_are_the_gae_returns_by_hand():
    # gamma 0.5, lambda 0.5; rewards r[t] arrive at t; values V = [1, 2, 4]; rows 0 and 1:
    #   delta_1 = r2 + 0.5 V2 - V1 = 1 + 2 - 2 = 1  -> A_1 = 1,   V_targ_1 = 3
    #   delta_0 = r1 + 0.5 V1 - V0 = 2 + 1 - 1 = 2  -> A_0 = 2 + 0.25 * 1 = 2.25, V_targ_0 = 3.25
    alg = _ppg(gamma=0.5, td_lambda=0.5, aux_interval=2)
    alg.train_on(_unroll(alg, [0.0, 2.0, 1.0], [1.0, 2.0, 4.0], [0, 1, 1]))
    (obs, returns), = alg._stored
    torch.testing.assert_close(returns, t(3.25, 3.0))
    assert obs.shape == (2, 3)
    # A LAST row has no transition: it is not stored (termination at row 1: V_targ_0 = r1).
    alg.train_on(_unroll(alg, [0.0, 2.0, 0.0], [1.0, 2.0, 4.0], [0, 2, 0], [1.0, 0.0, 1.0]))
    assert alg._stored == []  # the second unroll completed N_pi = 2: the phase ran, forgotten


def test_the_auxiliary_phase_runs_every_aux_interval_unrolls_and_trains_the_aux_head():
    alg = _ppg(aux_interval=3, aux_epochs=2)
    exp = _unroll(alg, [0.0, 1.0, 1.0, 0.0, 1.0], [0.0] * 5, [0, 1, 1, 1, 1])
    head = alg.aux_head.weight.detach().clone()
    for i in range(2):
        metrics = alg.train_on(exp).metrics
        assert "aux/kl" not in metrics and len(alg._stored) == i + 1
        torch.testing.assert_close(alg.aux_head.weight, head, rtol=0, atol=0)  # no policy-phase move
    metrics = alg.train_on(exp).metrics
    # 3 unrolls of 4 rows, 2 epochs of 3 mini-batches of 4.
    assert metrics["aux/samples"] == 12.0 and alg._stored == []
    assert {"aux/kl", "aux/value", "aux/aux_value", "aux/total", "loss/pg"} <= set(metrics)
    assert not torch.equal(alg.aux_head.weight, head)


def test_the_behaviour_cloning_kl_holds_the_policy():
    """Without the KL the policy follows the value distillation through the shared encoder;
    with it the policy moves a fraction of that (measured: a fifth at weight 10)."""
    obs = torch.randn(64, 3, generator=torch.Generator().manual_seed(0))
    moved = {}
    for weight in (0.0, 10.0):
        torch.manual_seed(0)
        alg = _ppg(aux_interval=1, aux_epochs=20, aux_mini_batch_size=64, learning_rate=1e-2,
                   aux_kl_weight=weight)
        with torch.no_grad():  # PPO's near-uniform first policy hides its encoder's moves
            alg.actor_network.head.weight.mul_(100)
        before = alg.actor_network(obs).probs.detach()
        alg._stored = [(obs, 10 * torch.ones(64))]  # far targets: a strong value gradient
        alg.auxiliary_phase()
        after = alg.actor_network(obs).probs.detach()
        moved[weight] = td.kl_divergence(td.Categorical(probs=before),
                                         td.Categorical(probs=after)).mean().item()
    assert moved[10.0] < 0.5 * moved[0.0]


def test_shared_or_recurrent_networks_are_refused():
    with pytest.raises(ValueError, match="apart"):
        _ppg(shared_encoder_fc_layer_params=[8])
    with pytest.raises(ValueError, match="apart"):
        _ppg(rnn_size=4)


def test_the_stored_unrolls_survive_a_checkpoint():
    alg = _ppg(aux_interval=3)
    alg.train_on(_unroll(alg, [0.0, 1.0, 1.0], [0.0] * 3, [0, 1, 1]))
    restored = _ppg(aux_interval=3)
    restored.load_checkpoint_state(alg.checkpoint_state())
    (o1, r1), = alg._stored
    (o2, r2), = restored._stored
    assert torch.equal(o1, o2) and torch.equal(r1, r2)
    assert StepType.LAST == 2
