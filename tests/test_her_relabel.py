"""Hindsight relabeling (storage/her.py) against hand-made episodes in a real replay buffer,
and the replay store's HER settings checked at graph load.

Each stored step's achieved goal is ``[position, episode]`` and its desired goal
``[100 + episode, 0]``, so a relabeled goal says exactly which step it came from, and a goal
from another episode cannot pass unnoticed.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from pipeline import graph as graphlib
from storage import ReplayBuffer, TensorSpec
from storage.her import HindsightRelabeler, distance_reward, import_reward

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ACHIEVED, DESIRED = "observation.achieved_goal", "observation.desired_goal"
EPISODE = 5  # steps per episode: FIRST, MID, MID, MID, LAST (truncation, as Fetch)


def reward_fn(achieved, desired):
    """Reached when within 0.5 of the goal: the goals here are whole numbers."""
    return distance_reward(0.5)(achieved, desired)


def make_buffer(num_envs: int = 2, steps: int = 13, max_length: int = 100) -> ReplayBuffer:
    spec = {"step_type": TensorSpec((), torch.int64), "reward": TensorSpec((), torch.float32),
            "discount": TensorSpec((), torch.float32),
            "observation.observation": TensorSpec((4,), torch.float32),
            ACHIEVED: TensorSpec((2,), torch.float32), DESIRED: TensorSpec((2,), torch.float32)}
    buffer = ReplayBuffer(spec, num_envs, max_length, keep_episodic_info=True)
    envs = np.arange(num_envs)
    for t in range(steps):
        episode, k = divmod(t, EPISODE)
        step_type = 0 if k == 0 else (2 if k == EPISODE - 1 else 1)
        achieved = np.array([[t, episode]] * num_envs, np.float32)
        achieved[:, 1] += 10 * envs  # each env's episodes apart too
        buffer.add_batch({
            "step_type": np.full(num_envs, step_type, np.int64),
            "reward": np.full(num_envs, 0.0 if step_type == 0 else -1.0, np.float32),
            "discount": np.ones(num_envs, np.float32),
            "observation.observation": np.zeros((num_envs, 4), np.float32),
            ACHIEVED: achieved,
            DESIRED: np.array([[100 + episode, 0]] * num_envs, np.float32)}, envs)
    return buffer


def sample(buffer, batch: int = 64, length: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    data, info = buffer.get_batch(batch, length)
    return {k: v.clone() for k, v in data.items()}, info


def relabeler(ratio: float, strategy: str = "future", seed: int = 0) -> HindsightRelabeler:
    return HindsightRelabeler(ratio, strategy, ACHIEVED, DESIRED, reward_fn, seed)


def episode_end(position: int) -> int:
    """The position of the LAST step of ``position``'s episode (13 steps: the third is open
    and ends, for relabeling, at the newest step 12)."""
    return min((position // EPISODE) * EPISODE + EPISODE - 1, 12)


@pytest.mark.parametrize("length", [2, 3])
def test_future_goals_come_from_later_steps_of_the_same_episode(length):
    buffer = make_buffer()
    data, info = sample(buffer, 256, length)
    original = {k: v.clone() for k, v in data.items()}
    chosen = relabeler(1.0).relabel(buffer, data, info.env_ids, info.positions)
    assert chosen.all()
    picked = []
    for i in range(len(chosen)):
        start, env = int(info.positions[i]), int(info.env_ids[i])
        goal = data[DESIRED][i, 0]
        source = int(goal[0])
        assert int(goal[1]) == source // EPISODE + 10 * env, "goal of another episode or env"
        end = episode_end(start)
        assert min(start + length - 1, end) <= source <= end, (start, source, end)
        picked.append(source - start)
        inside = [r for r in range(length) if start + r <= end]
        for r in range(length):
            if r in inside:
                torch.testing.assert_close(data[DESIRED][i, r], goal)
            else:  # past the episode's end: the next episode's own goal, untouched
                torch.testing.assert_close(data[DESIRED][i, r], original[DESIRED][i, r])
    # Uniform over the later steps: several distances show up, not only the next step.
    assert len(set(picked)) >= 3, sorted(set(picked))


def test_final_goals_are_the_episodes_last_step():
    buffer = make_buffer()
    data, info = sample(buffer, 128)
    relabeler(1.0, "final").relabel(buffer, data, info.env_ids, info.positions)
    for i in range(128):
        assert int(data[DESIRED][i, 0, 0]) == episode_end(int(info.positions[i]))


def test_rewards_are_recomputed_from_the_new_goal():
    buffer = make_buffer()
    data, info = sample(buffer, 256, 3)
    original = {k: v.clone() for k, v in data.items()}
    relabeler(1.0).relabel(buffer, data, info.env_ids, info.positions)
    reached = 0
    for i in range(256):
        end = episode_end(int(info.positions[i]))
        for r in range(3):
            if int(info.positions[i]) + r > end or int(original["step_type"][i, r]) == 0:
                # Another episode's row, or a FIRST (reward 0 by convention): untouched.
                assert data["reward"][i, r] == original["reward"][i, r]
                continue
            hit = bool(torch.equal(data[ACHIEVED][i, r], data[DESIRED][i, r]))
            assert float(data["reward"][i, r]) == (0.0 if hit else -1.0)
            reached += hit
    # The original goals (100 + episode) are never reached; relabeled ones are, often.
    assert (original["reward"] <= 0).all() and not (original["reward"][
        original["step_type"] != 0] == 0).any()
    assert reached > 50
    # Discounts and step types are the env's: relabeling changes goals and rewards only.
    for key in ("discount", "step_type", ACHIEVED, "observation.observation"):
        assert torch.equal(data[key], original[key]), key


def test_ratio_zero_changes_nothing_and_ratio_one_changes_every_window():
    buffer = make_buffer()
    data, info = sample(buffer, 128)
    original = {k: v.clone() for k, v in data.items()}
    chosen = relabeler(0.0).relabel(buffer, data, info.env_ids, info.positions)
    assert not chosen.any()
    for key in data:
        assert torch.equal(data[key], original[key]), key
    chosen = relabeler(1.0).relabel(buffer, data, info.env_ids, info.positions)
    assert chosen.all()
    # Every window's first row got an achieved goal: none keeps a 100+ desired goal.
    assert (data[DESIRED][:, 0, 0] < 100).all()


def test_the_ratio_is_the_share_of_windows_relabeled():
    buffer = make_buffer()
    data, info = sample(buffer, 512)
    original = data[DESIRED].clone()
    chosen = relabeler(0.8, seed=3).relabel(buffer, data, info.env_ids, info.positions)
    assert 0.74 < chosen.mean() < 0.86, chosen.mean()
    changed = (data[DESIRED][:, 0] != original[:, 0]).any(-1).numpy()
    np.testing.assert_array_equal(changed, chosen)


def test_the_draws_restore_from_state():
    buffer = make_buffer()
    data, info = sample(buffer, 64)
    first = relabeler(0.5, seed=7)
    first.relabel(buffer, {k: v.clone() for k, v in data.items()}, info.env_ids, info.positions)
    state = first.state_dict()
    a, b = {k: v.clone() for k, v in data.items()}, {k: v.clone() for k, v in data.items()}
    first.relabel(buffer, a, info.env_ids, info.positions)
    second = relabeler(0.5, seed=99)
    second.load_state_dict(state)
    second.relabel(buffer, b, info.env_ids, info.positions)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_fetch_reward_is_the_envs_own():
    """The default reward is FetchReach's ``compute_reward`` (sparse, 5 cm)."""
    gym = pytest.importorskip("gymnasium")
    robotics = pytest.importorskip("gymnasium_robotics")
    gym.register_envs(robotics)
    env = gym.make("FetchReach-v4")
    rng = np.random.default_rng(0)
    achieved = rng.normal(size=(200, 3)) * 0.05
    desired = achieved + rng.normal(size=(200, 3)) * 0.04
    want = env.unwrapped.compute_reward(achieved, desired, {})
    np.testing.assert_array_equal(distance_reward(0.05)(achieved, desired), want)
    env.close()


