"""``Policy.export`` / ``run.py export``: the greedy policy as a ``torch.export`` file that
another process loads with torch alone and that acts as ``policy.act`` does, state included."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import torch

from conduit import load_exported, load_policy
from pipeline.cli import main
from tests.test_policy_load import AGENTS, assert_same_actions, make_run, observations

# Run in a fresh interpreter: loads every exported file with torch and nothing of ours, acts
# twice (episode starts, then one row going on and two starting again) and once with batch 1.
TORCH_ONLY = """
import json, sys, torch
cases = torch.load(sys.argv[1])
out = {}
for name, case in cases.items():
    extra = {"conduit.json": ""}
    module = torch.export.load(case["file"], extra_files=extra).module()
    record = json.loads(extra["conduit.json"])
    def zeros(b):
        return tuple(torch.zeros(b, *s["shape"], dtype=getattr(torch, s["dtype"]))
                     for s in record["state"])
    b = case["obs1"].shape[0]
    with torch.no_grad():
        a1, state = module(case["obs1"], torch.ones(b, dtype=torch.bool), zeros(b))
        a2, state = module(case["obs2"], case["first2"], state)
        a3, _ = module(case["obs1"][:1], torch.ones(1, dtype=torch.bool), zeros(1))
    out[name] = {"a1": a1, "a2": a2, "a3": a3, "state": list(state)}
ours = sorted(m for m in sys.modules if m.split(".")[0] in
              ("algorithms", "conduit", "nodes", "pipeline", "storage", "gymnasium"))
assert not ours, ours
torch.save(out, sys.argv[2])
"""


def test_exported_files_act_as_the_policy_with_torch_alone(tmp_path):
    cases, expected = {}, {}
    for name, agent in sorted(AGENTS.items()):
        run_dir, _, _ = make_run(tmp_path / name, agent, final=False, wild=True)
        policy = load_policy(run_dir)
        path = policy.export(str(tmp_path / "exported" / f"{name}.pt2"))
        obs1 = observations(policy.observation_space, 3, seed=1)
        obs2 = observations(policy.observation_space, 3, seed=2)
        first2 = np.array([False, True, True])
        a1, state = policy.act(obs1)
        a2, state = policy.act(obs2, state, episode_start=first2)
        a3, _ = policy.act(obs1[0])
        expected[name] = {"a1": a1, "a2": a2, "a3": a3, "state": state}
        cases[name] = {"file": path, "obs1": torch.as_tensor(obs1), "obs2": torch.as_tensor(obs2),
                       "first2": torch.as_tensor(first2)}
    torch.save(cases, tmp_path / "cases.pt")
    done = subprocess.run([sys.executable, "-c", TORCH_ONLY, str(tmp_path / "cases.pt"),
                           str(tmp_path / "out.pt")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = torch.load(tmp_path / "out.pt", weights_only=True)
    for name, want in expected.items():
        assert_same_actions(got[name]["a1"].numpy(), want["a1"])
        assert_same_actions(got[name]["a2"].numpy(), want["a2"])
        assert_same_actions(got[name]["a3"].numpy()[0], want["a3"])
        assert len(got[name]["state"]) == len(want["state"])
        for g, w in zip(got[name]["state"], want["state"], strict=True):
            torch.testing.assert_close(g, w)
    # The state is there where the policy has one: frame stacks, the recurrent core.
    assert len(expected["dqn_minatar_stacked"]["state"]) == 1
    assert len(expected["ppo_recurrent"]["state"]) == 1 and len(expected["sac"]["state"]) == 0


def test_an_exported_file_holds_the_acting_parameters_only(tmp_path):
    run_dir, alg, _ = make_run(tmp_path / "run", AGENTS["sac"], final=False)
    path = load_policy(run_dir).export(str(tmp_path / "sac.pt2"))
    program = torch.export.load(path)
    names = list(program.state_dict)
    assert names and not [n for n in names if "critic" in n], names
    kept = sum(t.numel() for t in program.state_dict.values())
    # Besides the policy: its counters, SAC's log_alpha and the action bounds.
    assert kept <= sum(t.numel() for t in alg.policy_state_dict().values()) + 8
    module, record = load_exported(path)
    assert record["algorithm"] == "sac" and record["state"] == []
    assert record["policy"]["which"] == "best" and record["policy"]["env_steps"] == 4000


def test_run_py_export(tmp_path, capsys):
    run_dir, _, _ = make_run(tmp_path / "run", AGENTS["ppo_recurrent"], final=False)
    target = str(tmp_path / "out" / "policy.pt2")
    # In this process (run.py is `import nodes` and this main; tests/test_policy_commands.py
    # runs run.py itself).
    assert main(["export", run_dir, "--to", target]) == 0
    assert f"wrote {target}" in capsys.readouterr().out
    module, record = load_exported(target)
    assert record["recurrent"] and record["state"] == [{"shape": [32], "dtype": "float32"}]
    # A user mistake: one line, exit 2.
    assert main(["export", run_dir, "--which", "final", "--to", target]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no complete checkpoint") and err.count("\n") == 1
