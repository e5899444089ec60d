"""Data transformers in the graph (issue 9 item 3): an algorithm's ``data_transformers`` are
applied identically by unroller, learner and evaluator, and the normalizer statistics travel
with the parameters, so the three map one raw observation to the same value at one version."""

from __future__ import annotations

import os

import numpy as np
import pytest
import yaml

import nodes.messages  # noqa: F401 - registers the RL message types for the taps
from tests.pipeline_harness import ROOT, LiveRun

PROBE = [0.5, -0.5, 0.05, 1.0]  # a raw CartPole observation


def normalized_ppo_graph(tmp_path) -> str:
    with open(os.path.join(ROOT, "graphs", "ppo_cartpole.yaml")) as f:
        graph = yaml.safe_load(f)
    graph["agent"]["algorithm"]["data_transformers"] = [
        {"name": "observation_normalizer", "clipping": 5.0}]
    graph["agent"]["probe_observation"] = PROBE
    graph["nodes"]["evaluator"]["config"].update(eval_interval=2000, stop_at_return=None,
                                                 num_eval_episodes=2)
    graph["nodes"]["learner"]["config"]["num_env_steps"] = 60_000
    path = tmp_path / "ppo_normalized.yaml"
    path.write_text(yaml.safe_dump(graph))
    return str(path)


@pytest.mark.timeout(600)
def test_unroller_learner_and_evaluator_see_the_same_normalized_observation(tmp_path):
    run = LiveRun(str(tmp_path / "run"), normalized_ppo_graph(tmp_path))
    try:
        run.wait_ready()
        # Three evaluations: the statistics have moved by then (a PPO version per 256 steps).
        run.wait_for_message("metrics", lambda m: m.values.get("eval/return") is not None and
                             m.env_steps >= 6000)
        nodes = run.command("status")["nodes"]
        probes = {name: nodes[f"{name}.0"]["status"]["probe"]
                  for name in ("unroller", "learner", "evaluator")}
        common = set(probes["unroller"]) & set(probes["learner"]) & set(probes["evaluator"])
        assert common, {k: sorted(map(int, v)) for k, v in probes.items()}
        for version in common:
            learner = np.array(probes["learner"][version])
            np.testing.assert_allclose(probes["unroller"][version], learner, atol=1e-5)
            np.testing.assert_allclose(probes["evaluator"][version], learner, atol=1e-5)
        # The transformer is really applied, and its statistics really travel with the
        # parameters: the learner's value moves from version to version.
        values = [tuple(v) for v in probes["learner"].values()]
        assert len(set(values)) > 1
        assert not np.allclose(values[-1], PROBE)
        run.interrupt()
        assert run.finish(300) == 0, run.stderr
    finally:
        run.kill()
