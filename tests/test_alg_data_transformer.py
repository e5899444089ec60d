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


# ----- transformers inside an algorithm (built from its config) ---------------------------------
from algorithms import configs  # noqa: E402

OBS3 = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
TRANSFORMERS = [{"name": "observation_normalizer", "clipping": 5.0},
                {"name": "reward_clipping", "minmax": [-1, 1]},
                {"name": "reward_scaling", "scale": 0.1}, {"name": "reward_normalizer"}]


def _alg(name="dqn", transformers=TRANSFORMERS, obs=OBS3, act=None, **kw):
    act = act or gym.spaces.Discrete(2)
    cfg = configs.parse({"name": name, "data_transformers": transformers, **kw})
    torch.manual_seed(0)
    return algorithms.make(cfg, obs, act, "cpu")


def _replay_batch(rng, B=8, T=2, scale=10.0, shift=3.0):
    st = np.full((B, T), M)
    st[:, 0] = F
    return Experience(step_type=st, reward=rng.standard_normal((B, T)).astype(np.float32) * 5,
                      discount=np.ones((B, T), np.float32),
                      observation=(rng.standard_normal((B, T, 3)) * scale + shift)
                      .astype(np.float32),
                      action=rng.integers(0, 2, (B, T)))


def test_learner_statistics_reach_unroller_and_evaluator_through_policy_params():
    learner, unroller, evaluator = _alg(), _alg(), _alg()
    rng = np.random.default_rng(0)
    batch = _replay_batch(rng)
    raw_obs = batch.observation.copy()
    learner.train_on(batch)
    # The learner updated its statistics from its training data, and left the batch raw.
    assert float(learner.data_transformer.transformers[0].stats.count) == 16
    np.testing.assert_array_equal(batch.observation, raw_obs)
    params = learner.policy_state_dict()
    assert {"data_transformer.transformers.0.stats.mean", "data_transformer.transformers.0.stats.var",
            "data_transformer.transformers.0.stats.count",
            "data_transformer.transformers.3.stats.var",
            "data_transformer.transformers.3.update_calls"} <= set(params)
    unroller.load_policy_state_dict({k: v.numpy() for k, v in params.items()})
    evaluator.load_policy_state_dict(learner.policy_params())  # packed: float64 and int64 too
    probe = ts(np.array([[1.0, -2.0, 30.0], [3.0, 3.0, 3.0]]))
    views = [a.transform_timestep(probe)[0].observation for a in (learner, unroller, evaluator)]
    expected = np.clip((probe.observation - raw_obs.reshape(-1, 3).mean(0))
                       / (raw_obs.reshape(-1, 3).std(0) + 1e-8), -5, 5)
    torch.testing.assert_close(views[0], torch.tensor(expected, dtype=torch.float32))
    for v in views[1:]:
        torch.testing.assert_close(v, views[0], rtol=0, atol=0)
    # Acting only applies the statistics: the unroller's and evaluator's do not move.
    for _ in range(3):
        unroller.rollout_step(probe)
        evaluator.predict_step(probe)
    for a in (unroller, evaluator):
        assert float(a.data_transformer.transformers[0].stats.count) == 16
    torch.testing.assert_close(unroller.predict_step(probe).output,
                               learner.predict_step(probe).output)


def test_an_untrained_unroller_acts_on_what_the_networks_see():
    # Before any parameters arrive the statistics are the identity (mean 0, var 1).
    alg = _alg()
    probe = ts(np.array([[1.0, -2.0, 7.0]]))
    torch.testing.assert_close(alg.transform_timestep(probe)[0].observation,
                               torch.tensor([[1.0, -2.0, 5.0]]))


def test_normalizer_statistics_survive_a_checkpoint():
    alg = _alg()
    rng = np.random.default_rng(1)
    for _ in range(3):
        alg.train_on(_replay_batch(rng))
    buf = io.BytesIO()
    torch.save(alg.checkpoint_state(), buf)
    buf.seek(0)
    restored = _alg()
    restored.load_checkpoint_state(torch.load(buf, weights_only=True))
    for key in ("data_transformer.transformers.0.stats.mean",
                "data_transformer.transformers.0.stats.var",
                "data_transformer.transformers.3.stats.var"):
        torch.testing.assert_close(restored.state_dict()[key], alg.state_dict()[key],
                                   rtol=0, atol=0)
    assert float(restored.data_transformer.transformers[0].stats.count) == 48
    probe = ts(np.array([[0.5, 9.0, -4.0]]))
    torch.testing.assert_close(restored.transform_timestep(probe)[0].observation,
                               alg.transform_timestep(probe)[0].observation, rtol=0, atol=0)


def test_reward_transformers_shape_the_training_targets():
    # Clipping then scaling: a reward of 50 trains like 0.1 (DQN's TD target r + gamma * ...).
    alg = _alg(transformers=[{"name": "reward_clipping", "minmax": [-1, 1]},
                             {"name": "reward_scaling", "scale": 0.1}], gamma=0.5)
    batch = _replay_batch(np.random.default_rng(2))
    batch = batch._replace(reward=np.full_like(batch.reward, 50.0))
    exp = alg._experience(batch)
    torch.testing.assert_close(exp.reward, torch.full((8, 2), 0.1))


