"""The actor kind (nodes/actor.py): env runner and policy in one process, in real graphs.

In one event loop, every step the actor takes reaches the replay store once; through real
processes, DQN learns CartPole to 475 with an actor, and a kill -9 and a swap of the actor
store nothing twice and lose nothing but what the killed process still held."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from nodes._agent import Agent, agent_field
from pipeline import graph as graphlib
from pipeline.graphyaml import GraphError
from pipeline.inloop import run_graph
from tests.pipeline_harness import ROOT
from tests.test_graphs_training import assert_accounting, learned
from tests.test_reliability_ledger import _stop
from tests.test_reliability_replay_restart import _status, _wait

ACTOR_GRAPH = os.path.join(ROOT, "graphs", "dqn_cartpole_actor.yaml")

STEPS = """
name: actor_steps
agent: {{env_id: CartPole-v1, algorithm: {{name: {algorithm}}}}}
topics:
  experience: {{delivery: reliable, hwm: 16, coalesce: {coalesce}}}
nodes:
  actor:
    kind: actor
    config: {{num_envs: 4, env_groups: 2, max_steps: {steps}}}
    publishes: [experience]
  replay_store:
    kind: replay_store
    config: {{num_environments: {environments}, max_length: 1000}}
    subscribes: [experience]
    serves: [sample]
run:
  stop_when: [actor, replay_store]  # a replay store that fails ends the run at once
  duration_s: 100
"""


def _steps(steps: int, algorithm: str, environments: int = 4, coalesce: bool = False) -> str:
    return STEPS.format(steps=steps, algorithm=algorithm, environments=environments,
                        coalesce=str(coalesce).lower())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("coalesce", [False, True])
def test_every_step_an_actor_takes_is_stored_once(tmp_path, coalesce):
    """Two env groups: each group's step is acted on when the other waits, in one batch.
    Coalesced, the steps of one turn of the actor's loop travel as one batch under one
    sequence number, and the replay store stores the batch whole."""
    graph = graphlib.parse(_steps(400, "random", coalesce=coalesce), "actor.yaml")
    summaries = asyncio.run(asyncio.wait_for(run_graph(graph, str(tmp_path)), 110))
    steps = summaries["actor.0"]["steps"]
    assert 400 <= steps <= 402  # each group checks the budget after its own step of 2 envs
    assert summaries["actor.0"]["env_steps"] == steps  # its policy acted on each step once
    assert summaries["replay_store.0"]["inserted"] == steps
    assert "redelivered" not in summaries["replay_store.0"]


def test_an_actor_graph_is_checked_like_runner_and_unroller():
    """Its envs must fit the replay store; its algorithm is checked at load; it has no
    ``policy`` to call."""
    with pytest.raises(GraphError, match="num_environments.*'actor'.*step 4 environments"):
        graphlib.parse(_steps(4, "random", environments=2), "a.yaml")
    with pytest.raises(GraphError, match="algorithm.name"):
        graphlib.parse(_steps(4, "dqm"), "a.yaml")
    calls = _steps(4, "random").replace("publishes: [experience]\n", "publishes: [experience]\n"
                                        "    calls: [policy]\n", 1)
    with pytest.raises(GraphError, match="policy"):
        graphlib.parse(calls, "a.yaml")


async def unroll_checker(config, node, ready):
    """A test kind in a PPO learner's place: publishes parameters at the start and after each
    unroll (so the actor goes on, one unroll per version), and counts unrolls whose every
    column holds one environment's steps."""
    from nodes._common import make_algorithm
    from nodes.messages import Params

    alg = make_algorithm(config.agent, "cpu")  # the graph's agent, as a learner's would be
    params, unrolls = node.bus.publisher("params"), node.bus.subscriber("trajectories")
    ready()
    version, counts = 0, {"unrolls": 0, "mixed": 0}
    await params.send(Params(version, 0, alg.policy_params()))
    while (envelope := await node.wait_or_stop(unrolls.recv())) is not None:
        env_id = np.asarray(envelope.message.experience["env_id"])
        counts["unrolls"] += 1
        counts["mixed"] += int(not (env_id == env_id[0]).all())
        version += 1
        await params.send(Params(version, 0, alg.policy_params()))
    return counts


@dataclass(frozen=True)
class _CheckerConfig:
    agent: Agent = agent_field()


unroll_checker.Config = _CheckerConfig  # a user kind takes the graph's agent section too


