"""Recurrent PPO (``rnn_size``): the GRU state is carried per environment by whoever acts,
zeroed where an episode starts, and training re-runs the GRU from the state each unroll
started from, so the log-probabilities it computes before any update are the rollout's.
Through the graph: the unroller (and an actor) keep each env's state apart while batching
several runners' env groups."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import pytest
import torch

import algorithms
from algorithms.configs import PpoConfig, parse
from algorithms.data import Experience, StepType, make_experience
from algorithms.envs import env_spaces
from algorithms.evaluation import evaluate
from algorithms.value_ops import valid_mask
from nodes._agent import Agent, agent_field
from pipeline import graph as graphlib
from pipeline.inloop import run_graph
from tests.test_alg_interface import _time_step
from typedconfig import ConfigError

OBS, ACTIONS = env_spaces("CartPoleNoVelocity-v1")
SMALL = dict(rnn_size=8, actor_fc_layer_params=(8,), value_fc_layer_params=(8,),
             mini_batch_size=64, num_epochs=1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_cartpole_no_velocity_shows_position_and_angle_only():
    full, masked = gym.make("CartPole-v1"), gym.make("CartPoleNoVelocity-v1")
    obs_full, _ = full.reset(seed=3)
    obs_masked, _ = masked.reset(seed=3)
    assert masked.observation_space.shape == (2,)
    np.testing.assert_array_equal(obs_masked, obs_full[[0, 2]])
    assert masked.spec.max_episode_steps == 500


def test_the_state_is_per_env_and_zeroed_where_an_episode_starts():
    alg = algorithms.make(PpoConfig(**SMALL), OBS, ACTIONS)
    assert alg.get_initial_state(3).shape == (3, 16)  # actor's and value's cells side by side
    rng = np.random.default_rng(0)
    ts = _time_step(OBS, ACTIONS, 3, rng, StepType.MID)
    carried = torch.randn(3, 16)
    step = alg.rollout_step(ts, carried)
    assert step.state.shape == (3, 16) and not torch.equal(step.state, carried)
    torch.testing.assert_close(step.info["state"], carried)  # what training starts from
    first = ts._replace(step_type=np.array([StepType.FIRST, StepType.MID, StepType.FIRST]))
    again = alg.predict_step(first, carried)
    fresh = alg.predict_step(first, alg.get_initial_state(3))
    torch.testing.assert_close(again.state[[0, 2]], fresh.state[[0, 2]])
    assert not torch.allclose(again.state[1], fresh.state[1])


def _recurrent_unroll(alg, T: int, B: int, seed: int = 0) -> Experience:
    """``[T, B]`` rows acted on in order with the state carried, starting mid-episode (from
    a state of earlier steps), episodes ending and starting inside."""
    rng = np.random.default_rng(seed)
    state, rows = torch.randn(alg.get_initial_state(B).shape), []
    for t in range(T):
        step_type = np.full(B, StepType.MID)
        step_type[(np.arange(B) + t) % 5 == 0] = StepType.FIRST
        step_type[(np.arange(B) + t) % 5 == 4] = StepType.LAST
        ts = _time_step(OBS, ACTIONS, B, rng, StepType.MID)._replace(step_type=step_type)
        step = alg.rollout_step(ts, state)
        state = step.state
        rows.append({k: (v.cpu().numpy() if isinstance(v, torch.Tensor) else v)
                     for k, v in make_experience(ts, step).to_dict().items()})
    return Experience.from_dict({k: np.stack([r[k] for r in rows]) for k in rows[0]})


def _replayed(alg, unroll: Experience) -> tuple[torch.Tensor, torch.Tensor]:
    """(recomputed, rollout) log-probabilities and values of every trained row, side by side,
    as training sees them. The values tell states apart more sharply: the policy head starts
    near uniform (its last layer scaled by 0.01)."""
    exp = alg._experience(unroll)
    keep = valid_mask(exp.step_type).bool()
    info = exp.rollout_info
    targets = {"log_prob": info["log_prob"][:-1], "value": info["value"][:-1]}
    replay = alg._train_columns(exp, keep, targets, torch.arange(keep.shape[1]))
    rollout = replay["rollout"]
    return (torch.cat([replay["log_prob"], replay["value"]]),
            torch.cat([rollout["log_prob"], rollout["value"]]))


def test_training_starts_where_the_rollout_did():
    alg = algorithms.make(PpoConfig(**SMALL), OBS, ACTIONS)
    recomputed, rollout = _replayed(alg, _recurrent_unroll(alg, 12, 5))
    torch.testing.assert_close(recomputed, rollout)
    # From zeros instead of the state of the earlier steps: other probabilities.
    zeroed = _recurrent_unroll(alg, 12, 5)
    info = dict(zeroed.rollout_info, state=np.zeros_like(zeroed.rollout_info["state"]))
    assert not torch.allclose(*_replayed(alg, zeroed._replace(rollout_info=info)))


def test_train_on_uses_whole_columns_and_changes_every_cell():
    alg = algorithms.make(PpoConfig(**{**SMALL, "mini_batch_size": 22}), OBS, ACTIONS)
    before = {k: v.clone() for k, v in alg.rnn.state_dict().items()}
    result = alg.train_on(_recurrent_unroll(alg, 12, 5))  # 22 // 11 rows: 2 columns a batch
    assert np.isfinite(result.metrics["loss/total"])
    for k, v in alg.rnn.state_dict().items():
        assert not torch.equal(v, before[k]), k
    assert "rnn.actor.weight_ih" in alg.policy_state_dict()


def test_feed_forward_ppo_is_unchanged():
    alg = algorithms.make(PpoConfig(actor_fc_layer_params=[8], value_fc_layer_params=[8]),
                          OBS, ACTIONS)
    assert alg.get_initial_state(4) == () and alg.rnn is None
    step = alg.rollout_step(_time_step(OBS, ACTIONS, 4, np.random.default_rng(0)), ())
    assert step.state == () and "state" not in step.info


def test_evaluation_carries_the_state():
    alg = algorithms.make(PpoConfig(**SMALL), OBS, ACTIONS)
    result = evaluate(alg, "CartPoleNoVelocity-v1", num_episodes=3)
    assert result.mean_length > 0


def test_rnn_size_is_checked_at_load():
    with pytest.raises(ConfigError, match="rnn_size"):
        parse({"name": "ppo", "rnn_size": 0})
    assert parse({"name": "ppo", "rnn_size": 64}).rnn_size == 64


ALGORITHM = "{name: ppo, rnn_size: 8, actor_fc_layer_params: [8], value_fc_layer_params: [8]}"


def _graph(acting: str, stop_when: str) -> str:
    """A graph of the ``acting`` nodes (YAML), which publish ``trajectories`` for the replay
    checker in the learner's place."""
    return f"""
name: recurrent_unrolls
agent: {{env_id: CartPoleNoVelocity-v1, algorithm: {ALGORITHM}}}
topics:
  trajectories: {{delivery: reliable, hwm: 4}}
  params: {{delivery: latest, hwm: 4}}
nodes:
{acting}
  learner:
    kind: "tests.test_alg_ppo_recurrent:replay_checker"
    subscribes: [trajectories]
    publishes: [params]
run:
  stop_when: [{stop_when}, learner]
  duration_s: 100
"""


