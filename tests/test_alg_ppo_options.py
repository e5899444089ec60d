"""PPO's learning-rate annealing, orthogonal initialization and activation (the settings the
MinAtar graph trains with; CleanRL's and PureJaxRL's PPO use all three)."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

import algorithms
from algorithms.configs import PpoConfig, parse
from tests.test_alg_interface import _unroll
from typedconfig import ConfigError

MINATAR_OBS = gym.spaces.Box(0, 255, (4, 10, 10), np.uint8)
ACTIONS = gym.spaces.Discrete(3)
SMALL = dict(encoder="minatar_cnn", actor_fc_layer_params=(16,), value_fc_layer_params=(16,),
             mini_batch_size=8, num_epochs=1)


def _images(alg, T, B, seed=0):
    """An on-policy unroll [T, B] with MinAtar-like uint8 frames."""
    exp = _unroll(alg, gym.spaces.Box(-1, 1, (4, 10, 10), np.float32), ACTIONS, T, B, seed)
    obs = (np.asarray(exp.observation) > 0).astype(np.uint8) * np.uint8(255)
    return exp._replace(observation=obs)


def _lr(alg) -> float:
    (group,) = alg.optimizers["ac"].param_groups
    return group["lr"]


def test_learning_rate_falls_linearly_to_zero_over_the_trained_env_steps():
    torch.manual_seed(0)
    T, B = 5, 4  # each unroll trains T * B = 20 env steps (the bootstrap row is extra)
    alg = algorithms.make(PpoConfig(learning_rate=1e-3, learning_rate_anneal_steps=50, **SMALL),
                          MINATAR_OBS, ACTIONS)
    seen = []
    for i in range(4):
        result = alg.train_on(_images(alg, T + 1, B, seed=i))
        seen.append(result.metrics["learning_rate"])
    # The rate of an update is the schedule at the env steps trained before it.
    assert seen == pytest.approx([1e-3, 1e-3 * 30 / 50, 1e-3 * 10 / 50, 0.0])
    assert int(alg.trained_env_steps) == 4 * T * B
    assert _lr(alg) == 0.0  # what the optimizer really used


def test_constant_learning_rate_without_annealing():
    torch.manual_seed(0)
    alg = algorithms.make(PpoConfig(learning_rate=1e-3, **SMALL), MINATAR_OBS, ACTIONS)
    for i in range(3):
        assert alg.train_on(_images(alg, 6, 4, seed=i)).metrics["learning_rate"] == 1e-3
    assert _lr(alg) == 1e-3


def test_the_schedule_resumes_from_a_checkpoint_and_old_checkpoints_load():
    torch.manual_seed(0)
    kw = dict(learning_rate=1e-3, learning_rate_anneal_steps=100, **SMALL)
    alg = algorithms.make(PpoConfig(**kw), MINATAR_OBS, ACTIONS)
    alg.train_on(_images(alg, 6, 4))
    state = alg.state_dict()
    restored = algorithms.make(PpoConfig(**kw), MINATAR_OBS, ACTIONS)
    restored.load_state_dict(state)
    assert restored.current_learning_rate() == pytest.approx(1e-3 * 80 / 100)
    old = {k: v for k, v in state.items() if k != "trained_env_steps"}
    fresh = algorithms.make(PpoConfig(**kw), MINATAR_OBS, ACTIONS)
    fresh.load_state_dict(old)  # strict: a checkpoint from before the schedule
    assert fresh.current_learning_rate() == 1e-3


def _orthogonal(weight: torch.Tensor, gain: float) -> bool:
    w = weight.detach().flatten(1)
    if w.shape[0] > w.shape[1]:
        w = w.T
    return torch.allclose(w @ w.T, gain ** 2 * torch.eye(w.shape[0]), atol=1e-4)


def test_orthogonal_init_gains_and_zero_biases():
    torch.manual_seed(0)
    alg = algorithms.make(PpoConfig(orthogonal_init=True, **SMALL), MINATAR_OBS, ACTIONS)
    for net, head_gain in ((alg.actor_network, 0.01), (alg.value_network, 1.0)):
        layers = [m for m in net.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
        assert len(layers) == 3  # conv, hidden, head
        for m in layers:
            gain = head_gain if m is net.head else 2 ** 0.5
            assert _orthogonal(m.weight, gain), m
            assert (m.bias == 0).all()
    default = algorithms.make(PpoConfig(**SMALL), MINATAR_OBS, ACTIONS)
    assert not _orthogonal(default.value_network.head.weight, 1.0)


def test_activation_reaches_conv_and_hidden_layers():
    alg = algorithms.make(PpoConfig(activation="relu", **SMALL), MINATAR_OBS, ACTIONS)
    acts = [type(m) for m in alg.actor_network.modules() if isinstance(m, (nn.ReLU, nn.Tanh))]
    assert acts == [nn.ReLU, nn.ReLU]
    alg = algorithms.make(PpoConfig(**SMALL), MINATAR_OBS, ACTIONS)
    acts = [type(m) for m in alg.actor_network.modules() if isinstance(m, (nn.ReLU, nn.Tanh))]
    assert acts == [nn.Tanh, nn.Tanh]


@pytest.mark.parametrize("key,value,message", [
    ("activation", "gelu", "activation"),
    ("learning_rate_anneal_steps", 0, "must be >= 1"),
])
def test_bad_options_are_config_errors(key, value, message):
    with pytest.raises(ConfigError, match=message):
        parse({"name": "ppo", key: value})
