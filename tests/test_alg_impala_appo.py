"""IMPALA and APPO: their losses against numbers computed by hand for a tiny unroll, the
correction of a lagged batch (behaviour log-probs from an older copy of the network), and
their recurrent variants.

The hand-computed cases set the networks so their outputs are known: no hidden layers, the
value head reads the observation's one feature (``V(x) = x``) and the policy head is zero
(``pi = 0.5`` for both actions, entropy ``log 2``). The unroll is tests/test_alg_vtrace.py's:
T = 4, B = 2, gamma = 0.5, V = [10, 20, 30, 40], steps [FIRST, MID, LAST, FIRST], rewards
[0, 1, 2, 0]; column 0 terminates at step 2, column 1 is truncated there. The behaviour
policy's probabilities make pi/mu = [2, 0.5, 100, 3]. V-trace (rho-bar = c-bar = 1,
lambda = 1) gives, on the rows with a transition (row 0, row 1; columns termination,
truncation): v_s = [[6.5, 10.25], [11, 18.5]] and advantages [[-3.5, 0.25], [-9, -1.5]].
"""

from __future__ import annotations

import copy
import dataclasses
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

import algorithms
from algorithms.config_async import AppoConfig, ImpalaConfig
from algorithms.config_core import PpoConfig
from algorithms.data import Experience, StepType, make_experience
from algorithms.envs import env_spaces
from algorithms.vtrace_common import unroll_outputs, vtrace_of
from tests.test_alg_interface import _time_step

F, M, L = StepType.FIRST, StepType.MID, StepType.LAST
OBS1 = gym.spaces.Box(-100, 100, (1,), np.float32)
TWO = gym.spaces.Discrete(2)
LOG_HALF = math.log(0.5)
V = [10.0, 20.0, 30.0, 40.0]
RATIOS = [2.0, 0.5, 100.0, 3.0]
# Per valid row (row 0 termination, row 0 truncation, row 1 termination, row 1 truncation).
VS = [6.5, 10.25, 11.0, 18.5]
ADV = [-3.5, 0.25, -9.0, -1.5]
VALUES = [10.0, 10.0, 20.0, 20.0]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _hand_set(alg):
    """``V(x) = x``, ``pi = (0.5, 0.5)``."""
    with torch.no_grad():
        alg.value_network.head.weight.fill_(1.0)
        alg.value_network.head.bias.zero_()
        alg.actor_network.head.weight.zero_()
        alg.actor_network.head.bias.zero_()


def _hand_unroll() -> Experience:
    T, B = 4, 2
    behaviour = np.log(0.5 / np.array(RATIOS, np.float32))[:, None].repeat(B, 1)
    return Experience(
        step_type=np.array([[F, F], [M, M], [L, L], [F, F]], np.int64),
        reward=np.array([[0, 0], [1, 1], [2, 2], [0, 0]], np.float32),
        discount=np.array([[1, 1], [1, 1], [0, 1], [1, 1]], np.float32),
        observation=np.array(V, np.float32)[:, None, None].repeat(B, 1),
        prev_action=np.zeros((T, B), np.int64), env_id=np.tile(np.arange(B), (T, 1)),
        action=np.zeros((T, B), np.int64),
        rollout_info={"log_prob": behaviour.astype(np.float32),
                      "value": np.array(V, np.float32)[:, None].repeat(B, 1)})


def _hand_alg(config):
    alg = algorithms.make(config, OBS1, TWO)
    _hand_set(alg)
    return alg


def test_impala_loss_by_hand():
    alg = _hand_alg(ImpalaConfig(actor_fc_layer_params=[], value_fc_layer_params=[], gamma=0.5,
                                 td_lambda=1.0, entropy_regularization=0.1, td_loss_weight=0.5,
                                 mini_batch_size=1000))
    exp = alg._experience(_hand_unroll())
    info = alg.train_step(exp).info
    info["out"].value.retain_grad()
    loss_info = alg.calc_loss(info)
    # pg = -adv * log pi (pi = 0.5), value 0.5 (v_s - V)^2, entropy bonus 0.1 log 2.
    expect = [-a * LOG_HALF + 0.5 * (vs - v) ** 2 - 0.1 * math.log(2)
              for a, vs, v in zip(ADV, VS, VALUES, strict=True)]
    torch.testing.assert_close(loss_info.loss, torch.tensor(expect))
    torch.testing.assert_close(loss_info.extra["vtrace/rho"], torch.tensor(1.0 * 2 / 4 + 0.5 / 2))
    # No gradient through the targets: dL/dV = td_loss_weight * 2 (V - v_s) / N on those rows
    # only (the LAST row and the bootstrap row get none).
    loss_info.loss.mean().backward()
    grad = info["out"].value.grad
    torch.testing.assert_close(grad[:2], torch.tensor(
        [[0.5 * 2 * (v - vs) / 4 for v, vs in zip(VALUES[i:i + 2], VS[i:i + 2], strict=True)]
         for i in (0, 2)]))
    assert (grad[2:] == 0).all()
    # Through train_on: the loss of its one update (one mini-batch, one epoch).
    alg = _hand_alg(alg.config)
    m = alg.train_on(_hand_unroll()).metrics
    assert m["loss/total"] == pytest.approx(sum(expect) / 4, rel=1e-6)
    assert m["vtrace/rho_clipped_fraction"] == pytest.approx(0.5)


