"""V-trace (:func:`algorithms.value_ops.vtrace`) against numbers computed by hand, its on-policy
limit (the n-step and λ-returns of :mod:`algorithms.value_ops`), the truncation of the
importance weights, and episode boundaries.

Hand-computed cases: T = 4, B = 2, gamma = 0.5, V = [10, 20, 30, 40] in both columns, step
types [FIRST, MID, LAST, FIRST], rewards [0, 1, 2, 0]; column 0 terminates at step 2
(discount 0), column 1 is truncated there (discount 1). pi/mu = [2, 0.5, 100, 3] (the LAST
row's 100 and the bootstrap row's 3 are never used).
"""

import math

import pytest
import torch

from algorithms import value_ops
from algorithms.data import StepType

F, M, L = StepType.FIRST, StepType.MID, StepType.LAST
GAMMA = 0.5
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _case(device="cpu"):
    t = lambda x, dt=torch.float32: torch.tensor(x, dtype=dt, device=device)  # noqa: E731
    step_types = t([[F, F], [M, M], [L, L], [F, F]], torch.int64)
    rewards = t([[0, 0], [1, 1], [2, 2], [0, 0]])
    discounts = t([[1, 1], [1, 1], [0, 1], [1, 1]])
    values = t([[10, 10], [20, 20], [30, 30], [40, 40]])
    ratios = t([[2, 2], [0.5, 0.5], [100, 100], [3, 3]])
    target = torch.randn(4, 2, device=device)
    behaviour = target - ratios.log()
    return target, behaviour, rewards, values, step_types, discounts


