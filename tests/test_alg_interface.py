"""The contract the pipeline nodes rely on, for every registered algorithm."""

import copy
import io
import itertools

import gymnasium as gym
import numpy as np
import pytest
import torch

import algorithms
from algorithms import configs
from algorithms.configs import A2cConfig, DdpgConfig, DqnConfig, PpoConfig, SacConfig, Td3Config
from algorithms.data import Experience, StepType, TimeStep, make_experience
from tests import alg_cases_alf, alg_cases_async, alg_cases_offline
from tests.alg_spaces import BOX, CARTPOLE_OBS, DISCRETE, PENDULUM_OBS

FAMILIES = (alg_cases_async, alg_cases_offline, alg_cases_alf)  # each family's own cases

SMALL = {
    "dqn": DqnConfig(fc_layer_params=[8]),
    "sac": SacConfig(actor_fc_layer_params=[8], critic_fc_layer_params=[8]),
    "ppo": PpoConfig(actor_fc_layer_params=[8], value_fc_layer_params=[8], mini_batch_size=8,
                     num_epochs=2),
    "a2c": A2cConfig(actor_fc_layer_params=[8], value_fc_layer_params=[8]),
    "ddpg": DdpgConfig(actor_fc_layer_params=[8], critic_fc_layer_params=[8]),
    "td3": Td3Config(actor_fc_layer_params=[8], critic_fc_layer_params=[8]),
    "qrsac": configs.QrsacConfig(actor_fc_layer_params=[8], critic_fc_layer_params=[8],
                                 num_quantiles=5),
}
for _family in FAMILIES:
    SMALL.update(_family.SMALL)
CASES = [("dqn", CARTPOLE_OBS, DISCRETE), ("sac", PENDULUM_OBS, BOX),
         ("sac", CARTPOLE_OBS, DISCRETE), ("ppo", CARTPOLE_OBS, DISCRETE),
         ("ppo", PENDULUM_OBS, BOX), ("a2c", CARTPOLE_OBS, DISCRETE), ("a2c", PENDULUM_OBS, BOX),
         ("ddpg", PENDULUM_OBS, BOX), ("td3", PENDULUM_OBS, BOX), ("qrsac", PENDULUM_OBS, BOX)]
CASES += [case for family in FAMILIES for case in family.CASES]
IDS = [f"{n}-{'discrete' if isinstance(a, gym.spaces.Discrete) else 'box'}" for n, _, a in CASES]


def _time_step(obs_space, act_space, b, rng, step_type=StepType.MID):
    obs = rng.standard_normal((b, *obs_space.shape)).astype(np.float32)
    prev = np.zeros((b, *act_space.shape), act_space.dtype)
    return TimeStep(np.full(b, int(step_type), np.int64), rng.standard_normal(b).astype(np.float32),
                    np.ones(b, np.float32), obs, prev, np.arange(b))


