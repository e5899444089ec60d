"""Mixed-precision updates (``precision: bfloat16``): the hidden layers' matrix products of
an update run in bfloat16, everything the update keeps or is judged by stays float32."""

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import algorithms
from algorithms import configs
from algorithms.data import Experience, TimeStep

MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
           torch.ops.aten.baddbmm.default}


class _MatmulDtypes(TorchDispatchMode):
    """Records ``(op, input dtype, output shape)`` of every matrix product dispatched."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in MATMULS:
            self.calls.append((func, args[-1].dtype, tuple(out.shape)))
        return out


def _batch(obs_shape, action, B: int = 32, T: int = 2) -> Experience:
    rng = np.random.default_rng(0)
    return Experience(
        step_type=np.ones((B, T), np.int64), reward=rng.normal(size=(B, T)).astype(np.float32),
        discount=np.ones((B, T), np.float32),
        observation=rng.normal(size=(B, T, *np.atleast_1d(obs_shape))).astype(np.float32),
        action=action(rng, (B, T)), prev_action=(), env_id=(), rollout_info={})


CASES = {
    "sac": (gym.spaces.Box(-1, 1, (1,), np.float32),
            lambda rng, s: rng.uniform(-1, 1, (*s, 1)).astype(np.float32)),
    "dqn": (gym.spaces.Discrete(3), lambda rng, s: rng.integers(0, 3, s)),
}


DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])]


def _make(name: str, precision: str, device: str = "cpu", obs_shape=(5,), encoder="mlp"):
    action_space, _ = CASES[name]
    config = configs.parse({"name": name, "precision": precision, "encoder": encoder,
                            "image_layout": "chw" if encoder != "mlp" else "auto"})
    return algorithms.make(config, gym.spaces.Box(-1, 1, obs_shape, np.float32), action_space,
                           device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_bfloat16_runs_the_hidden_products_in_bfloat16_and_keeps_the_rest_float32(name, device):
    alg = _make(name, "bfloat16", device)
    before = {k: v.clone() for k, v in alg.state_dict().items()}
    batch = _batch(5, CASES[name][1])
    with _MatmulDtypes() as seen:
        result = alg.train_on(batch)
    dtypes = {dtype for _, dtype, _ in seen.calls}
    assert torch.bfloat16 in dtypes, seen.calls
    # Output layers (Q values, action means) are float32 products.
    assert torch.float32 in dtypes, seen.calls
    assert all(v.dtype == before[k].dtype for k, v in alg.state_dict().items())
    assert all(np.isfinite(v) for v in dict(result.metrics).values()), dict(result.metrics)
    changed = [k for k, v in alg.state_dict().items()
               if v.is_floating_point() and not torch.equal(v, before[k])]
    assert changed, "the update changed no parameter"
    grads = [p.grad for opt in alg.optimizers.values() for group in opt.param_groups
             for p in group["params"] if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 for g in grads)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_float32_runs_every_product_in_float32(name, device):
    alg = _make(name, "float32", device)
    with _MatmulDtypes() as seen:
        alg.train_on(_batch(5, CASES[name][1]))
    assert seen.calls and {dtype for _, dtype, _ in seen.calls} == {torch.float32}


def test_acting_stays_float32_under_bfloat16_training():
    alg = _make("sac", "bfloat16")
    ts = TimeStep(step_type=np.zeros(4, np.int64), reward=np.zeros(4, np.float32),
                  discount=np.ones(4, np.float32),
                  observation=np.zeros((4, 5), np.float32), prev_action=(), env_id=())
    with _MatmulDtypes() as seen:
        action = alg.rollout_step(ts).output
    assert action.dtype == torch.float32
    assert {dtype for _, dtype, _ in seen.calls} == {torch.float32}


def test_unknown_precision_is_refused_by_the_algorithm():
    with pytest.raises(ValueError, match="precision"):
        algorithms.make(configs.SacConfig(precision="float16"),
                        gym.spaces.Box(-1, 1, (5,), np.float32),
                        gym.spaces.Box(-1, 1, (1,), np.float32))


def test_bfloat16_without_native_support_warns_once(monkeypatch):
    from algorithms import precision

    monkeypatch.setattr(precision, "_cpu_flags", lambda: {"avx2", "fma"})
    alg = _make("sac", "bfloat16")
    batch = _batch(5, CASES["sac"][1])
    with pytest.warns(RuntimeWarning, match="slower than in float32"):
        alg.train_on(batch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        alg.train_on(batch)  # once per algorithm


def test_bfloat16_with_native_support_does_not_warn(monkeypatch):
    from algorithms import precision

    monkeypatch.setattr(precision, "_cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    alg = _make("sac", "bfloat16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        alg.train_on(_batch(5, CASES["sac"][1]))
    assert precision.native_bfloat16(torch.device("cpu")) is True



def _autocast_twin(alg, name: str, **kwargs):
    """The same algorithm in float32 whose updates run under ``torch.autocast(bfloat16)``:
    what ``precision: bfloat16`` must equal (mixed precision as PyTorch defines it)."""
    twin = _make(name, "float32", **kwargs)
    twin.load_state_dict(alg.state_dict())
    twin.training_precision = lambda: torch.autocast("cpu", torch.bfloat16)
    if hasattr(twin, "_by_hand"):  # DQN's float32 update without autograd: no autocast there
        twin._by_hand = None
    return twin


@pytest.mark.parametrize("name,obs_shape,encoder",
                         [("sac", (5,), "mlp"), ("dqn", (5,), "mlp"),
                          ("dqn", (4, 10, 10), "minatar_cnn")])
def test_bfloat16_updates_equal_autocast_updates_bitwise(name, obs_shape, encoder):
    """The bfloat16 copies of the hidden parameters (algorithms.precision) compute what
    autocast computes: the same parameters after several updates, to the bit."""
    kwargs = {"obs_shape": obs_shape, "encoder": encoder}
    alg = _make(name, "bfloat16", **kwargs)
    ref = _autocast_twin(alg, name, **kwargs)
    before = {k: v.clone() for k, v in alg.state_dict().items()}
    batch = _batch(obs_shape, CASES[name][1])
    for model in (alg, ref):
        torch.manual_seed(3)  # SAC samples actions in its update
        for _ in range(3):
            model.train_on(batch)
    mine, theirs = alg.state_dict(), ref.state_dict()
    assert any(not torch.equal(mine[k], before[k]) for k in mine if mine[k].is_floating_point())
    assert [k for k in mine if not torch.equal(mine[k], theirs[k])] == []
