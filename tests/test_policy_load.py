"""``conduit.load_policy``: the policy a run kept, loaded from its files and acting as the
evaluator acted, for every algorithm (vector and MinAtar pixel observations, data
transformers, recurrent PPO's state in and out).

The run directories are made by hand, with the writers the nodes use: ``graph.yaml`` with an
agent, ``best/`` by the evaluator's ``keep_policy``, a checkpoint by the checkpointer's
``write_checkpoint`` holding a learner state.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import yaml

import typedconfig
from algorithms.steps import StepType, TimeStep, VectorEnvStepper, make_vector_env
from conduit import PolicyError, load_policy
from nodes._agent import Agent
from nodes._common import make_algorithm
from nodes.checkpointer import write_checkpoint
from nodes.evaluator import BEST, INFO_FILE, POLICY_FILE, keep_policy, kept_info

SMALL = [32, 32]
# name -> the agent: every algorithm, with the observation kinds and transformers it meets.
AGENTS = {
    "dqn": {"env_id": "CartPole-v1", "algorithm": {"name": "dqn", "fc_layer_params": SMALL}},
    "dqn_minatar_stacked": {"env_id": "MinAtar/Asterix-v1", "algorithm": {
        "name": "dqn", "encoder": "minatar_cnn", "fc_layer_params": [32],
        "data_transformers": [{"name": "frame_stacker", "stack_size": 3}]}},
    "sac": {"env_id": "Pendulum-v1", "algorithm": {
        "name": "sac", "actor_fc_layer_params": SMALL, "critic_fc_layer_params": SMALL}},
    "sac_discrete": {"env_id": "CartPole-v1", "algorithm": {
        "name": "sac", "actor_fc_layer_params": SMALL, "critic_fc_layer_params": SMALL}},
    "td3": {"env_id": "Pendulum-v1", "algorithm": {
        "name": "td3", "actor_fc_layer_params": SMALL, "critic_fc_layer_params": SMALL}},
    "ddpg": {"env_id": "Pendulum-v1", "algorithm": {
        "name": "ddpg", "actor_fc_layer_params": SMALL, "critic_fc_layer_params": SMALL}},
    "ppo_normalized": {"env_id": "Pendulum-v1", "algorithm": {
        "name": "ppo", "data_transformers": [{"name": "observation_normalizer",
                                              "clipping": 5.0}]}},
    "ppo_recurrent": {"env_id": "CartPole-v1", "algorithm": {
        "name": "ppo", "rnn_size": 16, "actor_fc_layer_params": SMALL}},
    "a2c": {"env_id": "CartPole-v1", "algorithm": {"name": "a2c"}},
}


def build(agent: dict, wild: bool = False):
    """A freshly initialized algorithm for ``agent`` (a new draw of weights each call).
    ``wild``: every weight drawn from N(0, 1), so that the actions change with the observation
    (an initialized network takes one action over a whole episode)."""
    alg = make_algorithm(typedconfig.build(Agent, agent, "agent"), "cpu")
    policy = alg.policy_state_dict()
    if wild:
        policy = {k: torch.randn_like(v) if v.is_floating_point() and "stats" not in k else v
                  for k, v in policy.items()}
    # Normalizer statistics far from their start, so that a policy that ignored them acts
    # otherwise.
    for key, value in policy.items():
        if key.endswith("stats.mean"):
            policy[key] = torch.randn_like(value)
        elif key.endswith("stats.var"):
            policy[key] = torch.rand_like(value) * 4 + 0.5
    alg.load_policy_state_dict(policy)
    return alg


def make_run(root, agent: dict, best: bool = True, final: bool = True, wild: bool = False,
             graph: dict | None = None):
    """A run directory with ``graph.yaml`` (``agent`` and the keys of ``graph``), ``best/``
    (evaluated 123.5 at 4,000 env steps) and one checkpoint (learner at 6,000);
    ``(run_dir, best's algorithm, final's algorithm)``."""
    run_dir = str(root)
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "graph.yaml"), "w") as f:
        yaml.safe_dump({"name": "policy_test", **(graph or {}), "agent": agent}, f)
    best_alg, final_alg = build(agent, wild), build(agent, wild)
    if best:
        keep_policy(os.path.join(run_dir, BEST), best_alg.policy_state_dict(),
                    {"mean_return": 123.5, "env_steps": 4000, "version": 40, "reached": False})
    if final:
        learner = {"algorithm": final_alg.checkpoint_state(), "version": 60, "epoch": 1,
                   "iteration": 600, "env_steps": 6000}
        # The unroller's copy is another algorithm: "final" must read the learner's.
        unroller = {"algorithm": build(agent).checkpoint_state(), "env_steps": 6100}
        write_checkpoint(os.path.join(run_dir, "checkpoints"),
                         {"learner": learner, "unroller": unroller}, 6000, 1)
    return run_dir, best_alg, final_alg


def observations(space, n: int, seed: int = 0) -> np.ndarray:
    space.seed(seed)
    return np.stack([space.sample() for _ in range(n)])


def evaluator_actions(alg, obs: np.ndarray) -> np.ndarray:
    """What the evaluator's ``predict_step`` does with episode-first observations."""
    b = len(obs)
    ts = TimeStep(step_type=np.full(b, StepType.FIRST, np.int64), reward=np.zeros(b, np.float32),
                  discount=np.ones(b, np.float32), observation=obs,
                  env_id=np.arange(b, dtype=np.int64))
    with torch.no_grad():
        action = alg.predict_step(ts, alg.get_initial_state(b)).output.numpy()
    space = alg.action_space
    return np.clip(action, space.low, space.high) if hasattr(space, "low") else action


