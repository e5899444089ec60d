"""Graph mistakes in RL graphs caught at load (issue 9 items 1-2): one line naming the file's
line and the key, before any process starts. Each case edits a shipped graph by one setting."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

import nodes  # noqa: F401 - registers the node kinds and their graph checks
from pipeline import graph as graphlib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DQN = os.path.join(REPO, "graphs", "dqn_cartpole.yaml")
PPO = os.path.join(REPO, "graphs", "ppo_cartpole.yaml")


def edited(tmp_path, source: str, old: str, new: str) -> str:
    with open(source) as f:
        text = f.read()
    assert old in text, old
    path = tmp_path / "graph.yaml"
    path.write_text(text.replace(old, new, 1))
    return str(path)


def error(path: str, *overrides: str) -> str:
    with pytest.raises(graphlib.GraphError) as info:
        graphlib.load(path, overrides)
    return str(info.value)


def line_of(path: str, text: str) -> int:
    with open(path) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


def test_misspelled_hyperparameter_is_caught_at_its_line(tmp_path):
    path = edited(tmp_path, DQN, "  gamma: 0.99", "  gamam: 0.99")
    message = error(path)
    assert f":{line_of(path, 'gamam')}: " in message
    assert "algorithm.gamam: unknown key" in message


def test_wrong_type_in_the_algorithm_is_caught(tmp_path):
    path = edited(tmp_path, DQN, "  learning_rate: 0.0023", "  learning_rate: fast")
    assert "algorithm.learning_rate: expected a number" in error(path)


def test_yaml_12_numbers_reach_the_algorithm_as_numbers(tmp_path):
    path = edited(tmp_path, DQN, "  learning_rate: 0.0023", "  learning_rate: 2.3e-3")
    graph = graphlib.load(path)
    assert graph.configs["learner"].agent.algorithm.learning_rate == 0.0023


def test_learner_without_sample_is_refused(tmp_path):
    path = edited(tmp_path, DQN, "    kind: learner\n", "    kind: learner\n    calls: []\n")
    assert "nodes.learner.calls: kind 'learner' must call 'sample'" in error(path)


def test_on_policy_learner_needs_trajectories(tmp_path):
    path = edited(tmp_path, PPO, "    kind: learner\n", "    kind: learner\n    subscribes: []\n")
    assert "must subscribe 'trajectories'" in error(path) or \
        "must subscribe to 'trajectories'" in error(path)


def test_queued_unrolls_are_counted_only_on_a_reliable_topic(tmp_path):
    path = edited(tmp_path, PPO, "trajectories: {delivery: reliable",
                  "trajectories: {delivery: latest")
    message = error(path, "nodes.unroller.config.max_queued_unrolls=0")
    assert "nodes.unroller.config.max_queued_unrolls: counts the unrolls queued on " \
           "'trajectories', which needs delivery: reliable (it is latest)" in message
    graphlib.load(PPO, ["nodes.unroller.config.max_queued_unrolls=0"])  # reliable: fine


def test_just_in_time_needs_the_gate_and_the_learners_estimates():
    jit = ["nodes.unroller.config.just_in_time=true"]
    assert "nodes.unroller.config.just_in_time: needs an asynchronous unroller that starts " \
           "each unroll once the learner took the last: max_unrolls_per_version: 0 and " \
           "max_queued_unrolls set (it is 1 and null)" in error(PPO, *jit)
    gate = ["nodes.unroller.config.max_unrolls_per_version=0",
            "nodes.unroller.config.max_queued_unrolls=0"]
    assert "nodes.unroller.config.just_in_time: needs the learner's publish_between_epochs: " \
           "true (learner 'learner' publishes only at a batch's end)" in error(PPO, *jit, *gate)
    graphlib.load(PPO, [*jit, *gate, "nodes.learner.config.publish_between_epochs=true"])


def test_prioritized_learner_needs_prioritized_replay(tmp_path):
    # The learner publishes priorities and the replay store takes them by default (their
    # kinds declare both ports); only the flags disagree.
    path = edited(tmp_path, DQN, "      publish_params_every: 16",
                  "      publish_params_every: 16\n      prioritized: true")
    path = edited(tmp_path, path, "  params: {delivery: latest, hwm: 4}",
                  "  params: {delivery: latest, hwm: 4}\n  priorities: {delivery: reliable}")
    message = error(path)
    assert "nodes.learner.config.prioritized: is true but replay_store 'replay_store' has " \
           "prioritized_sampling: false" in message
    assert f":{line_of(path, 'prioritized: true')}: " in message


@pytest.mark.parametrize("override,expected", [
    ("agent.env_id=CartPol-v1", "agent.env_id: unknown environment id 'CartPol-v1'"),
    ("nodes.evaluator.config.eval_env={env_id: CartPol-v1}",
     "nodes.evaluator.config.eval_env.env_id: unknown environment id 'CartPol-v1'"),
    ("agent.algorithm.gamma=2", "agent.algorithm.gamma: must be in (0, 1]"),
])
def test_environments_resolve_and_the_agent_is_checked(override, expected):
    assert expected in error(DQN, override)


def test_every_rl_node_gets_the_one_agent():
    """The agent section is built once and handed to every node whose kind takes it; a
    ``--set agent....`` reaches all of them (the one override path)."""
    graph = graphlib.load(DQN, ["agent.algorithm.learning_rate=0.01"])
    takers = [n for n, c in graph.configs.items() if hasattr(c, "agent")]
    assert sorted(takers) == ["env_runner", "evaluator", "learner", "replay_store", "unroller"]
    assert len({id(graph.configs[n].agent) for n in takers}) == 1
    agent = graph.configs["learner"].agent
    assert (agent.env_id, agent.algorithm.learning_rate) == ("CartPole-v1", 0.01)
    # What a node's process is handed: plain data it builds into the same agent.
    assert graph.nodes["unroller"].config["agent"]["algorithm"]["learning_rate"] == 0.01
    assert "agent" not in graph.raw["nodes"]["unroller"].get("config", {})


@pytest.mark.parametrize("old,new,key,expected", [
    ("    kind: unroller\n    config: {seed: 0}",
     "    kind: unroller\n    config: {seed: 0, env_id: CartPole-v1}",
     "nodes.unroller.config.env_id", "belongs to the graph's top-level agent: section "
     "(agent.env_id)"),
    ("      eval_interval: 1000", "      eval_interval: 1000\n      algorithm: {name: dqn}",
     "nodes.evaluator.config.algorithm", "(agent.algorithm)"),
    ("    kind: unroller\n    config: {seed: 0}",
     "    kind: unroller\n    config: {seed: 0, agent: {env_id: CartPole-v1}}",
     "nodes.unroller.config.agent", "move it to the top-level agent: section"),
])
def test_an_old_graph_is_told_which_key_to_move(tmp_path, old, new, key, expected):
    path = edited(tmp_path, DQN, old, new)
    message = error(path)
    assert f"{key}: " in message and expected in message, message
    stated = next(line for line in new.split("\n") if f"{key.rsplit('.', 1)[1]}:" in line)
    assert f":{line_of(path, stated)}: " in message


def test_a_kinds_ports_are_its_defaults():
    """A node entry that leaves a section out gets every port of it its kind declares that
    the graph can wire; an explicit list is taken as written."""
    graph = graphlib.load(DQN)
    learner, store = graph.nodes["learner"], graph.nodes["replay_store"]
    assert (set(learner.calls), set(learner.publishes)) == ({"sample", "learner_state"},
                                                            {"params", "metrics"})
    assert (store.subscribes, set(store.serves)) == (("experience",), {"sample", "replay_state"})
    assert "priorities" not in learner.publishes  # the graph declares no such topic
    assert graph.nodes["evaluator"].subscribes == ("params",)
    assert graphlib.load(DQN, ["nodes.env_runner.publishes=[]"]).nodes["env_runner"] \
        .publishes == ()  # its metrics are optional


def test_an_rl_node_without_the_agent_section_is_refused(tmp_path):
    with open(DQN) as f:
        text = f.read()
    start, end = text.index("agent:\n"), text.index("\ntopics:")
    path = tmp_path / "graph.yaml"
    path.write_text(text[:start] + text[end + 1:])
    assert "nodes.env_runner.kind: kind 'env_runner' needs the graph's top-level agent: " \
           "section" in error(str(path))


def test_run_py_check_prints_one_line_and_exits_2(tmp_path):
    path = edited(tmp_path, DQN, "  gamma: 0.99", "  gamam: 0.99")
    result = subprocess.run([sys.executable, "run.py", "check", path], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "gamam" in result.stderr


def test_on_policy_is_read_from_the_config_class():
    """The graph wires an algorithm's nodes by its config class, torch-free; the algorithm
    reports the same, declared nowhere else."""
    from algorithms import configs

    on_policy = {n for n in configs.CONFIGS if configs.config_class(n).on_policy}
    assert {"a2c", "ppo", "impala", "appo"} <= on_policy
    assert not on_policy & {"dqn", "sac", "qrsac", "ddpg", "td3", "random"}
    assert graphlib.load(PPO).configs["learner"].agent.on_policy
    assert not graphlib.load(DQN).configs["learner"].agent.on_policy


def test_seed_n_moves_every_seed_of_the_graph_by_n():
    """``run.py run GRAPH --seed N``: every node's seed plus N, those its kind defaults too
    (the evaluator's 10000), written into the resolved data the run directory keeps."""
    def seeds(graph):
        return {name: c.seed for name, c in graph.configs.items() if hasattr(c, "seed")}

    plain, moved = graphlib.load(DQN), graphlib.load(DQN, seed_offset=2)
    assert seeds(plain) == {"env_runner": 0, "unroller": 0, "replay_store": 0, "learner": 0,
                            "evaluator": 10000}
    assert seeds(moved) == {name: seed + 2 for name, seed in seeds(plain).items()}
    assert moved.raw["nodes"]["evaluator"]["config"]["seed"] == 10002
    assert graphlib.load(DQN, seed_offset=0).raw == plain.raw


def test_a_resumed_run_keeps_its_seeds(tmp_path):
    shutil.copyfile(DQN, tmp_path / "graph.yaml")
    result = subprocess.run([sys.executable, "run.py", "run", "--resume", str(tmp_path),
                             "--seed", "1"], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--seed" in result.stderr
