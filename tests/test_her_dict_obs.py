"""Goal-conditioned ``Dict`` observations through every hop but the processes: the stepper,
the wire's flat fields and the codec, the experience schema, the replay buffer, the
concatenating transformer, SAC's update, and the evaluation's success rate (FetchReach-v4,
a real Gymnasium-Robotics env)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import algorithms
import nodes.messages  # noqa: F401 - registers the RL messages with the codec
from algorithms.configs import parse
from algorithms.data import Experience
from algorithms.data_transformer import ObservationConcat, make_transformer
from algorithms.evaluation import evaluate
from algorithms.schema import SchemaError, agent_schema
from algorithms.steps import (
    StepType,
    TimeStep,
    VectorEnvStepper,
    flat_fields,
    make_vector_env,
    nested_fields,
)
from nodes.messages import ExperienceBatch, TimeStepBatch
from pipeline.codec import decode, encode
from storage import ReplayBuffer, TensorSpec

pytest.importorskip("gymnasium_robotics")

ENV = "FetchReach-v4"
KEYS = ("achieved_goal", "desired_goal", "observation")
SHAPES = {"achieved_goal": (3,), "desired_goal": (3,), "observation": (10,)}


def sac(**extra):
    config = parse({"name": "sac", "actor_fc_layer_params": [32, 32],
                    "critic_fc_layer_params": [32, 32], **extra}, "agent.algorithm")
    space = algorithms.envs.env_spaces(ENV)
    return config, space, algorithms.make(config, *space)


@pytest.fixture(scope="module")
def stepped():
    """Two steps of two FetchReach envs: the reset and one random step."""
    env = make_vector_env(ENV, 2, seed=0, training=True)
    stepper = VectorEnvStepper(env, 0)
    first = stepper.reset()
    second = stepper.step(env.action_space.sample())
    env.close()
    return first, second


def test_the_stepper_keeps_the_dict_as_float32(stepped):
    first, second = stepped
    for ts in (first, second):
        assert isinstance(ts.observation, dict) and tuple(sorted(ts.observation)) == KEYS
        for key, value in ts.observation.items():
            assert value.dtype == np.float32 and value.shape == (2, *SHAPES[key]), key
    assert not np.array_equal(first.observation["observation"],
                              second.observation["observation"])


def test_time_steps_cross_the_codec_as_flat_fields(stepped):
    _, ts = stepped
    fields = flat_fields(ts._asdict())
    assert {f"observation.{k}" for k in KEYS} <= set(fields) and "observation" not in fields
    envelope = decode(encode(TimeStepBatch("env_runner.0", 4, fields), "env_runner.0", 1))
    got = nested_fields(envelope.message.time_step)
    for key in KEYS:
        np.testing.assert_array_equal(got["observation"][key], ts.observation[key])
    np.testing.assert_array_equal(got["step_type"], ts.step_type)
    assert nested_fields(flat_fields(ts._asdict())).keys() == ts._asdict().keys()


def test_experience_and_its_schema(stepped):
    _, ts = stepped
    config, (obs_space, act_space), _ = sac()
    schema = agent_schema(config, obs_space, act_space)
    assert "observation" not in schema.fields
    assert {k: schema.fields[f"observation.{k}"].shape for k in KEYS} == SHAPES
    exp = Experience(*ts, action=np.zeros((2, 4), np.float32), rollout_info={})
    rows = {k: v for k, v in exp.to_dict().items() if not (isinstance(v, tuple) and v == ())}
    schema.check(rows, 1, "test")
    # Through the codec as the unroller sends it, and back to an Experience.
    batch = decode(encode(ExperienceBatch(ts.env_id, rows, 3), "unroller.0", 1)).message
    back = Experience.from_dict(dict(batch.experience))
    for key in KEYS:
        np.testing.assert_array_equal(back.observation[key], ts.observation[key])
    # A producer that sends the dict's field in the wrong dtype is named at the first batch.
    wrong = dict(rows, **{"observation.desired_goal": rows["observation.desired_goal"]
                          .astype(np.float64)})
    with pytest.raises(SchemaError, match="observation.desired_goal.*float32"):
        schema.check(wrong, 1, "unroller: experience")


def test_the_replay_buffer_keeps_the_fields_apart(stepped):
    first, second = stepped
    spec = None
    buffer = None
    for ts in (first, second, first):
        rows = flat_fields({**ts._asdict(), "action": np.zeros((2, 4), np.float32)})
        if buffer is None:
            spec = {k: TensorSpec(v.shape[1:], torch.from_numpy(np.asarray(v[:1])).dtype)
                    for k, v in rows.items()}
            buffer = ReplayBuffer(spec, 2, 10, keep_episodic_info=True)
        buffer.add_batch(rows, np.arange(2))
    data, info = buffer.get_batch(4, 2)
    assert data["observation.desired_goal"].shape == (4, 2, 3)
    goal = buffer.get_field("observation.achieved_goal", info.env_ids, info.positions)
    assert goal.shape == (4, 3)
    state = buffer.state_dict()
    again = ReplayBuffer(spec, 2, 10, keep_episodic_info=True)
    again.load_state_dict(state)
    torch.testing.assert_close(again.get_field("observation.achieved_goal", info.env_ids,
                                               info.positions), goal)


def test_concatenation_in_the_configured_order():
    space = gym.spaces.Dict({k: gym.spaces.Box(-1, 1, SHAPES[k], np.float64) for k in KEYS})
    obs = {k: torch.full((5, 7, *SHAPES[k]), float(i)) for i, k in enumerate(KEYS)}
    chosen = ObservationConcat(space, ["observation", "desired_goal"])
    out = chosen.concat(obs)
    assert out.shape == (5, 7, 13) and out.dtype == torch.float32
    assert (out[..., :10] == 2).all() and (out[..., 10:] == 1).all()
    assert chosen.transformed_space(space).shape == (13,)
    every = make_transformer("observation_concat", space)  # all keys, sorted
    assert every.keys == sorted(KEYS) and every.concat(obs).shape == (5, 7, 16)
    with pytest.raises(ValueError, match="no key 'goal'"):
        ObservationConcat(space, ["goal"])
    with pytest.raises(ValueError, match="needs a Dict"):
        ObservationConcat(gym.spaces.Box(-1, 1, (3,)))


def test_a_dict_space_gets_the_concatenation_by_itself():
    _, _, alg = sac()
    assert alg.input_space.shape == (16,)
    _, _, chosen = sac(data_transformers=[
        {"name": "observation_concat", "keys": ["observation", "desired_goal"]},
        {"name": "observation_normalizer", "clipping": 5.0}])
    assert chosen.input_space.shape == (13,)
    with pytest.raises(ValueError, match="observation_concat must come first"):
        sac(data_transformers=[{"name": "observation_normalizer"},
                               {"name": "observation_concat"}])


def test_sac_acts_and_trains_on_dict_observations(stepped):
    torch.manual_seed(0)
    _, ts = stepped
    _, _, alg = sac(data_transformers=[
        {"name": "observation_concat", "keys": ["observation", "desired_goal"]},
        {"name": "observation_normalizer", "clipping": 5.0}])
    step = alg.rollout_step(ts)
    assert step.output.shape == (2, 4)
    b, t = 8, 2
    rng = np.random.default_rng(0)
    rows = {"step_type": np.full((b, t), int(StepType.MID), np.int64),
            "reward": -np.ones((b, t), np.float32), "discount": np.ones((b, t), np.float32),
            "prev_action": np.zeros((b, t, 4), np.float32),
            "env_id": np.zeros((b, t), np.int64),
            "action": rng.uniform(-1, 1, (b, t, 4)).astype(np.float32),
            **{f"observation.{k}": rng.normal(size=(b, t, *SHAPES[k])).astype(np.float32)
               for k in KEYS}}
    before = [p.clone() for p in alg.actor_network.parameters()]
    result = alg.train_on(Experience.from_dict(rows))
    assert np.isfinite(result.metrics["loss/total"])
    assert any(not torch.equal(p, q) for p, q in zip(before, alg.actor_network.parameters(),
                                                      strict=True))
    # The normalizer learned the concatenated vector's statistics (13 values).
    stats = alg.policy_state_dict()["data_transformer.transformers.1.stats.mean"]
    assert stats.shape == (13,) and stats.abs().sum() > 0


def test_evaluation_reports_the_success_rate():
    _, _, alg = sac()
    result = evaluate(alg, ENV, num_episodes=3, seed=0)
    assert result.mean_length == 50.0  # Fetch envs only truncate, at 50 steps
    assert result.success_rate is not None and 0.0 <= result.success_rate <= 1.0
    # A policy that never moves succeeds exactly where the goal starts within reach; the
    # env's own verdict at the last step decides, and a Box-observation env reports none.
    assert evaluate(alg, ENV, 3, seed=0) == result  # seeded
    from algorithms.configs import RandomConfig
    from algorithms.random_policy import RandomPolicy

    pendulum = RandomPolicy(None, gym.spaces.Box(-2, 2, (1,), np.float32), RandomConfig(seed=0))
    assert evaluate(pendulum, "Pendulum-v1", 2, seed=0).success_rate is None


class _ToGoal:
    """Moves the gripper straight to the desired goal: FetchReach's solved policy."""

    def predict_step(self, time_step: TimeStep, state=()):
        from algorithms.data import AlgStep

        obs = time_step.observation
        delta = (obs["desired_goal"] - obs["achieved_goal"]) * 10.0
        action = np.concatenate([np.clip(delta, -1, 1), np.zeros((len(delta), 1))], -1)
        return AlgStep(output=action.astype(np.float32), state=state, info={})


def test_a_policy_that_reaches_the_goal_succeeds():
    """The success rate is the env's ``is_success`` at the episodes' ends: 1.0 for the
    policy that reaches every goal, 0.0 for one that moves away from it."""
    assert evaluate(_ToGoal(), ENV, 4, seed=0).success_rate == 1.0

    class _Away(_ToGoal):
        def predict_step(self, time_step, state=()):
            step = super().predict_step(time_step, state)
            return step._replace(output=-step.output)

    assert evaluate(_Away(), ENV, 4, seed=0).success_rate == 0.0