def assert_same_actions(got, want) -> None:
    if np.issubdtype(np.asarray(want).dtype, np.integer):
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_best_and_final_load_the_parameters_they_name(tmp_path, name):
    run_dir, best_alg, final_alg = make_run(tmp_path / "run", AGENTS[name])
    best, final = load_policy(run_dir, "best"), load_policy(run_dir, which="final")
    obs = observations(best.observation_space, 64)
    want_best, want_final = evaluator_actions(best_alg, obs), evaluator_actions(final_alg, obs)
    assert not np.allclose(want_best, want_final), "two draws of weights act alike: no test"
    assert_same_actions(best.act(obs)[0], want_best)
    assert_same_actions(final.act(obs)[0], want_final)
    # One observation: one action, the batch's row.
    single, _ = best.act(obs[5])
    assert np.shape(single) == best.action_space.shape
    assert_same_actions(single, want_best[5])
    assert best.info["mean_return"] == 123.5 and best.info["env_steps"] == 4000
    assert best.info["version"] == 40 and best.info["path"] == os.path.join(
        run_dir, BEST, POLICY_FILE)
    assert final.info["env_steps"] == 6000 and final.info["version"] == 60
    assert final.info["path"].endswith("learner.pt")
    # The same files, named by path.
    by_path = load_policy(run_dir, os.path.join(run_dir, BEST))
    assert_same_actions(by_path.act(obs)[0], want_best)


@pytest.mark.parametrize("name", ["dqn_minatar_stacked", "ppo_recurrent"])
def test_acts_as_the_evaluator_through_episodes(tmp_path, name):
    """Step by step through vector-env episodes, resets included, ``act`` with its state (the
    frame stacks, the recurrent core) takes the evaluator's actions: ``predict_step`` with
    the stacker's history kept per env id and the core state carried."""
    agent = AGENTS[name]
    run_dir, alg, _ = make_run(tmp_path / "run", agent, final=False, wild=True)
    policy = load_policy(run_dir, "best")
    env = make_vector_env(agent["env_id"], 3, seed=7)
    try:
        stepper = VectorEnvStepper(env, 7)
        ts = stepper.reset()
        alg_state = alg.get_initial_state(3)
        state, actions, starts = None, [], 0
        for _ in range(150):
            with torch.no_grad():
                step = alg.predict_step(ts, alg_state)
            alg_state = step.state
            first = ts.step_type == StepType.FIRST
            action, state = policy.act(ts.observation, state, episode_start=first)
            np.testing.assert_array_equal(action, step.output.numpy())
            actions.extend(action.tolist())
            ts = stepper.step(action)
            starts += int((ts.step_type == StepType.FIRST).sum())
    finally:
        env.close()
    assert starts >= 1, "no episode ended: the resets went untested"
    assert len(set(actions)) > 1, "one action throughout: the comparison proves little"