def _appo(vtrace: bool, **kw):
    return _hand_alg(AppoConfig(actor_fc_layer_params=[], value_fc_layer_params=[], gamma=0.5,
                                td_lambda=1.0, vtrace=vtrace, normalize_advantages=False,
                                entropy_regularization=0.0, td_loss_weight=0.5,
                                importance_ratio_clipping=0.2, num_epochs=1,
                                mini_batch_size=1000, **kw))


def _ppo_clip(ratio, adv, eps=0.2):
    return -min(ratio * adv, min(max(ratio, 1 - eps), 1 + eps) * adv)


def test_appo_loss_by_hand_with_vtrace():
    """PPO's clipped surrogate with ratio pi/mu = [2, 0.5] on V-trace's advantages, the value
    regressed on v_s."""
    ratios = [2.0, 2.0, 0.5, 0.5]
    expect = [_ppo_clip(r, a) + 0.5 * (vs - v) ** 2
              for r, a, vs, v in zip(ratios, ADV, VS, VALUES, strict=True)]
    # 7 + 6.125, -0.3 + 0.03125, 7.2 + 40.5, 1.2 + 1.125
    assert expect == pytest.approx([13.125, -0.26875, 47.7, 2.325])
    m = _appo(True).train_on(_hand_unroll()).metrics
    assert m["loss/total"] == pytest.approx(sum(expect) / 4, rel=1e-6)
    assert m["vtrace/ratio"] == pytest.approx(1.25) and m["vtrace/rho"] == pytest.approx(0.75)


def test_appo_loss_by_hand_without_vtrace_is_ppo_on_gae():
    """``vtrace: false``: GAE (lambda 1: the discounted return minus the rollout's value),
    returns [[2, 9.5], [2, 17]], advantages [[-8, -0.5], [-18, -3]]; the same ratios."""
    ratios, adv, ret = [2.0, 2.0, 0.5, 0.5], [-8.0, -0.5, -18.0, -3.0], [2.0, 9.5, 2.0, 17.0]
    expect = [_ppo_clip(r, a) + 0.5 * (g - v) ** 2
              for r, a, g, v in zip(ratios, adv, ret, VALUES, strict=True)]
    assert expect == pytest.approx([48.0, 1.125, 176.4, 6.9])
    alg = _appo(False)
    m = alg.train_on(_hand_unroll()).metrics
    assert m["loss/total"] == pytest.approx(sum(expect) / 4, rel=1e-6)
    # The same lag is measured, though not corrected.
    assert m["vtrace/ratio"] == pytest.approx(1.25)
    # And it is PPO's update exactly.
    ppo = algorithms.make(PpoConfig(**{f.name: getattr(alg.config, f.name)
                                       for f in dataclasses.fields(PpoConfig)
                                       if f.name != "name"}), OBS1, TWO)
    _hand_set(ppo)
    assert ppo.train_on(_hand_unroll()).metrics["loss/total"] == pytest.approx(m["loss/total"])


def _unroll(actor, obs_space, act_space, T=8, B=6, seed=0) -> Experience:
    """``[T, B]`` rows acted on by ``actor``, its recurrent state carried; episodes end and
    start inside."""
    rng = np.random.default_rng(seed)
    state, rows = actor.get_initial_state(B), []
    for t in range(T):
        step_type = np.full(B, StepType.MID)
        step_type[(np.arange(B) + t) % 5 == 0] = StepType.FIRST
        step_type[(np.arange(B) + t) % 5 == 4] = StepType.LAST
        ts = _time_step(obs_space, act_space, B, rng)._replace(step_type=step_type)
        step = actor.rollout_step(ts, state)
        state = step.state
        rows.append({k: (v.cpu().numpy() if isinstance(v, torch.Tensor) else v)
                     for k, v in make_experience(ts, step).to_dict().items()})
    return Experience.from_dict({k: np.stack([r[k] for r in rows]) for k in rows[0]})