ON_POLICY = """
name: actor_unrolls
agent: {env_id: CartPole-v1, algorithm: {name: ppo}}
topics:
  trajectories: {delivery: reliable, hwm: 4}
  params: {delivery: latest, hwm: 4}
nodes:
  actor:
    kind: actor
    config: {num_envs: 4, env_groups: 2, max_steps: 200, unroll_length: 4}
    subscribes: [params]
    publishes: [trajectories]
  learner:
    kind: "tests.test_nodes_actor:unroll_checker"
    subscribes: [trajectories]
    publishes: [params]
run:
  stop_when: [actor, learner]  # a checker that fails ends the run at once
  duration_s: 100
"""


@pytest.mark.timeout(120)
def test_each_env_group_unrolls_its_own_environments(tmp_path):
    """On-policy with env groups: the groups' steps reach the unroller apart (the actor's
    here, the unroller node's alike), and an unroll of one group must not take rows of the
    other: each column of ``[T + 1, B]`` is one environment."""
    graph = graphlib.parse(ON_POLICY, "unrolls.yaml")
    summaries = asyncio.run(asyncio.wait_for(run_graph(graph, str(tmp_path)), 110))
    counts = summaries["learner.0"]
    assert counts["unrolls"] >= 10 and counts["mixed"] == 0, counts


@pytest.fixture
def live(live_runs):
    return functools.partial(live_runs, ACTOR_GRAPH)


@pytest.mark.slow  # CI learns DQN CartPole through the graph once (test_graphs_training)
@pytest.mark.timeout(900)
def test_dqn_cartpole_reaches_475_with_an_actor(live):
    run, _ = learned(lambda seed: live(seed=seed), 475, 50_000, 420)
    restarts = {name: info["restarts"] for name, info in run.summary()["nodes"].items()}
    assert not any(restarts.values()), restarts
    assert_accounting(run)


@pytest.mark.timeout(400)
def test_kill_9_and_swap_of_the_actor_store_every_step_once(live):
    """Killed, the actor loses what it had not handed to the transport yet, and nothing else;
    swapped, its replacement goes on; the learner trains throughout and the replay store
    holds each message the ledger says it stored, once."""
    run = live("nodes.evaluator.config.stop_at_return=null",
               "nodes.learner.config.num_env_steps=100000000")
    try:
        run.wait_ready()
        for change in ("kill", "swap"):
            before = _status(run, "actor.0")
            _wait(run, lambda nodes: nodes["learner.0"].get("status", {}).get("iteration", 0)
                  > 50, "the learner did not train")
            if change == "kill":
                os.kill(before["pid"], signal.SIGKILL)
            else:
                out = run.cli("swap", run.run_dir, "actor", "--set", "metrics_interval_s=1")
                assert out.returncode == 0, out.stderr
            _wait(run, lambda nodes, b=before: nodes["actor.0"]["incarnation"]
                  != b["incarnation"] and nodes["actor.0"]["state"] == "running"
                  and nodes["actor.0"].get("status", {}).get("steps", 0) > 0,
                  f"the actor did not come back after the {change}")
            iteration = _status(run, "learner.0")["status"]["iteration"]
            _wait(run, lambda nodes, i=iteration: nodes["learner.0"]["status"]["iteration"]
                  > i + 20, f"the learner did not train after the {change}")
    except BaseException:
        run.kill()
        raise
    summary, ledger, stored = _stop(run)
    assert summary["nodes"]["actor.0"]["restarts"] >= 1, summary["nodes"]["actor.0"]
    assert ledger["publishers"] == 3 and ledger["publishers_closed"] == 2, ledger
    assert stored["stored_twice"] == 0 and stored["missing"] == 0, ledger
    assert stored["unaccounted"] == 0, ledger
    assert ledger["produced"] == stored["stored"] + stored["lost_with_publisher"], ledger
    assert summary["nodes"]["replay_store.0"]["status"]["inserted"] == stored["stored"]


