"""Multi-step targets against hand-computed numbers, episode ends and truncation included.

Every case: T = 4, B = 1, gamma = 0.5, values V = [10, 20, 30, 40]. ``r[t]``/``d[t]`` belong to
the transition that arrived at t, so the target of row t uses r[t+1], d[t+1], V[t+1].
"""

import pytest
import torch

from algorithms import value_ops
from algorithms.data import StepType

F, M, L = StepType.FIRST, StepType.MID, StepType.LAST
V = [10.0, 20.0, 30.0, 40.0]
GAMMA = 0.5

# name, step types, rewards, discounts, expected {one_step, lambda1, lambda0.5, gae0.5, mask}
CASES = [
    ("all_mid", [F, M, M, M], [0, 1, 2, 3], [1, 1, 1, 1],
     # one-step: 1+.5*20, 2+.5*30, 3+.5*40; λ=1: 3+20=23, 2+.5*23, 1+.5*13.5
     # λ=.5: G1 = 2+.5*(.5*30+.5*23) = 15.25, G0 = 1+.5*(.5*20+.5*15.25) = 9.8125
     dict(one=[11, 17, 23], lam1=[7.75, 13.5, 23], lam_half=[9.8125, 15.25, 23],
          gae=[-0.1875, -4.75, -7], mask=[1, 1, 1])),
    ("termination_inside", [F, M, L, F], [0, 1, 2, 0], [1, 1, 0, 1],
     # row 2 is LAST: no transition, target V[2]; row 1 ends the episode: 2 + .5*0*V[2]
     dict(one=[11, 2, 30], lam1=[2, 2, 30], lam_half=[6.5, 2, 30],
          gae=[-3.5, -18, 0], mask=[1, 1, 0])),
    ("truncation_inside", [F, M, L, F], [0, 1, 2, 0], [1, 1, 1, 1],
     # truncation keeps discount 1: bootstrap from V(final observation) = V[2]
     dict(one=[11, 17, 30], lam1=[9.5, 17, 30], lam_half=[10.25, 17, 30],
          gae=[0.25, -3, 0], mask=[1, 1, 0])),
    ("new_episode_inside", [M, L, F, M], [0, 1, 0, 3], [1, 0, 1, 1],
     # row 0 terminates; row 1 is LAST; row 2 starts a new episode: 3 + .5*40
     dict(one=[1, 20, 23], lam1=[1, 20, 23], lam_half=[1, 20, 23],
          gae=[-9, 0, -7], mask=[1, 0, 1])),
]


def _t(x, dtype=torch.float32):
    return torch.tensor(x, dtype=dtype).unsqueeze(1)  # [T, 1]


@pytest.mark.parametrize("name,st,r,d,exp", CASES, ids=[c[0] for c in CASES])
def test_targets(name, st, r, d, exp):
    st, r, d, v = _t([int(s) for s in st], torch.int64), _t(r), _t(d), _t(V)
    torch.testing.assert_close(value_ops.one_step_discounted_return(r, v, st, d, GAMMA),
                               _t(exp["one"]))
    torch.testing.assert_close(value_ops.discounted_return(r, v, st, d, GAMMA), _t(exp["lam1"]))
    torch.testing.assert_close(value_ops.td_lambda_return(r, v, st, d, GAMMA, 0.5),
                               _t(exp["lam_half"]))
    torch.testing.assert_close(value_ops.td_lambda_return(r, v, st, d, GAMMA, 0.0),
                               _t(exp["one"]))
    gae = value_ops.generalized_advantage_estimation(r, v, st, d, GAMMA, 0.5)
    torch.testing.assert_close(gae, _t(exp["gae"]))
    mask = value_ops.valid_mask(st)
    torch.testing.assert_close(mask, _t(exp["mask"]))
    # GAE + V equals the λ-return on every valid row.
    torch.testing.assert_close((gae + v[:-1]) * mask, _t(exp["lam_half"]) * mask)