CONFIGS = {
    "impala": lambda **kw: ImpalaConfig(**{"actor_fc_layer_params": [16],
                                           "value_fc_layer_params": [16],
                                           "mini_batch_size": 56, **kw}),
    "appo": lambda **kw: AppoConfig(**{"actor_fc_layer_params": [16],
                                       "value_fc_layer_params": [16], "mini_batch_size": 16,
                                       **kw}),
}
OBS, ACTIONS = env_spaces("CartPole-v1")


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("rnn", [None, 8])
def test_a_lagged_batch_is_corrected(name, rnn):
    """A batch acted on by an older copy: the importance weights pi/mu differ from 1, those
    above rho-bar are truncated to it exactly, and the targets differ from the on-policy ones;
    the same batch acted on by the current network has every weight 1."""
    alg = algorithms.make(CONFIGS[name](rnn_size=rnn, learning_rate=0.05), OBS, ACTIONS)
    old = copy.deepcopy(alg)
    for seed in range(3):  # move the learner away from the copy
        alg.train_on(_unroll(alg, OBS, ACTIONS, seed=seed))
    lagged = alg._experience(_unroll(old, OBS, ACTIONS, seed=7))
    fresh = alg._experience(_unroll(alg, OBS, ACTIONS, seed=7))
    with torch.no_grad():
        out_lagged, out_fresh = unroll_outputs(alg, lagged), unroll_outputs(alg, fresh)
    on = vtrace_of(alg.config, fresh, out_fresh)
    off = vtrace_of(alg.config, lagged, out_lagged)
    valid = lagged.step_type[:-1] != StepType.LAST
    torch.testing.assert_close(on.log_rhos, torch.zeros_like(on.log_rhos), atol=1e-5, rtol=0)
    ratio = off.log_rhos.exp()[valid]
    assert (ratio - 1).abs().max() > 0.05, "the copy and the learner act alike"
    assert (ratio > 1).any() and (ratio < 1).any()
    rhos = off.rhos[valid]
    torch.testing.assert_close(rhos, ratio.clamp(max=1.0))
    assert (rhos == 1.0).sum() == (ratio >= 1.0).sum()
    # Its metrics say so.
    m = alg.train_on(_unroll(old, OBS, ACTIONS, seed=7)).metrics
    assert m["vtrace/rho_clipped_fraction"] > 0 and m["vtrace/abs_log_ratio"] > 0.01


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_recurrent_variants_train(name):
    """With ``rnn_size``: re-running the GRU from each unroll's stored state reproduces the
    rollout's log-probs (the batch is on-policy: every weight 1), and an update moves the
    cells."""
    obs, actions = env_spaces("CartPoleNoVelocity-v1")
    alg = algorithms.make(CONFIGS[name](rnn_size=8, shared_encoder_fc_layer_params=[16]),
                          obs, actions)
    exp = alg._experience(_unroll(alg, obs, actions, T=10, B=6))
    with torch.no_grad():
        out = unroll_outputs(alg, exp)
    torch.testing.assert_close(out.log_prob, exp.rollout_info["log_prob"])
    torch.testing.assert_close(out.value, exp.rollout_info["value"])
    before = {k: v.clone() for k, v in alg.rnn.state_dict().items()}
    m = alg.train_on(_unroll(alg, obs, actions, T=10, B=6)).metrics
    assert all(np.isfinite(v) for v in m.values())
    assert m["vtrace/rho_clipped_fraction"] == 0.0
    assert any(not torch.equal(v, before[k]) for k, v in alg.rnn.state_dict().items())


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_rmsprop_is_the_papers_optimizer(name):
    alg = algorithms.make(CONFIGS[name](optimizer="rmsprop"), OBS, ACTIONS)
    before = {k: v.clone() for k, v in alg.named_parameters()}
    alg.train_on(_unroll(alg, OBS, ACTIONS))
    (opt,) = alg.optimizers.values()
    assert isinstance(opt, torch.optim.RMSprop) and opt.param_groups[0]["alpha"] == 0.99
    assert any(not torch.equal(v, before[k]) for k, v in alg.named_parameters())
    state = alg.checkpoint_state()
    twin = algorithms.make(alg.config, OBS, ACTIONS)
    twin.load_checkpoint_state(state)
    assert twin.optimizers["ac"].state_dict()["state"].keys() == opt.state_dict()["state"].keys()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_more_epochs_and_mini_batches(name):
    """Several epochs of several mini-batches per unroll: each one an update."""
    alg = algorithms.make(CONFIGS[name](num_epochs=3, mini_batch_size=14), OBS, ACTIONS)
    exp = _unroll(alg, OBS, ACTIONS, T=8, B=6)
    alg.train_on(exp)
    # IMPALA: 14 // 7 rows = 2 whole columns of 6; APPO: rows with a transition, 14 at a time.
    per_epoch = 3 if name == "impala" else math.ceil(
        int((exp.step_type[:-1] != StepType.LAST).sum()) / 14)
    assert alg.num_updates == 3 * per_epoch


