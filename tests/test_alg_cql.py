"""CQL's conservative term against values computed by hand, its place in the critics' loss
(beside SAC's, masked at LAST steps), that it moves the critics and not the actor, and that
it lowers the value of actions the data never took."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

import algorithms
from algorithms.config_core import SacConfig
from algorithms.config_offline import CqlConfig
from algorithms.cql import cql_penalty
from algorithms.data import Experience, StepType

OBS = gym.spaces.Box(-1, 1, (3,), np.float32)
BOX = gym.spaces.Box(-2, 2, (1,), np.float32)


def test_cql_penalty_by_hand():
    # One state, two critics, two sampled actions.
    q_data = torch.tensor([[1.0, 0.0]])
    q_sampled = torch.tensor([[[2.0, 0.0], [0.0, 1.0]]])
    log_density = torch.tensor([[0.0, -1.0]])
    # Critic 0: logsumexp(2 - 0, 0 + 1) - 1 = log(e^2 + e) - 1
    # Critic 1: logsumexp(0 - 0, 1 + 1) - 0 = log(1 + e^2)
    got = cql_penalty(q_data=q_data, q_sampled=q_sampled, log_density=log_density,
                      temperature=1.0)
    torch.testing.assert_close(got, torch.tensor([[math.log(math.e ** 2 + math.e) - 1.0,
                                                   math.log(1 + math.e ** 2)]]))
    # Temperature 2: 2 * logsumexp((q - log mu) / 2) - q_data
    got = cql_penalty(q_data=q_data, q_sampled=q_sampled, log_density=log_density,
                      temperature=2.0)
    torch.testing.assert_close(got[0, 0], torch.tensor(2 * math.log(math.e + math.exp(0.5))
                                                       - 1.0))
    # Towards temperature 0 it is the largest importance-shifted value minus Q at the data.
    got = cql_penalty(q_data=q_data, q_sampled=q_sampled, log_density=log_density,
                      temperature=1e-3)
    torch.testing.assert_close(got, torch.tensor([[1.0, 2.0]]), atol=1e-2, rtol=0)


def _windows(b=16, last_at=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    step_type = torch.full((b, 2), int(StepType.MID))
    if last_at is not None:
        step_type[:, last_at] = int(StepType.LAST)
    return Experience(step_type=step_type, reward=torch.randn(b, 2, generator=g),
                      discount=torch.ones(b, 2), observation=torch.rand(b, 2, 3, generator=g),
                      action=torch.rand(b, 2, 1, generator=g) * 4 - 2)


def _small(**overrides) -> CqlConfig:
    return CqlConfig(**{"actor_fc_layer_params": [16], "critic_fc_layer_params": [16],
                        **overrides})


def test_the_loss_is_sacs_plus_the_weighted_penalty():
    torch.manual_seed(0)
    alg = algorithms.make(_small(cql_alpha=3.0, cql_num_actions=4), OBS, BOX)
    exp = _windows()
    torch.manual_seed(1)
    info = alg.train_step(exp).info
    # Uniform, policy at s, policy at s': 4 each; the uniform density of [-2, 2] is 1/4.
    assert info["q_sampled"].shape == (16, 12, 2)
    torch.testing.assert_close(info["log_density"][:, :4], torch.full((16, 4), -math.log(4)))
    loss = alg.calc_loss(info)
    sac_loss = super(type(alg), alg).calc_loss(info)
    penalty = cql_penalty(q_data=info["q"][:, 0], q_sampled=info["q_sampled"],  # T = 2
                          log_density=info["log_density"], temperature=1.0).sum(-1)
    torch.testing.assert_close(loss.loss, sac_loss.loss + 3.0 * penalty)
    torch.testing.assert_close(loss.extra["loss/cql"], penalty.detach())
    # A window that starts at LAST (no action taken there) takes no penalty.
    info = alg.train_step(_windows(last_at=0)).info
    assert float(alg.calc_loss(info).extra["loss/cql"].abs().sum()) == 0.0


def test_the_penalty_trains_the_critics_only():
    alg = algorithms.make(_small(cql_num_actions=2), OBS, BOX)
    info = alg.train_step(_windows()).info
    loss = alg.calc_loss(info)
    penalty = loss.extra["loss/cql"]
    assert not penalty.requires_grad
    total = (loss.loss - super(type(alg), alg).calc_loss(info).loss).sum()
    total.backward()
    assert all(p.grad is None or float(p.grad.abs().sum()) == 0.0
               for p in alg.actor_network.parameters())
    assert any(float(p.grad.abs().sum()) > 0 for p in alg.critic_networks.parameters())


def test_cql_values_actions_outside_the_data_below_sac():
    """The data holds one action (0) in one state with reward 0 and no future: a critic
    trained by SAC's loss alone says nothing of other actions; with the conservative term
    they end up valued below the data's action."""
    gaps = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny networks: a second thread only contends on a loaded CPU
    try:
        _train_both(gaps)
    finally:
        torch.set_num_threads(threads)
    # Measured: SAC -0.1, CQL 1.5.
    assert gaps["sac"] < 0.5 < 1.0 < gaps["cql"], gaps


def _train_both(gaps):
    for name, config in (("sac", SacConfig(actor_fc_layer_params=[16],
                                           critic_fc_layer_params=[32], use_entropy_reward=False,
                                           critic_learning_rate=3e-3)),
                         ("cql", _small(critic_fc_layer_params=[32], critic_learning_rate=3e-3))):
        torch.manual_seed(0)
        alg = algorithms.make(config, OBS, BOX)
        exp = Experience(step_type=torch.full((32, 2), int(StepType.MID)),
                         reward=torch.zeros(32, 2), discount=torch.zeros(32, 2),
                         observation=torch.zeros(32, 2, 3), action=torch.zeros(32, 2, 1))
        for _ in range(60):
            alg.train_on(exp)
        with torch.no_grad():
            q = alg.critic_networks(torch.zeros(3, 3), torch.tensor([[-2.0], [0.0], [2.0]]))
        q = q.min(1).values
        gaps[name] = float(q[1] - torch.maximum(q[0], q[2]))


def test_cql_refuses_discrete_actions():
    with pytest.raises(ValueError, match="continuous"):
        algorithms.make(CqlConfig(), OBS, gym.spaces.Discrete(2))


def test_cql_is_registered():
    from algorithms.configs import config_class

    assert config_class("cql") is CqlConfig