@pytest.mark.timeout(600)
def test_sigint_then_resume_keeps_every_step_and_the_actors_state(live, live_runs):
    """The actor stops first: it flushes all it took into replay and leaves its state, which
    the final checkpoint takes, so the checkpoint's actor and replay agree on every step and
    the resumed actor counts on from there."""
    budget = 12_000
    first = live("nodes.evaluator.config.stop_at_return=null",
                 f"nodes.learner.config.num_env_steps={budget}",
                 # Reports often enough that the stop comes well inside the budget on a fast
                 # machine (at the default 5 s the actor finished all 12,000 steps first).
                 "nodes.learner.config.metrics_interval_s=0.2",
                 "nodes.checkpointer.config.interval_s=600")  # only the final checkpoint
    stopped = first.interrupt_after_learning(2000)
    assert 2000 <= stopped["learner.0"]["status"]["env_steps"] < budget
    root = os.path.join(first.run_dir, "checkpoints")
    newest = os.path.join(root, sorted(os.listdir(root))[-1])
    acted = torch.load(os.path.join(newest, "unroller.pt"), weights_only=True)["env_steps"]
    assert acted == stopped["actor.0"]["status"]["env_steps"] == \
        stopped["replay_store.0"]["status"]["inserted"], stopped
    assert not os.listdir(os.path.join(first.run_dir, "state"))  # taken

    resumed = live_runs(None, run_dir=first.run_dir, resume=True)
    assert resumed.finish(500) == 0, resumed.stderr
    assert "resuming from" in resumed.stderr
    with open(os.path.join(first.run_dir, "logs", "actor.0.log")) as f:
        assert f"(env_steps {acted})" in f.read()  # restored from the final checkpoint
    final = resumed.summary()
    assert final["nodes"]["learner.0"]["status"]["env_steps"] >= budget
    assert final["nodes"]["actor.0"]["status"]["env_steps"] == \
        final["nodes"]["replay_store.0"]["status"]["inserted"], final["nodes"]
    ledger = final["ledger"]["experience"]
    assert ledger["publishers"] == ledger["publishers_closed"] == 2, ledger
    assert ledger["produced"] == ledger["consumers"]["replay_store"]["stored"], ledger


@pytest.mark.timeout(300)
def test_an_actor_acts_as_a_runner_and_an_unroller_do(tmp_path, live_runs):
    """PPO with one unroll per parameter version is deterministic: the same seeds give the
    same unrolls. The PPO CartPole graph and the same graph with an actor in place of its
    runner and unroller end with the same network, bit for bit."""
    with open(os.path.join(ROOT, "graphs", "ppo_cartpole.yaml")) as f:
        text = f.read()
    start, end = text.index("  env_runner:"), text.index("  learner:")
    actor = text[:start] + """  actor:
    kind: actor
    config: {num_envs: 8, seed: 0, unroll_length: 32, max_unrolls_per_version: 1}
    subscribes: [params]
    publishes: [trajectories, metrics]
    serves: [unroller_state]
""" + text[end:].replace("stop_after: [env_runner]", "stop_after: [actor]")
    actor_graph = tmp_path / "ppo_actor.yaml"
    actor_graph.write_text(actor)
    networks = []
    for graph in (os.path.join(ROOT, "graphs", "ppo_cartpole.yaml"), str(actor_graph)):
        run = live_runs(graph, "nodes.evaluator.config.stop_at_return=null",
                        "nodes.learner.config.num_env_steps=5120")  # 20 unrolls of 8 x 32
        assert run.finish(200) == 0, run.stderr
        root = os.path.join(run.run_dir, "checkpoints")
        state = torch.load(os.path.join(root, sorted(os.listdir(root))[-1], "learner.pt"),
                           weights_only=True)["algorithm"]["module"]
        networks.append(state)
    ours, theirs = networks
    assert int(ours["train_steps"]) > 0 and ours.keys() == theirs.keys()
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name


def test_the_event_loop_turns_although_acting_never_suspends(monkeypatch):
    """Acting and publishing complete without suspending while replay keeps up: the actor
    still lets its loop run the node's other tasks (heartbeats, stop requests, a coalescing
    publisher's release) at least every ``_LOOP_TURN_S``."""
    from types import SimpleNamespace

    from nodes import actor

    class Acting:  # answers every waiting step at once, as a policy with no params to await
        async def act(self, batch):
            for request in batch:
                await request.reply("actions")

    monkeypatch.setattr(actor, "_LOOP_TURN_S", 0.0)

    async def main():
        policy = actor.LocalPolicy(Acting(), SimpleNamespace(stopping=asyncio.Event()))
        ran = []
        asyncio.get_running_loop().call_soon(ran.append, "other task")
        for _ in range(3):
            assert (await policy.wait(policy.send("time step", 1.0))).message == "actions"
        return list(ran)  # a copy: the loop runs what is left as asyncio.run ends

    assert asyncio.run(main()) == ["other task"]