def test_a_reward_function_by_import_path():
    fn = import_reward("numpy:minimum")
    assert fn is np.minimum
    for bad, says in (("numpy", "module:function"), ("no_such_module_x:f", "cannot import"),
                      ("numpy:pi", "not callable")):
        with pytest.raises(ValueError, match=says):
            import_reward(bad)


HER_GRAPH = os.path.join(ROOT, "graphs", "sac_her_fetchreach.yaml")


def check(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "run.py", "check", "graphs/sac_her_fetchreach.yaml",
                           *(a for o in overrides for a in ("--set", o))],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("override,key,says", [
    ("agent.env_id=Pendulum-v1", "her_relabel_ratio", "needs a goal-conditioned env"),
    ("nodes.replay_store.config.her_desired_goal=goal", "her_desired_goal", "no key 'goal'"),
    ("nodes.replay_store.config.her_strategy=past", "her_strategy", "future, final"),
    ("nodes.replay_store.config.her_relabel_ratio=1.5", "her_relabel_ratio", "[0, 1]"),
    ("nodes.replay_store.config.her_reward=no_such_module_x:fn", "her_reward",
     "cannot import"),
])
def test_her_settings_are_checked_at_load(override, key, says):
    """Each mistake as the graph's load reports it; run.py prints it as one line (below)."""
    pytest.importorskip("gymnasium_robotics")
    with pytest.raises(graphlib.GraphError) as info:
        graphlib.load(HER_GRAPH, [override])
    error = str(info.value)
    assert len(error.splitlines()) == 1, error
    assert f"nodes.replay_store.config.{key}" in error and says in error, error
    assert "sac_her_fetchreach.yaml:" in error


