"""Conv encoders for every algorithm on image observations that stay uint8 (or bool) until the
network's forward pass."""

import gymnasium as gym
import numpy as np
import pytest
import torch

import algorithms
from algorithms import configs
from algorithms.data import Experience, StepType, TimeStep
from algorithms.encoders import ConvEncoder, as_float, chw_shape, image_layout, make_encoder

ATARI = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)          # HWC, as Gymnasium gives it
MINATAR = gym.spaces.Box(0, 1, (10, 10, 4), bool)               # MinAtar's channels
DISCRETE = gym.spaces.Discrete(3)
BOX = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
ENCODERS = ["mlp", "nature_cnn", "impala", "minatar_cnn"]
SMALL = {
    "dqn": {"fc_layer_params": [8]},
    "sac": {"actor_fc_layer_params": [8], "critic_fc_layer_params": [8]},
    "ppo": {"actor_fc_layer_params": [8], "value_fc_layer_params": [8], "mini_batch_size": 4,
            "num_epochs": 1},
    "a2c": {"actor_fc_layer_params": [8], "value_fc_layer_params": [8]},
    "ddpg": {"actor_fc_layer_params": [8], "critic_fc_layer_params": [8]},
    "td3": {"actor_fc_layer_params": [8], "critic_fc_layer_params": [8],
            "actor_update_period": 1},
}
ALGOS = [("dqn", DISCRETE), ("sac", DISCRETE), ("sac", BOX), ("ppo", DISCRETE), ("ppo", BOX),
         ("a2c", DISCRETE), ("ddpg", BOX), ("td3", BOX)]


def _obs(space, shape, rng):
    if space.dtype == bool:
        return rng.random(shape) < 0.3
    return rng.integers(0, 256, shape, dtype=np.uint8)


def _batch(alg, space, act_space, rng, B=2, T=3):
    """A raw training batch: [B, T] (off-policy) or [T, B] (on-policy) with uint8/bool images."""
    lead = (T, B) if alg.on_policy else (B, T)
    st = np.full(lead, int(StepType.MID))
    if isinstance(act_space, gym.spaces.Discrete):
        action = rng.integers(0, act_space.n, lead)
    else:
        action = rng.uniform(-2, 2, (*lead, *act_space.shape)).astype(np.float32)
    info = {}
    if alg.on_policy:
        info = {"log_prob": np.full(lead, -1.0, np.float32), "value": np.zeros(lead, np.float32)}
    return Experience(step_type=st, reward=rng.standard_normal(lead).astype(np.float32),
                      discount=np.ones(lead, np.float32),
                      observation=_obs(space, (*lead, *space.shape), rng), action=action,
                      rollout_info=info)


@pytest.mark.parametrize("space", [ATARI, MINATAR], ids=["84x84x4-uint8", "10x10x4-bool"])
@pytest.mark.parametrize("encoder", ENCODERS)
@pytest.mark.parametrize("name,act_space", ALGOS,
                         ids=[f"{n}-{type(a).__name__}" for n, a in ALGOS])
def test_every_algorithm_trains_on_images_with_every_encoder(name, act_space, encoder, space):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    cfg = configs.parse({"name": name, "encoder": encoder, **SMALL[name]})
    alg = algorithms.make(cfg, space, act_space, "cpu")
    batch = _batch(alg, space, act_space, rng)
    raw = batch.observation.copy()
    # The learner's batch keeps the stored dtype: the float copy exists only inside forward.
    exp = alg._experience(batch)
    assert exp.observation.dtype == (torch.bool if space.dtype == bool else torch.uint8)
    before = {k: v.clone() for k, v in alg.named_parameters()}
    result = alg.train_on(batch)
    assert np.isfinite(result.metrics["loss/total"])
    np.testing.assert_array_equal(batch.observation, raw)
    assert any(not torch.equal(v, before[k]) for k, v in alg.named_parameters()
               if "encoder" in k or encoder == "mlp")
    ts = TimeStep(step_type=np.full(2, int(StepType.FIRST)), reward=np.zeros(2, np.float32),
                  discount=np.ones(2, np.float32), observation=_obs(space, (2, *space.shape), rng),
                  env_id=np.arange(2))
    assert alg.transform_timestep(ts)[0].observation.dtype == exp.observation.dtype
    for step in (alg.rollout_step(ts), alg.predict_step(ts)):
        assert step.output.shape == (2, *act_space.shape)