def _unroll(alg, obs_space, act_space, T, B, seed=0):
    """Time-major [T, B] experience of numpy arrays, as it would arrive over the wire."""
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(T):
        st = StepType.FIRST if t == 0 else (StepType.LAST if t == T // 2 else StepType.MID)
        ts = _time_step(obs_space, act_space, B, rng, st)
        step = alg.rollout_step(ts, alg.get_initial_state(B))
        exp = make_experience(ts, step)
        rows.append({k: (v.cpu().numpy() if isinstance(v, torch.Tensor) else v)
                     for k, v in exp.to_dict().items()})
    return Experience.from_dict({k: np.stack([r[k] for r in rows]) for k in rows[0]})


def _batch(alg, obs_space, act_space):
    exp = _unroll(alg, obs_space, act_space, T=6, B=4)
    if alg.on_policy:
        return exp
    return Experience.from_dict({k: np.swapaxes(v, 0, 1) for k, v in exp.to_dict().items()})


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("name,obs_space,act_space", CASES, ids=IDS)
def test_step_interface(name, obs_space, act_space):
    alg = algorithms.make(SMALL[name], obs_space, act_space)
    rng = np.random.default_rng(0)
    ts = _time_step(obs_space, act_space, 3, rng)
    for step in (alg.rollout_step(ts, ()), alg.predict_step(ts, ())):
        a = step.output
        assert a.shape == (3, *act_space.shape)
        if isinstance(act_space, gym.spaces.Discrete):
            assert a.dtype == torch.int64 and ((a >= 0) & (a < act_space.n)).all()
        else:
            assert a.dtype == torch.float32
        assert isinstance(step.info, dict)
    if name == "ppo":
        assert set(alg.rollout_step(ts, ()).info) == {"log_prob", "value"}


@pytest.mark.parametrize("name,obs_space,act_space", CASES, ids=IDS)
def test_train_on_returns_metrics_and_priorities(name, obs_space, act_space):
    alg = algorithms.make(SMALL[name], obs_space, act_space)
    batch = _batch(alg, obs_space, act_space)
    before = {k: v.clone() for k, v in alg.state_dict().items()}
    result = alg.train_on(batch, None if alg.on_policy else np.ones(4, np.float32))
    assert result.metrics and all(isinstance(v, float) and np.isfinite(v)
                                  for v in result.metrics.values())
    assert "loss/total" in result.metrics
    if alg.on_policy:
        assert result.priorities is None
    else:
        assert result.priorities.shape == (4,) and (result.priorities >= 0).all()
    changed = [k for k, v in alg.state_dict().items() if not torch.equal(v, before[k])]
    assert changed, "no parameter changed"


def _twin_after_one_update(name, obs_space, act_space):
    """``(alg, twin, batch, metrics)``: an algorithm after one ``train_on`` (seed 5) of a batch,
    with its twin as it was before, to repeat that update another way."""
    alg = algorithms.make(SMALL[name], obs_space, act_space)
    batch = _batch(alg, obs_space, act_space)
    twin = copy.deepcopy(alg)
    torch.manual_seed(5)
    return alg, twin, batch, dict(alg.train_on(batch).metrics)


@pytest.mark.parametrize("name,obs_space,act_space", CASES, ids=IDS)
def test_metrics_read_later_are_those_of_their_update(name, obs_space, act_space):
    """Metrics are computed when first read: reading them after more updates must still give
    that update's values (nothing they are computed from changed in place since)."""
    alg, twin, batch, eager = _twin_after_one_update(name, obs_space, act_space)
    torch.manual_seed(5)
    late = twin.train_on(batch)
    for _ in range(3):
        twin.train_on(batch)
    assert dict(late.metrics) == eager


@pytest.mark.parametrize("name,obs_space,act_space", CASES, ids=IDS)
def test_staged_update_is_train_on_with_a_policy_between_stages(name, obs_space, act_space):
    """``train_in_stages`` (what a learner publishing between epochs drives) is ``train_on``
    to the bit, with the same metrics; it pauses ``num_epochs - 1`` times where the update has
    epochs (once per epoch boundary, never mid-epoch), and the policy at each pause is one a
    runner can load (the update's parameters moved since the pause before)."""
    alg, twin, batch, whole = _twin_after_one_update(name, obs_space, act_space)
    torch.manual_seed(5)
    stages, pauses, policies = twin.train_in_stages(batch), 0, [twin.policy_params()]
    while True:
        try:
            next(stages)
        except StopIteration as done:
            staged = dict(done.value.metrics)
            break
        pauses += 1
        policies.append(copy.deepcopy(twin.policy_params()))
    assert staged == whole
    for (k, a), (_, b) in zip(alg.state_dict().items(), twin.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)
    epochs = getattr(SMALL[name], "num_epochs", 1) if alg.on_policy else 1
    assert pauses == epochs - 1
    policies.append(twin.policy_params())
    loader = algorithms.make(SMALL[name], obs_space, act_space)
    for before, after in itertools.pairwise(policies):
        loader.load_policy_state_dict(after)
        assert any(not torch.equal(before[k], after[k]) for k in after if k != "layout"), \
            "the policy did not move between two pauses"


@pytest.mark.parametrize("name,obs_space,act_space", CASES, ids=IDS)
def test_importance_weights_scale_the_update(name, obs_space, act_space):
    if configs.config_class(name).on_policy:
        pytest.skip("on-policy algorithms take no importance weights")
    alg = algorithms.make(SMALL[name], obs_space, act_space)
    batch = _batch(alg, obs_space, act_space)
    before = {k: v.clone() for k, v in alg.named_parameters()}
    alg.train_on(batch, np.zeros(4, np.float32))
    # Zero weights: no sample contributes, so no network moves (SAC's alpha loss is unweighted).
    for k, v in alg.named_parameters():
        if k != "log_alpha":
            torch.testing.assert_close(v, before[k], rtol=0, atol=0, msg=k)
    alg.train_on(batch, np.ones(4, np.float32))
    assert any(not torch.equal(v, before[k]) for k, v in alg.named_parameters()
               if k != "log_alpha")


@pytest.mark.parametrize("name,obs_space,act_space", CASES, ids=IDS)
def test_policy_state_dict_round_trip(name, obs_space, act_space):
    src = algorithms.make(SMALL[name], obs_space, act_space)
    dst = algorithms.make(SMALL[name], obs_space, act_space)
    params = src.policy_state_dict()
    assert all(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in params.values())
    dst.load_policy_state_dict({k: v.numpy() for k, v in params.items()})
    ts = _time_step(obs_space, act_space, 5, np.random.default_rng(1))
    torch.testing.assert_close(src.predict_step(ts).output, dst.predict_step(ts).output)


@pytest.mark.parametrize("name,obs_space,act_space", CASES, ids=IDS)
def test_packed_policy_params_cross_the_wire_exactly(name, obs_space, act_space):
    """What a learner publishes (one flat array per dtype) loads bit for bit into a receiver,
    through the real codec, and is a copy taken when it was made."""
    src = algorithms.make(SMALL[name], obs_space, act_space)
    dst = algorithms.make(SMALL[name], obs_space, act_space)
    batch = _batch(src, obs_space, act_space)
    src.train_on(batch)
    packed = src.policy_params()
    expected = {k: v.clone() for k, v in src.policy_state_dict().items()}
    src.train_on(batch)  # moves the source; the packed copy must not move with it
    _load_through_the_wire(dst, packed)
    _assert_policy_is(dst, expected)


def _load_through_the_wire(dst, packed: dict) -> None:
    """``packed`` as a learner's ``Params`` message, encoded and decoded, loaded into ``dst``."""
    from nodes.messages import Params
    from pipeline import codec

    wire = codec.decode(codec.encode(Params(1, 0, packed, 7), "learner.0")).message
    dst.load_policy_state_dict(wire.params)


def _assert_policy_is(dst, expected: dict) -> None:
    got = dst.policy_state_dict()
    assert set(got) == set(expected)
    for k, v in expected.items():
        torch.testing.assert_close(got[k], v, rtol=0, atol=0, msg=k)


def test_packed_policy_of_another_layout_is_refused():
    obs, act = CASES[0][1], CASES[0][2]
    src = algorithms.make(DqnConfig(fc_layer_params=[8]), obs, act)
    dst = algorithms.make(DqnConfig(fc_layer_params=[16]), obs, act)
    with pytest.raises(ValueError, match="layout"):
        dst.load_policy_state_dict(src.policy_params())


def test_packed_policy_loads_into_tensors_that_were_replaced():
    """A module whose tensors were swapped for new ones (load_state_dict with assign) is
    looked up again: the packed values land in the tensors the policy uses now."""
    obs, act = CASES[0][1], CASES[0][2]
    src = algorithms.make(DqnConfig(fc_layer_params=[8]), obs, act)
    dst = algorithms.make(DqnConfig(fc_layer_params=[8]), obs, act)
    dst.load_policy_state_dict(src.policy_params())  # looks the tensors up once
    fresh = {k: torch.zeros_like(v) for k, v in dst.q_network.state_dict().items()}
    dst.q_network.load_state_dict(fresh, assign=True)
    dst.load_policy_state_dict(src.policy_params())
    for k, v in src.q_network.state_dict().items():
        torch.testing.assert_close(dst.q_network.state_dict()[k], v, rtol=0, atol=0, msg=k)


@pytest.mark.parametrize("name,obs_space,act_space", CASES, ids=IDS)
def test_checkpoint_restores_exactly(name, obs_space, act_space):
    alg = algorithms.make(SMALL[name], obs_space, act_space)
    batch = _batch(alg, obs_space, act_space)
    for _ in range(3):
        alg.train_on(batch)
    buf = io.BytesIO()
    torch.save(alg.checkpoint_state(), buf)
    buf.seek(0)
    restored = algorithms.make(SMALL[name], obs_space, act_space)
    restored.load_checkpoint_state(torch.load(buf, weights_only=True))
    for (k, a), (_, b) in zip(alg.state_dict().items(), restored.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)
    # The Python mirrors the update schedules read follow the restored counters.
    assert (restored.num_updates, restored.env_steps) == (alg.num_updates, alg.env_steps)
    assert alg.num_updates == int(alg.train_steps) >= 3 and alg.env_steps == 6 * 4
    # Same state + same randomness -> identical next update (optimizer moments restored).
    torch.manual_seed(5)
    m1 = alg.train_on(batch).metrics
    torch.manual_seed(5)
    m2 = restored.train_on(batch).metrics
    assert m1 == m2
    for (k, a), (_, b) in zip(alg.state_dict().items(), restored.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)


def test_make_rejects_unknown_hyperparameter():
    with pytest.raises(TypeError, match="learning_rat"):
        algorithms.make(DqnConfig(learning_rat=1e-3), CARTPOLE_OBS, DISCRETE)
    with pytest.raises(ValueError, match="unknown algorithm"):
        algorithms.make(configs.parse({"name": "nope"}), CARTPOLE_OBS, DISCRETE)


def test_every_registered_algorithm_keeps_the_contract():
    """The checks above run on every registered algorithm: a new one must be given a case."""
    assert {name for name, _, _ in CASES} == set(algorithms.algorithm_names())


def test_registry_names_and_td3_defaults():
    assert {"a2c", "ddpg", "dqn", "ppo", "sac", "td3"} <= set(algorithms.algorithm_names())
    td3 = algorithms.make(SMALL["td3"], PENDULUM_OBS, BOX)
    assert td3.critic_networks.mlp.num_replicas == 2
    assert td3.actor_update_period == 2 and td3.target_policy_noise == 0.2
    hp = configs.hyperparameters(SacConfig())
    assert hp["num_critic_replicas"] == 2


def test_experience_dict_round_trip():
    exp = Experience(step_type=np.zeros(2), reward=np.ones(2), discount=np.ones(2),
                     observation=np.zeros((2, 3)), prev_action=np.zeros(2), env_id=np.arange(2),
                     action=np.zeros(2), rollout_info={"log_prob": np.zeros(2)})
    d = exp.to_dict()
    assert "rollout_info.log_prob" in d and "rollout_info" not in d
    back = Experience.from_dict(d)
    assert set(back.rollout_info) == {"log_prob"}
    assert back.time_step.observation.shape == (2, 3)
    with pytest.raises(KeyError, match="no field 'nstep.return'"):  # never dropped unsaid
        Experience.from_dict({**d, "nstep.return": np.zeros(2)})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name,obs_space,act_space", CASES, ids=IDS)
def test_runs_on_cuda(name, obs_space, act_space):
    alg = algorithms.make(SMALL[name], obs_space, act_space, device="cuda")
    batch = _batch(alg, obs_space, act_space)
    result = alg.train_on(batch)
    assert np.isfinite(result.metrics["loss/total"])
    assert all(v.device.type == "cpu" for v in alg.policy_state_dict().values())
    ts = _time_step(obs_space, act_space, 2, np.random.default_rng(0))
    assert alg.predict_step(ts).output.device.type == "cuda"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name,obs_space,act_space", CASES, ids=IDS)
@pytest.mark.parametrize("receiver", ["cpu", "cuda"])
def test_packed_policy_from_cuda_crosses_the_wire_exactly(name, obs_space, act_space, receiver):
    """A learner on a GPU publishes host arrays; an unroller on the CPU or the GPU loads them
    bit for bit."""
    src = algorithms.make(SMALL[name], obs_space, act_space, device="cuda")
    dst = algorithms.make(SMALL[name], obs_space, act_space, device=receiver)
    src.train_on(_batch(src, obs_space, act_space))
    packed = src.policy_params()
    assert all(v.device.type == "cpu" for k, v in packed.items() if k != "layout")
    _load_through_the_wire(dst, packed)
    _assert_policy_is(dst, src.policy_state_dict())
