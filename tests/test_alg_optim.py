"""FusedAdam: the same updates and state layout as torch.optim.Adam(fused=True), and a learner's
first update that imports neither torch._dynamo nor sympy."""

import copy
import subprocess
import sys

import pytest
import torch

from algorithms.optim import FusedAdam
from tests.pipeline_harness import ROOT


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def _train(model, opt, steps: int, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        model(torch.randn(32, 5, generator=g)).pow(2).mean().backward()
        opt.step()


@pytest.mark.parametrize("kwargs", [{}, {"eps": 1e-5, "weight_decay": 0.01, "betas": (0.8, 0.9)}])
def test_updates_are_bitwise_those_of_torch_fused_adam(kwargs):
    ours, theirs = _model(0), _model(0)
    _train(ours, FusedAdam(ours.parameters(), lr=3e-3, **kwargs), 25)
    _train(theirs, torch.optim.Adam(theirs.parameters(), lr=3e-3, fused=True, **kwargs), 25)
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(a, b)


def test_state_dict_moves_between_fused_adam_and_torch_adam():
    # torch -> ours: continuing with our optimizer gives torch's next steps exactly.
    a, b = _model(0), _model(0)
    opt_a = torch.optim.Adam(a.parameters(), lr=1e-2, fused=True)
    _train(a, opt_a, 7)
    b.load_state_dict(a.state_dict())
    opt_b = FusedAdam(b.parameters(), lr=1e-2)
    opt_b.load_state_dict(opt_a.state_dict())
    _train(a, opt_a, 5, seed=2)
    _train(b, opt_b, 5, seed=2)
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(x, y)
    # ours -> torch: torch accepts our layout.
    c = _model(0)
    c.load_state_dict(b.state_dict())
    opt_c = torch.optim.Adam(c.parameters(), lr=1e-2, fused=True)
    opt_c.load_state_dict(copy.deepcopy(opt_b.state_dict()))  # as torch's: references
    _train(b, opt_b, 3, seed=3)
    _train(c, opt_c, 3, seed=3)
    for x, y in zip(b.parameters(), c.parameters(), strict=True):
        assert torch.equal(x, y)


def test_load_rejects_state_for_other_parameters():
    opt = FusedAdam(_model(0).parameters())
    other = torch.optim.Adam(torch.nn.Linear(2, 2).parameters())
    with pytest.raises(ValueError, match="holds 2 parameters, this optimizer has 4"):
        opt.load_state_dict(other.state_dict())


def test_parameters_that_do_not_fit_the_kernel_are_rejected():
    with pytest.raises(ValueError, match="floating-point"):
        FusedAdam([torch.zeros(3, dtype=torch.int64)])


def test_first_sac_update_imports_neither_dynamo_nor_sympy():
    """The learner's first update sits on every run's critical path; these two imports cost
    1.1-1.7 s and 0.6 s of it."""
    code = """
import sys
import numpy as np
from algorithms.presets import get_preset, make_algorithm
from algorithms.data import Experience
alg = make_algorithm(get_preset('sac', 'Pendulum-v1'), 0)
B, T = 8, 2
exp = Experience(step_type=np.ones((B, T), np.int32), reward=np.zeros((B, T), np.float32),
                 discount=np.ones((B, T), np.float32),
                 observation=np.zeros((B, T, 3), np.float32),
                 action=np.zeros((B, T, 1), np.float32))
alg.train_on(exp)
alg.train_on(exp)
print(sorted(m for m in ('torch._dynamo', 'sympy') if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_groups_step_like_separate_optimizers_and_keep_their_state_layout():
    # Two groups with different learning rates in one FusedAdam == two FusedAdams, bitwise.
    ours, theirs = _model(0), _model(0)
    l1, l2 = list(ours.children())[0], list(ours.children())[2]
    t1, t2 = list(theirs.children())[0], list(theirs.children())[2]
    joint = FusedAdam([{"params": l1.parameters(), "lr": 1e-2},
                       {"params": l2.parameters(), "lr": 3e-3}])
    a, b = FusedAdam(t1.parameters(), lr=1e-2), FusedAdam(t2.parameters(), lr=3e-3)

    class Both:
        def zero_grad(self, set_to_none=True):
            a.zero_grad(set_to_none), b.zero_grad(set_to_none)

        def step(self):
            a.step(), b.step()

    _train(ours, joint, 9)
    _train(theirs, Both(), 9)
    for x, y in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(x, y)
    # Group i's state is the single optimizer's state, and loads back into a fresh group.
    for i, single in enumerate((a, b)):
        mine, ref = joint.state_dict(group=i), single.state_dict()
        assert mine["param_groups"] == ref["param_groups"]
        for k, s in ref["state"].items():
            for name, v in s.items():
                assert torch.equal(mine["state"][k][name], v)
    fresh = FusedAdam([{"params": l1.parameters(), "lr": 1.0},
                       {"params": l2.parameters(), "lr": 1.0}])
    fresh.load_state_dict(b.state_dict(), group=1)
    assert fresh.param_groups[1]["lr"] == 3e-3 and fresh.param_groups[0]["lr"] == 1.0
    with pytest.raises(ValueError, match="several groups"):
        joint.state_dict()


def test_clip_grad_norm_matches_torch():
    from algorithms.optim import _clip_grad_norm

    a, b = _model(0), _model(0)
    for m in (a, b):
        m(torch.randn(8, 5, generator=torch.Generator().manual_seed(4))).pow(2).sum().backward()
    torch.nn.utils.clip_grad_norm_(list(a.parameters()), 0.5)
    _clip_grad_norm(list(b.parameters()), 0.5)
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(x.grad, y.grad, rtol=1e-6, atol=0)


def test_cached_buckets_follow_a_learning_rate_change_and_missing_gradients():
    """FusedAdam keeps its per-bucket lists between steps: a new learning rate, a parameter
    without gradient and a loaded state must still give torch's updates exactly."""
    ours, theirs = _model(0), _model(0)
    opt_o = FusedAdam(ours.parameters(), lr=3e-3)
    opt_t = torch.optim.Adam(theirs.parameters(), lr=3e-3, fused=True)
    _train(ours, opt_o, 5)
    _train(theirs, opt_t, 5)
    for opt in (opt_o, opt_t):
        opt.param_groups[0]["lr"] = 1e-3
    _train(ours, opt_o, 5, seed=2)
    _train(theirs, opt_t, 5, seed=2)
    for model, opt in ((ours, opt_o), (theirs, opt_t)):  # the last layer only
        opt.zero_grad(set_to_none=True)
        model[2](torch.randn(8, 16, generator=torch.Generator().manual_seed(4))).sum().backward()
        opt.step()
    # Each parameter's own step count (the bucket's counters are views of one tensor).
    assert [float(s["step"]) for s in opt_o.state_dict()["state"].values()] == \
        [float(s["step"]) for s in opt_t.state_dict()["state"].values()] == [10, 10, 11, 11]
    opt_o.load_state_dict(copy.deepcopy(opt_t.state_dict()))
    _train(ours, opt_o, 3, seed=3)
    _train(theirs, opt_t, 3, seed=3)
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(a, b)