def test_image_layouts():
    assert image_layout((84, 84, 4)) == "hwc" and image_layout((4, 84, 84)) == "chw"
    assert image_layout((10, 10, 10)) == "chw" and image_layout((84, 84)) == "hw"
    assert image_layout((10, 10, 4)) == "hwc" and image_layout((1, 84, 84)) == "chw"
    assert image_layout((4,)) is None and image_layout((4, 84, 84), "hwc") == "hwc"
    assert chw_shape((84, 84, 4)) == (4, 84, 84) and chw_shape((84, 84)) == (1, 84, 84)
    with pytest.raises(ValueError, match="image observation"):
        ConvEncoder((17,), "nature_cnn")


def test_layouts_see_the_same_image():
    # One image given HWC, CHW and (single channel) HW: the same features from the same weights.
    rng = np.random.default_rng(0)
    hwc = torch.from_numpy(rng.integers(0, 256, (2, 12, 12, 1), dtype=np.uint8))
    torch.manual_seed(0)
    enc_hwc = ConvEncoder((12, 12, 1), "nature_cnn", "hwc")
    enc_chw = ConvEncoder((1, 12, 12), "nature_cnn", "chw")
    enc_hw = ConvEncoder((12, 12), "nature_cnn")
    enc_chw.load_state_dict(enc_hwc.state_dict())
    enc_hw.load_state_dict(enc_hwc.state_dict())
    out = enc_hwc(hwc)
    torch.testing.assert_close(enc_chw(hwc.permute(0, 3, 1, 2)), out)
    torch.testing.assert_close(enc_hw(hwc[..., 0]), out)


def test_pixels_are_scaled_inside_the_network():
    x = torch.tensor([[0, 51, 255]], dtype=torch.uint8)
    torch.testing.assert_close(as_float(x), torch.tensor([[0.0, 0.2, 1.0]]))
    assert as_float(torch.tensor([True, False])).tolist() == [1.0, 0.0]
    f = torch.ones(3)
    assert as_float(f) is f  # float32 vectors pass through without a copy
    flat = make_encoder((2, 3), "mlp")
    assert flat(torch.full((1, 2, 3), 255, dtype=torch.uint8)).tolist() == [[1.0] * 6]


def test_encoder_output_sizes():
    assert ConvEncoder((84, 84, 4), "nature_cnn").output_size == 64 * 7 * 7
    assert ConvEncoder((84, 84, 4), "impala").output_size == 32 * 11 * 11
    assert ConvEncoder((10, 10, 4), "minatar_cnn").output_size == 16 * 8 * 8
    assert ConvEncoder((10, 10, 4), "impala").output_size == 32 * 2 * 2
    assert ConvEncoder((10, 10, 4), "nature_cnn").output_size == 64  # kernels shrink to fit


def test_to_tensor_keeps_the_stored_dtype():
    from algorithms.data import to_tensor

    assert to_tensor(np.zeros((2, 84, 84, 4), np.uint8)).dtype == torch.uint8
    assert to_tensor(np.zeros((2, 10, 10, 4), bool)).dtype == torch.bool


@pytest.mark.parametrize("name", ["ppo", "a2c"])
def test_shared_encoder_runs_one_conv_stack_for_actor_and_value(name):
    """``shared_encoder_fc_layer_params``: one encoder whose weights both losses train, that
    travels with the policy's state, and that halves the conv layers of the model."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    common = {"name": name, "encoder": "nature_cnn", **SMALL[name]}
    separate = algorithms.make(configs.parse(common), ATARI, DISCRETE, "cpu")
    shared = algorithms.make(configs.parse({**common, "actor_fc_layer_params": [],
                                            "value_fc_layer_params": [],
                                            "shared_encoder_fc_layer_params": [16]}),
                             ATARI, DISCRETE, "cpu")
    convs = lambda alg: sum(isinstance(m, torch.nn.Conv2d) for m in alg.modules())  # noqa: E731
    assert convs(shared) * 2 == convs(separate)
    trunk = {k: v.clone() for k, v in shared.encoding_network.named_parameters()}
    assert trunk and all(f"encoding_network.{k}" in shared.policy_state_dict() for k in trunk)
    result = shared.train_on(_batch(shared, ATARI, DISCRETE, rng))
    assert np.isfinite(result.metrics["loss/total"])
    assert all(not torch.equal(v, trunk[k])
               for k, v in shared.encoding_network.named_parameters() if k.endswith("weight"))
    ts = TimeStep(step_type=np.full(2, int(StepType.FIRST)), reward=np.zeros(2, np.float32),
                  discount=np.ones(2, np.float32), observation=_obs(ATARI, (2, *ATARI.shape), rng),
                  env_id=np.arange(2))
    assert shared.rollout_step(ts).output.shape == (2,)
