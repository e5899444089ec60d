"""SAC's ``parallel_update``: the actor's half of an update runs on a second thread while the
critics' half runs on the caller's, and the update is the sequential one, bit for bit."""

import threading

import gymnasium as gym
import numpy as np
import pytest
import torch

import algorithms
from algorithms import configs
from algorithms.data import Experience


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The parallel update is for one torch thread (a learner's ``num_threads: 1``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])]


def _batch(B: int, T: int, action_dim: int, seed: int) -> Experience:
    rng = np.random.default_rng(seed)
    step_type = np.ones((B, T), np.int64)
    step_type[::7, 0] = 2  # some LAST rows: masked targets
    return Experience(
        step_type=step_type, reward=rng.normal(size=(B, T)).astype(np.float32),
        discount=(rng.uniform(size=(B, T)) > 0.1).astype(np.float32),
        observation=rng.normal(size=(B, T, 3)).astype(np.float32),
        action=rng.uniform(-2, 2, (B, T, action_dim)).astype(np.float32),
        prev_action=(), env_id=(), rollout_info={})


def _pair(action_dim: int, device: str, **kwargs):
    """Two SACs with the same weights: one sequential, one with ``parallel_update``."""
    out = []
    for parallel in (False, True):
        config = configs.parse({"name": "sac", "actor_fc_layer_params": [32, 32],
                                "critic_fc_layer_params": [32, 32],
                                "parallel_update": parallel, **kwargs})
        torch.manual_seed(0)
        out.append(algorithms.make(config, gym.spaces.Box(-1, 1, (3,), np.float32),
                                   gym.spaces.Box(-2, 2, (action_dim,), np.float32),
                                   device=device))
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision, T, weighted, action_dim", [
    ("float32", 2, False, 1), ("float32", 3, True, 2), ("bfloat16", 2, True, 1),
    ("bfloat16", 4, False, 3)])
def test_parallel_update_is_the_sequential_update_bit_for_bit(device, precision, T, weighted,
                                                              action_dim):
    sequential, parallel = _pair(action_dim, device, precision=precision,
                                 mini_batch_length=T, max_grad_norm=1.0)
    for step in range(4):
        batch = _batch(16, T, action_dim, seed=step)
        weights = torch.rand(16, generator=torch.Generator().manual_seed(step)) \
            if weighted else None
        results = []
        for alg in (sequential, parallel):
            torch.manual_seed(100 + step)  # both draw the policy noise from the same stream
            results.append(alg.train_on(batch, weights))
        one, two = (dict(r.metrics) for r in results)
        assert one.keys() == two.keys()
        for key in one:  # the total is summed in another order: equal up to rounding
            assert one[key] == pytest.approx(two[key], rel=1e-5, abs=1e-6), key
        assert torch.equal(results[0].priorities, results[1].priorities)
    for (name, a), b in zip(sequential.named_parameters(), parallel.parameters(), strict=True):
        assert torch.equal(a, b), name
    for a, b in zip(sequential.target_critic_networks.parameters(),
                    parallel.target_critic_networks.parameters(), strict=True):
        assert torch.equal(a, b)
    moved = _pair(action_dim, device)[0]  # the updates did change the networks
    assert not all(torch.equal(a, b) for a, b in zip(moved.parameters(),
                                                     parallel.parameters(), strict=True))


@pytest.mark.parametrize("parallel", [False, True])
def test_the_actor_half_runs_on_a_second_thread(parallel):
    """The actor network sees two forward passes per update: on ``s`` (trained, the actor's
    half) and on ``s'`` (the soft target, the critics' half)."""
    alg = _pair(1, "cpu")[int(parallel)]
    threads = []
    alg.actor_network.register_forward_hook(
        lambda *_: threads.append(threading.get_ident()))
    alg.train_on(_batch(16, 2, 1, seed=0))
    assert len(threads) == 2
    assert (len(set(threads)) == 2) is parallel, threads
    assert threading.get_ident() in threads


def test_with_several_torch_threads_the_update_stays_on_one_thread():
    alg = _pair(1, "cpu")[1]
    threads = []
    alg.actor_network.register_forward_hook(lambda *_: threads.append(threading.get_ident()))
    torch.set_num_threads(2)
    alg.train_on(_batch(16, 2, 1, seed=0))
    assert threads == [threading.get_ident()] * 2


def test_an_error_in_the_actor_half_reaches_the_caller_after_both_halves_ended():
    alg = _pair(1, "cpu")[1]
    calls = []

    def fail_on_s(module, args, output):
        calls.append(threading.get_ident())
        if threading.get_ident() != threading.main_thread().ident:
            raise RuntimeError("actor half failed")

    hook = alg.actor_network.register_forward_hook(fail_on_s)
    with pytest.raises(RuntimeError, match="actor half failed"):
        alg.train_on(_batch(16, 2, 1, seed=0))
    assert len(calls) == 2  # the critics' half ran to its end too
    hook.remove()
    before = [p.detach().clone() for p in alg.parameters()]
    alg.train_on(_batch(16, 2, 1, seed=1))  # and the next update goes as usual
    assert not all(torch.equal(a, b) for a, b in zip(before, alg.parameters(), strict=True))
