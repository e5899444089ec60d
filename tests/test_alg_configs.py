"""Typed algorithm configs: what a graph's ``algorithm:`` block may say, checked before any
process starts."""

import dataclasses
import pathlib
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import yaml

import algorithms
from algorithms import configs
from typedconfig import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[1]
NAMES = ["dqn", "sac", "ppo", "a2c", "ddpg", "td3"]


def _error(mapping, where="algorithm") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        configs.parse(mapping, where)
    return info.value


def test_misspelled_key_is_named():
    err = _error({"name": "dqn", "gamam": 0.9}, "nodes.learner.config.algorithm")
    assert err.key == "nodes.learner.config.algorithm.gamam"
    assert "unknown key" in str(err)


def test_string_number_is_an_error_naming_the_key():
    # PyYAML (YAML 1.1) reads 3e-4 as a string: it must not reach the optimizer.
    err = _error({"name": "sac", "actor_learning_rate": "3e-4"})
    assert err.key == "algorithm.actor_learning_rate" and "expected a number" in str(err)


@pytest.mark.parametrize("mapping,key", [
    ({"name": "dqn", "gamma": 0.0}, "algorithm.gamma"),
    ({"name": "dqn", "gamma": 1.5}, "algorithm.gamma"),
    ({"name": "ppo", "mini_batch_size": 0}, "algorithm.mini_batch_size"),
    ({"name": "dqn", "n_step": 0}, "algorithm.n_step"),
    ({"name": "sac", "mini_batch_length": 1}, "algorithm.mini_batch_length"),
    ({"name": "dqn", "learning_rate": 0.0}, "algorithm.learning_rate"),
    ({"name": "sac", "critic_fc_layer_params": [64, 0]}, "algorithm.critic_fc_layer_params"),
    ({"name": "dqn", "td_error_loss_fn": "l1"}, "algorithm.td_error_loss_fn"),
    ({"name": "dqn", "encoder": "resnet"}, "algorithm.encoder"),
    ({"name": "dqn", "double_q": "yes"}, "algorithm.double_q"),
    ({"name": "sac", "precision": "float16"}, "algorithm.precision"),
    ({"name": "nope"}, "algorithm.name"),
    ({"gamma": 0.9}, "algorithm.name"),
    ({"name": "random", "gamma": 0.9}, "algorithm.gamma"),
    ({"name": "dqn", "data_transformers": {"name": "image_scale"}},
     "algorithm.data_transformers"),
    ({"name": "dqn", "data_transformers": [{"name": "frame_stack"}]},
     "algorithm.data_transformers[0].name"),
    ({"name": "dqn", "data_transformers": [{"name": "reward_scaling", "scael": 2}]},
     "algorithm.data_transformers[0].scael"),
    ({"name": "dqn", "data_transformers": [{"name": "reward_clipping", "minmax": [1, -1]}]},
     "algorithm.data_transformers[0].minmax"),
    ({"name": "dqn", "data_transformers": [{}, {"name": "frame_stacker", "stack_size": 0}]},
     "algorithm.data_transformers[0].name"),
    ({"name": "dqn", "data_transformers": [{"name": "frame_stacker", "stack_size": 0}]},
     "algorithm.data_transformers[0].stack_size"),
])
def test_bad_values_name_their_key(mapping, key):
    assert _error(mapping).key == key


def test_every_field_is_documented_and_round_trips():
    for name in [*NAMES, "random"]:
        cls = configs.config_class(name)
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
        for f in dataclasses.fields(cls):
            assert f.metadata.get("doc"), f"{name}.{f.name} has no doc"
        default = configs.parse({"name": name})
        assert default.name == name
        assert configs.parse(configs.to_dict(default)) == default
    for cls in configs.TRANSFORMER_CONFIGS.values():
        assert all(f.metadata.get("doc") for f in dataclasses.fields(cls) if f.name != "name")


def test_td3_is_ddpg_with_variant_defaults():
    td3, ddpg = configs.parse({"name": "td3"}), configs.parse({"name": "ddpg"})
    assert (td3.num_critic_replicas, td3.actor_update_period, td3.target_policy_noise,
            td3.exploration_noise) == (2, 2, 0.2, "gaussian")
    assert (ddpg.num_critic_replicas, ddpg.actor_update_period, ddpg.target_policy_noise) == \
        (1, 1, 0.0)
    space = gym.spaces.Box(-1, 1, (3,), np.float32)
    alg = algorithms.make(configs.parse({"name": "td3", "actor_fc_layer_params": [8],
                                         "critic_fc_layer_params": [8]}),
                          space, gym.spaces.Box(-2, 2, (1,), np.float32))
    assert alg.critic_networks.mlp.num_replicas == 2 and alg.actor_update_period == 2


def test_integers_widen_to_float_and_yaml_numbers_parse():
    c = configs.parse(yaml.safe_load("{name: dqn, learning_rate: 1, gamma: 0.98}"))
    assert c.learning_rate == 1.0 and isinstance(c.learning_rate, float)


def test_make_builds_from_the_typed_config():
    obs, act = gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2)
    c = configs.parse({"name": "dqn", "fc_layer_params": [16], "n_step": 3, "gamma": 0.9})
    alg = algorithms.make(c, obs, act, "cpu")
    assert alg.mini_batch_length == 4 and alg.td_loss.gamma == 0.9
    assert alg.q_network.encoder.output_size == 16
    rnd = algorithms.make(configs.parse({"name": "random", "seed": 3}), obs, act)
    assert rnd.policy_state_dict() == {}


def _algorithm_blocks(node, path=""):
    if isinstance(node, dict):
        for k, v in node.items():
            here = f"{path}.{k}" if path else str(k)
            if k == "algorithm" and isinstance(v, dict):
                yield here, v
            else:
                yield from _algorithm_blocks(v, here)


def test_every_shipped_graph_algorithm_block_parses():
    from pipeline.graphyaml import read_value  # the graphs' YAML 1.2 numbers (3e-4 a float)

    found = 0
    for graph in sorted((ROOT / "graphs").glob("*.yaml")):
        doc = read_value(graph.read_text())
        for where, block in _algorithm_blocks(doc):  # the agent: section, or a node's config
            configs.parse(block, f"{graph.name}:{where}")
            found += 1
    assert found >= 10


def test_configs_module_does_not_import_torch():
    code = ("import sys, algorithms.configs as c; c.parse({'name': 'sac'}); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
