"""``bench/learning.py`` gives SB3 the hyperparameters and the algorithm of the graph it compares
with: the bench refuses a DQN graph that drifts from its preset, SB3 runs DQN with double Q where
ours has it, and for MinAtar (``dqn MinAtar/Breakout --graph graphs/dqn_minatar.yaml``) the SB3 side
sees the graph's observations (uint8 ``[4, 10, 10]``) through the same network shape."""

from pathlib import Path

import numpy as np
import pytest

from algorithms.envs import minatar
from tests.bench_scripts import load_bench

ROOT = Path(__file__).resolve().parents[1]
GRAPH = ROOT / "graphs" / "dqn_minatar.yaml"


@pytest.fixture(scope="module")
def bench():
    return load_bench("learning", "bench_learning")


def test_the_short_id_names_the_graphs_preset(bench):
    p = bench.preset("dqn", "MinAtar/Breakout")
    assert p.env_id == "MinAtar/Breakout-v1" and p.threshold == 8.0 and p.budget == 1_000_000
    bench.check_graph(str(GRAPH), p)  # the shipped graph matches


@pytest.mark.parametrize("old,new", [
    ("learning_rate: 0.0003", "learning_rate: 0.0005"),
    ("n_step: 3", "n_step: 1"),
    ("samples_per_insert: 8", "samples_per_insert: 4"),
    ("num_envs: 16, seed: 0", "num_envs: 8, seed: 0"),
])
def test_a_graph_that_differs_from_the_preset_is_refused(bench, tmp_path, old, new):
    text = GRAPH.read_text()
    assert old in text
    changed = tmp_path / "dqn_minatar.yaml"
    changed.write_text(text.replace(old, new))
    with pytest.raises(SystemExit, match="differ"):
        bench.check_graph(str(changed), bench.preset("dqn", "MinAtar/Breakout"))


@pytest.mark.skipif(not minatar.installed(), reason="needs the [minatar] extra")
def test_sb3_side_gets_the_graphs_frames_and_network(bench):
    pytest.importorskip("stable_baselines3")
    import torch

    env = bench._MinAtarGym("MinAtar/Breakout-v1")
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.uint8 and obs.shape == (4, 10, 10)
    obs, reward, terminated, truncated, _ = env.step(0)
    assert obs.shape == (4, 10, 10) and isinstance(reward, float)
    extractor = bench._minatar_cnn_extractor()(env.observation_space)
    assert extractor.features_dim == 16 * 8 * 8
    assert extractor(torch.zeros(2, 4, 10, 10)).shape == (2, 1024)


def test_sb3_evaluates_as_often_as_the_graphs_evaluator(bench):
    assert bench.graph_eval_interval(str(ROOT / "graphs" / "dqn_cartpole.yaml")) == 1000
    assert bench.graph_eval_interval(str(GRAPH)) == 25_000


def test_the_graphs_clock_stops_when_the_evaluated_parameters_arrived(bench):
    """SB3's clock leaves its evaluations out; the graph's leaves out the evaluation that
    reached the threshold: its result's arrival less ``eval/seconds``."""
    assert bench._evaluated_at({"time": 100.0, "eval/seconds": 1.5}) == 98.5
    assert bench._evaluated_at({"time": 100.0}) == 100.0  # runs recorded before eval/seconds


def test_cartpole_dqn_graph_matches_its_preset(bench):
    bench.check_graph(str(ROOT / "graphs" / "dqn_cartpole.yaml"), bench.preset("dqn", "CartPole-v1"))


@pytest.mark.parametrize("double_q", [None, True, False])
def test_sb3_runs_the_same_dqn_as_ours(bench, double_q):
    """Ours computes the Double-DQN target unless ``double_q: false``: SB3 then gets its DQN
    with that target, else its own DQN (which has none)."""
    pytest.importorskip("stable_baselines3")
    import dataclasses

    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env

    p = bench.preset("dqn", "CartPole-v1")
    if double_q is not None:
        p = dataclasses.replace(p, algorithm=dataclasses.replace(p.algorithm,
                                                                 double_q=double_q))
    model = bench._sb3_model(p, make_vec_env("CartPole-v1", n_envs=1, seed=0), 0)
    assert (type(model) is DQN) == (double_q is False), type(model)
    assert isinstance(model, DQN)