def test_recurrent_state_goes_in_and_out(tmp_path):
    run_dir, _, _ = make_run(tmp_path / "run", AGENTS["ppo_recurrent"], final=False)
    policy = load_policy(run_dir)
    assert policy.recurrent
    obs = observations(policy.observation_space, 2, seed=1)
    _, state = policy.act(obs)
    assert len(state) == 1 and state[0].shape == (2, 32)  # actor's and value's GRU, 16 each
    assert state[0].abs().sum() > 0
    _, carried = policy.act(obs, state)
    assert not torch.equal(carried[0], state[0])  # the core moved on
    # episode_start: row 0 starts again (as if it had no state), row 1 carries on.
    _, restarted = policy.act(obs, state, episode_start=[True, False])
    torch.testing.assert_close(restarted[0][0], state[0][0])
    torch.testing.assert_close(restarted[0][1], carried[0][1])


def test_exploring_actions_follow_the_algorithm(tmp_path):
    run_dir, _, _ = make_run(tmp_path / "run", AGENTS["sac"], final=False)
    policy = load_policy(run_dir)
    obs = observations(policy.observation_space, 64)
    greedy, _ = policy.act(obs)
    explored, _ = policy.act(obs, deterministic=False)
    assert explored.shape == greedy.shape and not np.allclose(explored, greedy)
    assert all(policy.action_space.contains(a) for a in explored)


def test_the_evaluator_keeps_both_files_whole(tmp_path):
    alg = build(AGENTS["dqn"])
    directory = str(tmp_path / BEST)
    keep_policy(directory, alg.policy_state_dict(), {"mean_return": 1.0})
    keep_policy(directory, alg.policy_state_dict(), {"mean_return": 2.0})
    assert sorted(os.listdir(directory)) == [INFO_FILE, POLICY_FILE]  # no temporary left
    kept = torch.load(os.path.join(directory, POLICY_FILE), weights_only=True)
    assert kept["info"] == kept_info(directory) == {"mean_return": 2.0}
    assert kept["policy"].keys() == alg.policy_state_dict().keys()
    assert kept_info(str(tmp_path / "none")) is None


def test_user_errors_are_one_line(tmp_path):
    def error(run_dir, which="best") -> str:
        with pytest.raises(PolicyError) as caught:
            load_policy(run_dir, which)
        message = str(caught.value)
        assert "\n" not in message
        return message

    assert "no run directory" in error(str(tmp_path / "missing"))
    os.makedirs(tmp_path / "empty")
    assert "no graph.yaml" in error(str(tmp_path / "empty"))
    run_dir, _, _ = make_run(tmp_path / "fresh", AGENTS["dqn"], best=False, final=False)
    assert "no best policy" in error(run_dir)
    assert "no reached policy" in error(run_dir, "reached")
    assert "no complete checkpoint" in error(run_dir, "final")
    assert "'latest' is none of them" in error(run_dir, "latest")
    other, _, _ = make_run(tmp_path / "other", AGENTS["a2c"], final=False)
    assert "does not fit the agent" in error(run_dir, os.path.join(other, BEST))
    with open(os.path.join(tmp_path, "random.yaml"), "w") as f:
        yaml.safe_dump({"agent": {"env_id": "CartPole-v1", "algorithm": {"name": "random"}}}, f)
    os.makedirs(tmp_path / "random")
    os.replace(tmp_path / "random.yaml", tmp_path / "random" / "graph.yaml")
    assert "no parameters" in error(str(tmp_path / "random"))
