import gymnasium as gym
import numpy as np
import torch
import torch.distributions as td

from algorithms.networks import (
    ActorDistributionNetwork,
    ActorNetwork,
    CriticNetwork,
    EncodingNetwork,
    ParallelCriticNetwork,
    QNetwork,
    ValueNetwork,
    distribution_mode,
)

OBS = gym.spaces.Box(-1, 1, (3,), np.float32)
BOX = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))
DISC = gym.spaces.Discrete(3)


def test_cnn_encoder_and_q_network_on_images():
    img = gym.spaces.Box(0, 255, (4, 16, 16), np.uint8)
    enc = EncodingNetwork(img.shape, conv_layer_params=[(8, 4, 2), (8, 3, 1)],
                          fc_layer_params=(32,))
    assert enc(torch.zeros(5, 4, 16, 16)).shape == (5, 32)
    q = QNetwork(img, DISC, fc_layer_params=(16,), conv_layer_params=[(8, 4, 2)])
    assert q(torch.zeros(2, 4, 16, 16)).shape == (2, 3)


def test_value_and_critic_shapes():
    x = torch.randn(7, 3)
    assert ValueNetwork(OBS, (8,))(x).shape == (7,)
    assert CriticNetwork(OBS, BOX, (8,))(x, torch.zeros(7, 2)).shape == (7,)
    par = ParallelCriticNetwork(OBS, BOX, (8,), num_replicas=3)
    out = par(x, torch.zeros(7, 2))
    assert out.shape == (7, 3)
    # replicas are independent networks
    assert not torch.allclose(out[:, 0], out[:, 1])


def test_detached_critic_gives_no_weight_gradient():
    par = ParallelCriticNetwork(OBS, BOX, (8,), num_replicas=2)
    a = torch.zeros(4, 2, requires_grad=True)
    par(torch.randn(4, 3), a, detach_params=True).sum().backward()
    assert a.grad is not None and all(p.grad is None for p in par.parameters())


def test_actors_respect_bounds():
    x = torch.randn(256, 3) * 10
    a = ActorNetwork(OBS, BOX, (8,))(x)
    assert a.shape == (256, 2)
    assert (a[:, 0].abs() <= 2).all() and ((a[:, 1] >= 0) & (a[:, 1] <= 1)).all()
    dist = ActorDistributionNetwork(OBS, BOX, (8,), continuous_projection="tanh_normal")(x)
    s = dist.rsample()
    assert (s[:, 0].abs() <= 2).all() and ((s[:, 1] >= 0) & (s[:, 1] <= 1)).all()
    assert dist.log_prob(s).shape == (256,)
    m = distribution_mode(dist)
    assert (m[:, 0].abs() <= 2).all()


def test_categorical_and_normal_heads():
    x = torch.randn(4, 3)
    cat = ActorDistributionNetwork(OBS, DISC, (8,))(x)
    assert isinstance(cat, td.Categorical) and distribution_mode(cat).shape == (4,)
    normal = ActorDistributionNetwork(OBS, BOX, (8,), continuous_projection="normal",
                                      init_std=0.5)(x)
    torch.testing.assert_close(normal.base_dist.scale, torch.full((4, 2), 0.5))
    assert normal.log_prob(normal.sample()).shape == (4,)