def test_trailing_dims_broadcast():
    st = torch.full((4, 2), int(M))
    r = torch.ones(4, 2)
    d = torch.ones(4, 2)
    v = torch.arange(16.0).view(4, 2, 2)  # e.g. two critic replicas
    out = value_ops.td_lambda_return(r, v, st, d, GAMMA, 0.5)
    assert out.shape == (3, 2, 2)
    for k in range(2):
        torch.testing.assert_close(out[..., k],
                                   value_ops.td_lambda_return(r, v[..., k], st, d, GAMMA, 0.5))


def test_normalize_advantages():
    a = torch.tensor([1.0, 2.0, 3.0, 100.0])
    n = value_ops.normalize_advantages(a, mask=torch.tensor([1.0, 1.0, 1.0, 0.0]))
    torch.testing.assert_close(n[:3], torch.tensor([-1.2247, 0.0, 1.2247]), atol=1e-4, rtol=0)
    full = value_ops.normalize_advantages(a)
    assert abs(float(full.mean())) < 1e-6 and abs(float(full.std(unbiased=False)) - 1) < 1e-4


# Distinct gamma and lambda (issue 37, item 6): with gamma == lambda (the cases above) a GAE
# called with the two swapped gives the same numbers. gamma = 0.9, lambda = 0.5, V as above.
# all_mid: deltas 1+.9*20-10 = 9, 2+.9*30-20 = 9, 3+.9*40-30 = 9; A2 = 9,
# A1 = 9+.45*9 = 13.05, A0 = 9+.45*13.05 = 14.8725; lambda-returns A + V = 24.8725, 33.05, 39.
# termination_inside: delta1 = 2+.9*0*30-20 = -18 (the episode ends), delta0 = 9,
# A0 = 9+.45*(-18) = 0.9; row 2 (LAST) is masked: 0.
# Swapped (gamma .5, lambda .9) gives deltas 1, -3, -7: every row differs.
DISTINCT = [
    ("all_mid", [F, M, M, M], [0, 1, 2, 3], [1, 1, 1, 1],
     [14.8725, 13.05, 9.0], [24.8725, 33.05, 39.0]),
    ("termination_inside", [F, M, L, F], [0, 1, 2, 0], [1, 1, 0, 1],
     [0.9, -18.0, 0.0], [10.9, 2.0, 30.0]),
]


@pytest.mark.parametrize("name,st,r,d,gae,lam", DISTINCT, ids=[c[0] for c in DISTINCT])
def test_gae_and_lambda_returns_with_distinct_gamma_and_lambda(name, st, r, d, gae, lam):
    st, r, d, v = _t([int(s) for s in st], torch.int64), _t(r), _t(d), _t(V)
    torch.testing.assert_close(value_ops.generalized_advantage_estimation(r, v, st, d, 0.9, 0.5),
                               _t(gae))
    mask = value_ops.valid_mask(st)
    torch.testing.assert_close(value_ops.td_lambda_return(r, v, st, d, 0.9, 0.5) * mask,
                               _t(lam) * mask)
    from algorithms.losses import advantages_and_returns

    adv, ret = advantages_and_returns(st, r, d, v, 0.9, 0.5)
    torch.testing.assert_close(adv, _t(gae))
    torch.testing.assert_close(ret * mask, _t(lam) * mask)


def test_ppo_passes_its_gamma_and_lambda_in_that_order(monkeypatch):
    """The call site too (mutation caught: PPO calling GAE with gamma and lambda swapped)."""
    import gymnasium as gym
    import numpy as np

    import algorithms
    from algorithms import losses, ppo
    from algorithms.configs import PpoConfig
    from tests.test_alg_interface import _unroll

    seen = []

    def spy(step_type, reward, discount, value, gamma, td_lambda, *args, **kwargs):
        seen.append((gamma, td_lambda))
        return losses.advantages_and_returns(step_type, reward, discount, value, gamma,
                                             td_lambda, *args, **kwargs)

    monkeypatch.setattr(ppo, "advantages_and_returns", spy)
    obs, actions = gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Discrete(2)
    alg = algorithms.make(PpoConfig(gamma=0.9, td_lambda=0.5, mini_batch_size=4, num_epochs=1),
                          obs, actions)
    alg.train_on(_unroll(alg, obs, actions, 4, 2, 0))
    assert seen == [(0.9, 0.5)]
