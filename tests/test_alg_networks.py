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


def test_squashed_normal_sample_and_log_prob_in_one_pass():
    from algorithms.networks import SquashedNormal

    loc = torch.randn(6, 2, requires_grad=True)
    log_std = torch.randn(6, 2, requires_grad=True)
    scale, bias = torch.tensor([2.0, 0.5]), torch.tensor([0.0, 0.5])
    torch.manual_seed(3)
    a1, lp1 = SquashedNormal(loc, log_std.exp(), scale, bias).rsample_and_log_prob()
    g1 = torch.autograd.grad(lp1.sum() + a1.sum(), [loc, log_std])
    torch.manual_seed(3)
    dist = SquashedNormal(loc, log_std.exp(), scale, bias)
    a2 = dist.rsample()
    lp2 = dist.log_prob(a2)
    g2 = torch.autograd.grad(lp2.sum() + a2.sum(), [loc, log_std])
    torch.testing.assert_close(a1, a2, rtol=0, atol=0)
    torch.testing.assert_close(lp1, lp2, rtol=1e-5, atol=1e-5)
    for x, y in zip(g1, g2, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


def test_parallel_critic_equals_one_mlp_per_replica_with_gradients():
    """The one-unit head runs as multiply-and-sum, not a batched matmul: same values and
    gradients as each replica's own ``x @ W + b`` layers."""
    torch.manual_seed(0)
    par = ParallelCriticNetwork(OBS, BOX, (16, 8), num_replicas=2)
    x, a = torch.randn(5, 3), torch.randn(5, 2)
    out = par(x, a)
    mlp = par.mlp
    for r in range(2):
        h = torch.cat([x, a], -1)
        for i, (w, b) in enumerate(zip(mlp.weights, mlp.biases, strict=True)):
            h = h @ w[r] + b[r, 0]
            if i < len(mlp.weights) - 1:
                h = torch.relu(h)
        torch.testing.assert_close(out[:, r], h[:, 0])
    out.sum().backward()
    grads = [p.grad.clone() for p in par.parameters()]
    par.zero_grad()
    for r in range(2):  # the same loss, replica by replica, through plain matmuls
        h = torch.cat([x, a], -1)
        for i, (w, b) in enumerate(zip(mlp.weights, mlp.biases, strict=True)):
            h = h @ w[r] + b[r, 0]
            if i < len(mlp.weights) - 1:
                h = torch.relu(h)
        h.sum().backward()
    for g, p in zip(grads, par.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad)
