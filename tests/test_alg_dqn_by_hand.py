"""DQN's one-step update without autograd (``algorithms.mlp_backprop``): the same update as
the autograd path, up to float rounding, and taken only where it applies."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import algorithms
from algorithms import configs
from algorithms.data import Experience
from algorithms.mlp_backprop import ReluMlp
from algorithms.networks import QNetwork

DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])]
OBS = gym.spaces.Box(-1, 1, (3, 2), np.float32)  # flattened by the mlp encoder
ACTIONS = gym.spaces.Discrete(3)


def _batch(B: int, T: int, seed: int) -> Experience:
    rng = np.random.default_rng(seed)
    step_type = np.ones((B, T), np.int64)
    step_type[::7, 0] = 2  # some LAST rows: their targets are masked
    return Experience(
        step_type=step_type, reward=rng.normal(size=(B, T)).astype(np.float32),
        discount=(rng.uniform(size=(B, T)) > 0.1).astype(np.float32),
        # Large observations: TD errors on both sides of the Huber loss's kink.
        observation=rng.normal(scale=3.0, size=(B, T, 3, 2)).astype(np.float32),
        action=rng.integers(0, 3, (B, T)), prev_action=(), env_id=(), rollout_info={})


def _pair(device: str, **kwargs):
    """Two DQNs with the same weights: the second with its by-hand update switched off."""
    out = []
    for _ in range(2):
        config = configs.parse({"name": "dqn", "fc_layer_params": [16, 8],
                                "target_update_period": 2, **kwargs})
        torch.manual_seed(0)
        out.append(algorithms.make(config, OBS, ACTIONS, device=device))
    out[1]._by_hand = None
    return out


def _count_by_hand(alg) -> list:
    """Calls of the by-hand update, counted: a test that compares two autograd updates
    must not pass."""
    calls, update = [], alg._one_step_update_by_hand
    alg._one_step_update_by_hand = lambda exp, w: calls.append(1) or update(exp, w)
    return calls


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("double_q, loss, weighted, max_grad_norm, fc", [
    (True, "huber", False, 10.0, [16, 8]), (False, "huber", True, 0.5, [16, 8]),
    (True, "squared", True, None, [16, 8]), (False, "squared", False, 10.0, [32]),
    (True, "huber", True, 0.1, [])])
def test_the_by_hand_update_is_the_autograd_update(device, double_q, loss, weighted,
                                                   max_grad_norm, fc):
    by_hand, autograd = _pair(device, double_q=double_q, td_error_loss_fn=loss,
                              max_grad_norm=max_grad_norm, fc_layer_params=fc)
    calls = _count_by_hand(by_hand)
    for step in range(5):  # past two target-network updates
        batch = _batch(32, 2, seed=step)
        w = np.random.default_rng(10 + step).uniform(0.2, 1.0, 32).astype(np.float32) \
            if weighted else None
        a, b = by_hand.train_on(batch, w), autograd.train_on(batch, w)
        torch.testing.assert_close(a.priorities, b.priorities, rtol=1e-4, atol=1e-5)
        ma, mb = a.metrics, b.metrics
        assert ma.keys() == mb.keys()
        for key in ma:
            assert ma[key] == pytest.approx(mb[key], rel=1e-4, abs=1e-5), key
    assert len(calls) == 5
    for (name, p), q in zip(by_hand.named_parameters(), autograd.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)
    for name in ("q_network", "target_q_network"):
        for p, q in zip(getattr(by_hand, name).parameters(),
                        getattr(autograd, name).parameters(), strict=True):
            assert not torch.equal(p, torch.zeros_like(p)) and torch.allclose(p, q, 1e-4, 1e-5)
    assert by_hand.num_updates == autograd.num_updates == 5


def test_gradients_match_autograd_on_a_relu_mlp():
    torch.manual_seed(1)
    net = QNetwork(OBS, ACTIONS, (16, 8))
    mlp = ReluMlp.of(net)
    obs = torch.randn(24, 3, 2)
    grad_out = torch.randn(10, 3)
    with torch.no_grad():  # as the update runs it
        out, inputs = mlp.forward(obs)
        torch.testing.assert_close(out, net(obs))
        mlp.backward(inputs, grad_out)  # through the first 10 rows only
    mine = [p.grad.clone() for p in net.parameters()]
    # Every gradient is a view of the one flat tensor that clipping takes the norm of.
    torch.testing.assert_close(mlp.gradients(), torch.cat([g.flatten() for g in mine]))
    net.zero_grad()
    (net(obs)[:10] * grad_out).sum().backward()
    for name, g, p in zip(dict(net.named_parameters()), mine, net.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("changes, reason", [
    ({"precision": "bfloat16"}, "bfloat16 updates run through autocast"),
    ({"encoder": "minatar_cnn"}, "a conv encoder"),
])
def test_networks_and_settings_it_does_not_cover_keep_autograd(changes, reason):
    obs = gym.spaces.Box(0, 1, (10, 10, 4), np.float32) if "encoder" in changes else OBS
    config = configs.parse({"name": "dqn", "fc_layer_params": [16], **changes})
    alg = algorithms.make(config, obs, ACTIONS)
    assert alg._by_hand is None, reason
    assert ReluMlp.of(QNetwork(OBS, ACTIONS, (16,), activation=torch.nn.Tanh)) is None


def test_n_step_windows_keep_the_autograd_path():
    by_hand, _ = _pair("cpu", n_step=3)
    calls = _count_by_hand(by_hand)
    result = by_hand.train_on(_batch(16, 4, seed=0))
    assert calls == [] and result.priorities.shape == (16,)
    by_hand.train_on(_batch(16, 2, seed=0))  # a two-step window takes it again
    assert calls == [1]