# (rho_bar, c_bar, pg_rho_bar) -> expected vs and pg advantages, columns [termination, truncation]
HAND = [
    # row 1: rho = c = 0.5. termination: delta = .5 (2 + .5*0*30 - 20) = -9, vs = 11;
    #   truncation: delta = .5 (2 + .5*30 - 20) = -1.5, vs = 18.5.
    # row 0: rho = c = min(1, 2) = 1, delta = 1 + .5*20 - 10 = 1;
    #   termination: vs = 10 + 1 + .5*1*(-9) = 6.5, pg = 1 + .5*11 - 10 = -3.5;
    #   truncation: vs = 10 + 1 + .5*1*(-1.5) = 10.25, pg = 1 + .5*18.5 - 10 = .25.
    ((1.0, 1.0, None), [[6.5, 10.25], [11, 18.5], [30, 30]],
     [[-3.5, 0.25], [-9, -1.5], [0, 0]]),
    # rho_bar 2, c_bar .5, pg_rho_bar 1. row 0: rho = 2, c = .5, delta = 2 * 1 = 2;
    #   termination: vs = 10 + 2 + .5*.5*(-9) = 9.75, pg = 1 * (1 + .5*11 - 10) = -3.5;
    #   truncation: vs = 10 + 2 + .5*.5*(-1.5) = 11.625, pg = 1 * (1 + .5*18.5 - 10) = .25.
    ((2.0, 0.5, 1.0), [[9.75, 11.625], [11, 18.5], [30, 30]],
     [[-3.5, 0.25], [-9, -1.5], [0, 0]]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("clips,vs,pg", HAND)
def test_hand_computed(device, clips, vs, pg):
    target, behaviour, rewards, values, step_types, discounts = _case(device)
    rho_bar, c_bar, pg_rho_bar = clips
    out = value_ops.vtrace(target, behaviour, rewards, values, step_types, discounts, GAMMA,
                           rho_bar, c_bar, pg_rho_bar)
    expect = lambda x: torch.tensor(x, device=device)  # noqa: E731
    torch.testing.assert_close(out.vs, expect(vs))
    torch.testing.assert_close(out.pg_advantages, expect(pg))
    # Clipped weights; the LAST row's is 1 (its action was never applied).
    torch.testing.assert_close(out.rhos, expect([[min(rho_bar, 2.0)] * 2, [0.5] * 2, [1.0] * 2]))
    assert out.vs.device.type == device


def test_no_gradient_through_the_targets():
    target, behaviour, rewards, values, step_types, discounts = _case()
    target.requires_grad_(True)
    values.requires_grad_(True)
    out = value_ops.vtrace(target, behaviour, rewards, values, step_types, discounts, GAMMA)
    assert not out.vs.requires_grad and not out.pg_advantages.requires_grad


def _random_episodes(T, B, seed, truncate=True):
    g = torch.Generator().manual_seed(seed)
    step_types = torch.full((T, B), int(M), dtype=torch.int64)
    step_types[0] = F
    discounts = torch.ones(T, B)
    for b in range(B):
        t = int(torch.randint(1, 4, (), generator=g))
        while t < T - 1:
            step_types[t, b] = L
            step_types[t + 1, b] = F
            if not truncate or bool(torch.rand((), generator=g) < 0.5):
                discounts[t, b] = 0.0  # termination; else truncation
            t += int(torch.randint(2, 6, (), generator=g))
    rewards = torch.randn(T, B, generator=g)
    rewards[step_types == F] = 0.0
    values = torch.randn(T, B, generator=g) * 3
    log_probs = -torch.rand(T, B, generator=g) * 2
    return log_probs, rewards, values, step_types, discounts


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("td_lambda", [1.0, 0.8])
def test_on_policy_limit_is_the_lambda_return(seed, td_lambda):
    """pi = mu: every ratio is 1, so rho_bar = c_bar = 1 (or anything above) clips nothing and
    v_s is the λ-return (λ = 1: the n-step return to the window or episode end)."""
    log_probs, rewards, values, step_types, discounts = _random_episodes(12, 5, seed)
    for clip in (1.0, 1e6):
        out = value_ops.vtrace(log_probs, log_probs, rewards, values, step_types, discounts,
                               0.9, clip, clip, td_lambda=td_lambda)
        expect = value_ops.td_lambda_return(rewards, values, step_types, discounts, 0.9,
                                            td_lambda)
        torch.testing.assert_close(out.vs, expect)
        if td_lambda == 1.0:
            torch.testing.assert_close(
                out.vs, value_ops.discounted_return(rewards, values, step_types, discounts, 0.9))
        # The advantage is the one-step error against the next target: with λ = 1, the
        # n-step return minus V (what A2C uses), 0 on LAST rows.
        mask = value_ops.valid_mask(step_types)
        if td_lambda == 1.0:
            torch.testing.assert_close(out.pg_advantages, (expect - values[:-1]) * mask)
        torch.testing.assert_close(out.rhos, torch.ones_like(out.rhos))


def test_large_ratios_are_clipped_exactly():
    log_probs, rewards, values, step_types, discounts = _random_episodes(8, 3, 0)
    # Ratios e^50 (and e^1000, inf in float32) everywhere: rho = rho_bar, c = c_bar exactly.
    for log_ratio in (50.0, 1000.0):
        behaviour = log_probs - log_ratio
        out = value_ops.vtrace(log_probs, behaviour, rewards, values, step_types, discounts,
                               0.9, 1.5, 0.7, 1.2)
        mask = value_ops.valid_mask(step_types)
        assert torch.isfinite(out.vs).all() and torch.isfinite(out.pg_advantages).all()
        torch.testing.assert_close(out.rhos, 1.5 * mask + (1 - mask))
        # The same recursion written with the clipped constants directly.
        vs, pg = _reference(rewards, values, step_types, discounts, 0.9,
                            rho=1.5, c=0.7, pg_rho=1.2)
        torch.testing.assert_close(out.vs, vs)
        torch.testing.assert_close(out.pg_advantages, pg)


def test_small_ratios_are_not_clipped():
    log_probs, rewards, values, step_types, discounts = _random_episodes(8, 3, 1)
    out = value_ops.vtrace(log_probs, log_probs + math.log(4.0), rewards, values, step_types,
                           discounts, 0.9, 1.0, 1.0)
    vs, pg = _reference(rewards, values, step_types, discounts, 0.9, rho=0.25, c=0.25,
                        pg_rho=0.25)
    torch.testing.assert_close(out.vs, vs)
    torch.testing.assert_close(out.pg_advantages, pg)


def _reference(rewards, values, step_types, discounts, gamma, rho, c, pg_rho):
    """The paper's definition summed term by term (eq. 1), per column, stopping at LAST."""
    T, B = values.shape
    vs = values[:-1].clone()
    pg = torch.zeros(T - 1, B)
    for b in range(B):
        for s in range(T - 1):
            if step_types[s, b] == L:
                continue
            total, weight, t = 0.0, 1.0, s
            while True:  # sum over t >= s of gamma^(t-s) (prod c) delta_t
                d = gamma * discounts[t + 1, b]
                total += weight * rho * (rewards[t + 1, b] + d * values[t + 1, b] - values[t, b])
                if t + 1 == T - 1 or step_types[t + 1, b] == L:
                    break
                weight *= d * c
                t += 1
            vs[s, b] = values[s, b] + total
    for b in range(B):
        for s in range(T - 1):
            if step_types[s, b] == L:
                continue
            nxt = values[s + 1, b] if (s + 1 == T - 1 or step_types[s + 1, b] == L) \
                else vs[s + 1, b]
            pg[s, b] = pg_rho * (rewards[s + 1, b] + gamma * discounts[s + 1, b] * nxt
                                 - values[s, b])
    return vs, pg


def test_targets_do_not_cross_episode_boundaries():
    """Changing everything after a LAST step (the next episode) leaves every target before
    it unchanged; the LAST row itself keeps v_s = V and advantage 0."""
    log_probs, rewards, values, step_types, discounts = _random_episodes(10, 1, 0)
    step_types[:, 0] = torch.tensor([F, M, M, L, F, M, M, M, M, M])
    behaviour = log_probs + 0.3 * torch.randn(10, 1)
    a = value_ops.vtrace(log_probs, behaviour, rewards, values, step_types, discounts, 0.9)
    later = slice(4, None)
    rewards2, values2, lp2 = rewards.clone(), values.clone(), log_probs.clone()
    rewards2[later] += 5.0
    values2[later] -= 7.0
    lp2[later] -= 1.0
    b = value_ops.vtrace(lp2, behaviour, rewards2, values2, step_types, discounts, 0.9)
    torch.testing.assert_close(a.vs[:4], b.vs[:4])
    torch.testing.assert_close(a.pg_advantages[:4], b.pg_advantages[:4])
    assert a.vs[3, 0] == values[3, 0] and a.pg_advantages[3, 0] == 0
    assert not torch.allclose(a.vs[4:], b.vs[4:])