RUNNERS = _graph("""
  runner_a:
    kind: env_runner
    config: {num_envs: 4, env_groups: 2, max_steps: 240, seed: 1}
    calls: [policy]
  runner_b:
    kind: env_runner
    config: {num_envs: 2, max_steps: 240, seed: 2}
    calls: [policy]
  unroller:
    kind: unroller
    config: {unroll_length: 8}
    serves: [policy]
    subscribes: [params]
    publishes: [trajectories]""", "runner_a, runner_b")

ACTOR = _graph("""
  actor:
    kind: actor
    config: {num_envs: 4, env_groups: 2, max_steps: 480, unroll_length: 8}
    subscribes: [params]
    publishes: [trajectories]""", "actor")


async def replay_checker(config, node, ready):
    """A test kind in a PPO learner's place: publishes one set of parameters after each
    unroll (without training), and replays each unroll as training would, from the state
    its first row started from: a row whose log-probability or value differs was acted on
    with another env's state, or with none."""
    from nodes._common import make_algorithm, to_torch
    from nodes.messages import Params

    alg = make_algorithm(config.agent, "cpu")  # the graph's agent, as the unroller's
    params, unrolls = node.bus.publisher("params"), node.bus.subscriber("trajectories")
    ready()
    version, counts = 0, {"unrolls": 0, "rows": 0, "differ": 0, "episodes_started": 0}
    await params.send(Params(version, 0, alg.policy_params()))
    while (envelope := await node.wait_or_stop(unrolls.recv())) is not None:
        unroll = Experience.from_dict(to_torch(envelope.message.experience))
        with torch.no_grad():
            recomputed, rollout = _replayed(alg, unroll)
        counts["unrolls"] += 1
        counts["rows"] += len(rollout)
        counts["differ"] += int(((recomputed - rollout).abs() > 1e-5).sum())
        counts["episodes_started"] += int((unroll.step_type[1:] == StepType.FIRST).sum())
        version += 1
        await params.send(Params(version, 0, alg.policy_params()))
    return counts


@dataclass(frozen=True)
class _CheckerConfig:
    agent: Agent = agent_field()


replay_checker.Config = _CheckerConfig  # a user kind takes the graph's agent section too


@pytest.mark.timeout(120)
@pytest.mark.parametrize("text", [RUNNERS, ACTOR], ids=["unroller", "actor"])
def test_each_env_keeps_its_own_state_through_the_graph(tmp_path, text):
    """Two runners (one in two env groups) share the unroller's batches; an actor batches its
    own groups. Every row the unroll checker replays matches the rollout, episodes ending
    inside unrolls included."""
    graph = graphlib.parse(text, "recurrent.yaml")
    summaries = asyncio.run(asyncio.wait_for(run_graph(graph, str(tmp_path)), 110))
    counts = summaries["learner.0"]
    assert counts["unrolls"] >= 20 and counts["episodes_started"] > 0, counts
    assert counts["differ"] == 0, counts
