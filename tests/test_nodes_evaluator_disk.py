"""An evaluator whose kept-policy write fails (full or failing disk) says so in its status
and goes on evaluating; the next write that succeeds clears the warning."""

import asyncio
import os
import types

import torch

from nodes.evaluator import _keep


def test_a_refused_write_is_a_warning_and_the_next_one_clears_it(tmp_path):
    node = types.SimpleNamespace(status={})
    policy = {"w": torch.ones(2)}
    blocked = tmp_path / "best"
    blocked.write_text("a file where the directory should be")  # every write below it fails
    assert not asyncio.run(_keep(node, str(blocked), policy, {"mean_return": 1.0}))
    assert node.status["warning"].startswith("policy not kept in")
    os.remove(blocked)
    assert asyncio.run(_keep(node, str(blocked), policy, {"mean_return": 2.0}))
    assert "warning" not in node.status
    assert os.path.isdir(blocked)