def train_lagged(alg, env_id: str, lag: int, budget: int, threshold: float, seed: int,
                 num_envs: int = 8, unroll_length: int = 32, eval_interval: int = 5000):
    """The reference trainer's on-policy loop with a fixed policy lag: the acting copy holds
    the parameters of ``lag`` updates ago. Returns the env steps at the first greedy
    evaluation that reached ``threshold`` (None if none did)."""
    from collections import deque

    from algorithms.evaluation import evaluate
    from algorithms.steps import VectorEnvStepper, make_vector_env
    from algorithms.sync_trainer import _numpy_experience, stack_experience

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the reference trainer: small networks, a shared CPU
    torch.manual_seed(seed)
    env = make_vector_env(env_id, num_envs, seed, training=True)
    stepper = VectorEnvStepper(env, seed)
    actor, published = copy.deepcopy(alg), deque()
    ts = stepper.reset()
    step = actor.rollout_step(ts, actor.get_initial_state(num_envs))
    cur, steps, next_eval = _numpy_experience(ts, step), 0, eval_interval
    try:
        while steps < budget:
            rows = [cur]
            for _ in range(unroll_length):
                ts = stepper.step(cur.action)
                step = actor.rollout_step(ts, step.state)
                cur = _numpy_experience(ts, step)
                rows.append(cur)
                steps += num_envs
            alg.train_on(stack_experience(rows))
            published.append(alg.policy_state_dict())  # copies
            while len(published) > lag:
                actor.load_policy_state_dict(published.popleft())
            if steps >= next_eval:
                next_eval += eval_interval
                if evaluate(alg, env_id, 10, seed=10_000 + seed).mean_return >= threshold:
                    return steps
    finally:
        env.close()
        torch.set_num_threads(threads)
    return None


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("key,lag", [("appo-CartPole-v1", 8), ("impala-CartPole-v1", 8)])
def test_learns_cartpole_under_a_policy_lag(key, lag):
    """The presets reach 475 when every unroll was acted on by parameters ``lag`` updates old
    (seeds 0-2, within the preset's budget)."""
    from algorithms.presets import PRESETS, make_algorithm

    p = PRESETS[key]
    for seed in range(3):
        reached = train_lagged(make_algorithm(p, seed), p.env_id, lag, p.budget, p.threshold,
                               seed, p.trainer["num_envs"], p.trainer["unroll_length"],
                               p.trainer["eval_interval"])
        assert reached is not None, f"{key} seed {seed} lag {lag}: not {p.threshold}"


def test_appo_clips_against_the_learner_when_asked():
    """``proximal_policy: learner`` (decoupled PPO): on a lagged batch the first update's
    ratio is against the network as the batch found it, so nothing is clipped; against the
    behaviour policy (the default) the lag alone puts ratios past the clip."""
    fractions = {}
    for proximal in ("behaviour", "learner"):
        torch.manual_seed(0)
        alg = algorithms.make(CONFIGS["appo"](learning_rate=0.05, num_epochs=1,
                                              mini_batch_size=48, proximal_policy=proximal),
                              OBS, ACTIONS)
        old = copy.deepcopy(alg)
        for seed in range(3):
            alg.train_on(_unroll(alg, OBS, ACTIONS, seed=seed))
        fractions[proximal] = alg.train_on(_unroll(old, OBS, ACTIONS, seed=7)).metrics[
            "clip_fraction"]
    assert fractions["learner"] == 0.0
    assert fractions["behaviour"] > 0.0