def test_a_her_mistake_is_one_line_from_run_py_check_and_exit_2():
    pytest.importorskip("gymnasium_robotics")
    result = check("agent.env_id=Pendulum-v1")
    assert result.returncode == 2, result
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "nodes.replay_store.config.her_relabel_ratio" in errors[0], errors[0]
    assert "needs a goal-conditioned env" in errors[0] and "sac_her_fetchreach.yaml:" in errors[0]


def test_an_unknown_env_id_is_the_agent_s_one_line_not_a_traceback_of_the_her_check():
    pytest.importorskip("gymnasium_robotics")
    with pytest.raises(graphlib.GraphError) as info:
        graphlib.load(HER_GRAPH, ["agent.env_id=FetchNope-v1"])
    error = str(info.value)
    assert len(error.splitlines()) == 1, error
    assert "agent.env_id: unknown environment id 'FetchNope-v1'" in error, error


def test_ratio_zero_needs_no_goals():
    """The same store without relabeling takes any env (HER off)."""
    graphlib.load(HER_GRAPH, ["agent.env_id=Pendulum-v1",
                              "nodes.replay_store.config.her_relabel_ratio=0"])


def test_a_missing_robotics_package_names_the_extra(monkeypatch):
    """Without gymnasium-robotics a Fetch id asks for the extra (a shipped graph's check then
    skips, as for Atari), instead of calling the id unknown."""
    import importlib.util

    from algorithms.envs import check_env_id

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gymnasium_robotics" else real(name, *a))
    with pytest.raises(ValueError, match=r"FetchNowhere-v9 needs the \[mujoco\] extra.*"
                                         r"pip install"):
        check_env_id("FetchNowhere-v9")
    with pytest.raises(ValueError, match="unknown environment id"):
        check_env_id("NoSuchEnvAtAll-v0")