def test_frame_stacker_in_an_algorithm():
    img = gym.spaces.Box(0, 255, (6, 6, 1), np.uint8)
    alg = _alg(transformers=[{"name": "frame_stacker", "stack_size": 3}], obs=img,
               encoder="minatar_cnn", fc_layer_params=[8])
    assert alg.input_space.shape == (6, 6, 3) and alg.input_space.dtype == np.uint8
    assert alg.mini_batch_length == 2 + 2  # two rows of history before the trained window
    # Acting: history per env id (the unroller passes state ()).
    frame = lambda v, st, ids: TimeStep(  # noqa: E731
        step_type=np.array(st), observation=np.full((len(ids), 6, 6, 1), v, np.uint8),
        env_id=np.array(ids))
    alg.rollout_step(frame(1, [F, F], [0, 5]))
    alg.rollout_step(frame(2, [M], [5]))
    out = alg.transform_timestep(frame(3, [M, M], [0, 5]))[0].observation
    assert out.dtype == torch.uint8
    assert out[0, 0, 0].tolist() == [1, 1, 3] and out[1, 0, 0].tolist() == [1, 2, 3]
    # Training: a [B, 4] raw window becomes [B, 2] stacked rows.
    rng = np.random.default_rng(3)
    B = 4
    batch = Experience(step_type=np.tile([F, M, M, M], (B, 1)),
                       reward=np.zeros((B, 4), np.float32), discount=np.ones((B, 4), np.float32),
                       observation=rng.integers(0, 256, (B, 4, 6, 6, 1), dtype=np.uint8),
                       action=rng.integers(0, 2, (B, 4)))
    exp = alg._experience(batch)
    assert exp.observation.shape == (B, 2, 6, 6, 3) and exp.observation.dtype == torch.uint8
    assert np.isfinite(alg.train_on(batch).metrics["loss/total"])


@pytest.mark.parametrize("name", ["ppo", "a2c"])
def test_on_policy_unrolls_keep_every_row(name):
    alg = _alg(name, [{"name": "observation_normalizer"}, {"name": "frame_stacker",
                                                           "stack_size": 2}],
               actor_fc_layer_params=[4], value_fc_layer_params=[4])
    assert alg.input_space.shape == (6,)
    T, B = 5, 3
    rng = np.random.default_rng(4)
    st = np.full((T, B), M)
    st[0] = F
    unroll = Experience(step_type=st, reward=np.ones((T, B), np.float32),
                        discount=np.ones((T, B), np.float32),
                        observation=rng.standard_normal((T, B, 3)).astype(np.float32),
                        action=rng.integers(0, 2, (T, B)),
                        rollout_info={"log_prob": np.full((T, B), -0.7, np.float32),
                                      "value": np.zeros((T, B), np.float32)})
    exp = alg._experience(unroll)
    assert exp.observation.shape == (T, B, 6) and exp.step_type.shape == (T, B)
    # Row 1 stacks rows 0 and 1 of the same env (normalized with the updated statistics).
    norm = alg.data_transformer.transformers[0].normalize
    torch.testing.assert_close(exp.observation[1, 2], torch.cat(
        [norm(unroll.observation[0, 2:3])[0], norm(unroll.observation[1, 2:3])[0]]))
    assert np.isfinite(alg.train_on(unroll).metrics["loss/total"])


def test_on_policy_frame_stacks_follow_each_env_across_unrolls():
    """The learner stacks an unroll's first rows as the unroller did when it acted on them:
    consecutive unrolls overlap by their bootstrap row, and the history is kept per env id."""
    one = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    kw = dict(obs=one, actor_fc_layer_params=[4], value_fc_layer_params=[4])
    learner = _alg("ppo", [{"name": "frame_stacker", "stack_size": 3}], **kw)
    unroller = _alg("ppo", [{"name": "frame_stacker", "stack_size": 3}], **kw)

    def unroll(frames, env_ids, first=False):
        T, B = len(frames), len(env_ids)
        st = np.full((T, B), M)
        if first:
            st[0] = F
        obs = np.array(frames, np.float32)[:, None, None] + 100 * np.arange(B)[None, :, None]
        return Experience(step_type=st, reward=np.zeros((T, B), np.float32),
                          discount=np.ones((T, B), np.float32), observation=obs,
                          env_id=np.tile(np.array(env_ids), (T, 1)),
                          action=np.zeros((T, B), np.int64),
                          rollout_info={"log_prob": np.zeros((T, B), np.float32),
                                        "value": np.zeros((T, B), np.float32)})

    acted = []
    for t, f in enumerate(range(1, 10)):
        ts = TimeStep(step_type=np.array([F if t == 0 else M] * 2),
                      observation=np.array([[f], [f + 100]], np.float32), env_id=np.array([3, 7]))
        acted.append(unroller.transform_timestep(ts)[0].observation)
    first = learner._experience(unroll([1, 2, 3, 4, 5], [3, 7], first=True)).observation
    second = learner._experience(unroll([5, 6, 7, 8, 9], [3, 7])).observation
    for t in range(5):
        torch.testing.assert_close(first[t], acted[t])
        torch.testing.assert_close(second[t], acted[t + 4])
    assert second[0, 0].tolist() == [3.0, 4.0, 5.0]
    # An unroll that does not continue the last one (one was skipped) starts afresh.
    third = learner._experience(unroll([20, 21, 22], [3, 7])).observation
    assert third[0, 0].tolist() == [20.0, 20.0, 20.0] and third[2, 0].tolist() == [20.0, 21.0, 22.0]
