import io

import gymnasium as gym
import numpy as np
import pytest
import torch

import algorithms
from algorithms.data import Experience, StepType, TimeStep
from algorithms.data_transformer import (
    FrameStacker,
    ImageScaleTransformer,
    ObservationNormalizer,
    RewardClipping,
    RewardNormalizer,
    RewardScaling,
    SequentialDataTransformer,
)

F, M, L = int(StepType.FIRST), int(StepType.MID), int(StepType.LAST)
OBS2 = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)


def ts(obs, st=None, reward=None):
    obs = np.asarray(obs, np.float32)
    b = obs.shape[0]
    return TimeStep(step_type=np.full(b, M) if st is None else np.asarray(st),
                    reward=np.zeros(b, np.float32) if reward is None else np.asarray(reward, np.float32),
                    discount=np.ones(b, np.float32), observation=obs)


def test_observation_normalizer_statistics_and_clipping():
    norm = ObservationNormalizer(OBS2, clipping=1.5, update_mode="rollout")
    data = np.array([[0.0, 10.0], [2.0, 10.0], [4.0, 40.0], [6.0, 40.0]], np.float32)
    norm.transform_timestep(ts(data[:2]))
    out, _ = norm.transform_timestep(ts(data[2:]))
    torch.testing.assert_close(norm.stats.mean, torch.tensor([3.0, 25.0], dtype=torch.float64))
    torch.testing.assert_close(norm.stats.var, torch.tensor([5.0, 225.0], dtype=torch.float64))
    expected = (data[2:] - [3.0, 25.0]) / np.sqrt([5.0, 225.0])
    torch.testing.assert_close(out.observation, torch.tensor(expected.clip(-1.5, 1.5), dtype=torch.float32),
                               rtol=1e-5, atol=1e-5)


def test_observation_normalizer_replay_mode_updates_only_on_experience():
    norm = ObservationNormalizer(OBS2)
    norm.transform_timestep(ts(np.ones((3, 2))))
    assert float(norm.stats.count) == 0
    exp = Experience(observation=np.arange(12, dtype=np.float32).reshape(2, 3, 2))
    norm.transform_experience(exp)
    assert float(norm.stats.count) == 6


def test_reward_transformers():
    t = ts(np.zeros((3, 2)), reward=[-3.0, 0.5, 2.0])
    torch.testing.assert_close(RewardClipping().transform_timestep(t)[0].reward,
                               torch.tensor([-1.0, 0.5, 1.0]))
    torch.testing.assert_close(RewardScaling(scale=0.1).transform_timestep(t)[0].reward,
                               torch.tensor([-0.3, 0.05, 0.2]))
    rn = RewardNormalizer(update_mode="rollout", clip_value=1.0, update_max_calls=1)
    out = rn.transform_timestep(t)[0].reward
    std = np.std([-3.0, 0.5, 2.0])
    torch.testing.assert_close(out, torch.tensor(np.clip([-3 / std, 0.5 / std, 2 / std], -1, 1),
                                                 dtype=torch.float32), rtol=1e-5, atol=1e-5)
    rn.transform_timestep(ts(np.zeros((1, 2)), reward=[100.0]))
    assert int(rn.update_calls) == 1  # update_max_calls reached: statistics frozen


def test_image_scale():
    t = ts(np.array([[0, 255]], np.uint8))
    torch.testing.assert_close(ImageScaleTransformer().transform_timestep(t)[0].observation,
                               torch.tensor([[-1.0, 1.0]]))


def test_frame_stacker_resets_at_first():
    fs = FrameStacker(stack_size=3, stack_axis=0)
    # one env, observation [1]; episode boundary: FIRST at t=3
    frames = [(F, 1.0), (M, 2.0), (L, 3.0), (F, 10.0), (M, 11.0)]
    state = fs.get_initial_state(1)
    outs = []
    for st, o in frames:
        out, state = fs.transform_timestep(ts(np.array([[o]]), st=[st]), state)
        outs.append(out.observation[0].tolist())
    assert outs == [[1, 1, 1], [1, 1, 2], [1, 2, 3], [10, 10, 10], [10, 10, 11]]
    # replay path: [B=1, T=5] -> [1, 3] rows, same stacks as the rollout path for rows 2..4
    exp = Experience(step_type=np.array([[f[0] for f in frames]]),
                     reward=np.zeros((1, 5), np.float32),
                     observation=np.array([[[f[1]] for f in frames]], np.float32))
    out = fs.transform_experience(exp)
    assert out.observation[0].tolist() == outs[2:]
    assert out.step_type.shape == (1, 3)


def test_sequential_and_registry_and_checkpoint():
    seq = algorithms.make_transformer(
        [("observation_normalizer", {"update_mode": "rollout"}), ("reward_scaling", {"scale": 2.0})],
        OBS2)
    assert isinstance(seq, SequentialDataTransformer)
    state = seq.get_initial_state(2)
    out, state = seq.transform_timestep(ts(np.array([[1.0, 2.0], [3.0, 4.0]]), reward=[1, 2]),
                                        state)
    torch.testing.assert_close(out.reward, torch.tensor([2.0, 4.0]))
    buf = io.BytesIO()
    torch.save(seq.state_dict(), buf)
    buf.seek(0)
    other = algorithms.make_transformer(
        [("observation_normalizer", {"update_mode": "rollout"}), ("reward_scaling", {"scale": 2.0})],
        OBS2)
    other.load_state_dict(torch.load(buf, weights_only=True))
    for (k, a), (_, b) in zip(seq.state_dict().items(), other.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)
    with pytest.raises(ValueError, match="unknown transformer"):
        algorithms.make_transformer("nope", OBS2)
