"""``run.py play``: a run's policy played episode by episode, returns printed; ``--video``
writes an mp4 where moviepy is installed and is one line naming the extra where it is not."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import gymnasium as gym
import pytest

from conduit import load_policy
from pipeline.cli import main
from tests.pipeline_harness import ROOT
from tests.test_policy_load import AGENTS, make_run


def episode_returns(policy, env, episodes: int, seed: int) -> list[float]:
    """``episodes`` episodes one after another on ``env``, the first reset with ``seed``, as
    ``run.py play`` plays them."""
    out = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed if episode == 0 else None)
        action, state = policy.act(obs)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(action)
            total += reward
            done = terminated or truncated
            action, state = policy.act(obs, state)
        out.append(total)
    return out


def returns_by_hand(policy, episodes: int, seed: int) -> list[float]:
    """The same episodes on a plain Gymnasium env (what the env factory makes for CartPole)."""
    return episode_returns(policy, gym.make("CartPole-v1"), episodes, seed)


def test_run_py_play_prints_each_return_and_the_mean(tmp_path):
    run_dir, _, _ = make_run(tmp_path / "run", AGENTS["dqn"], final=False, wild=True)
    done = subprocess.run([sys.executable, os.path.join(ROOT, "run.py"), "play", run_dir,
                           "--episodes", "3", "--seed", "5"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    printed = [float(r) for r in re.findall(r"^episode \d: return (\S+) ", done.stdout, re.M)]
    want = returns_by_hand(load_policy(run_dir), 3, seed=5)
    assert printed == pytest.approx(want, abs=0.05), done.stdout
    mean = re.search(r"^mean return (\S+) over 3 episodes \(best policy, evaluated 123.5, "
                     r"at 4,000 env steps, version 40\)$", done.stdout, re.M)
    assert mean and float(mean.group(1)) == pytest.approx(sum(want) / 3, abs=0.05), done.stdout


def test_play_a_run_of_an_env_of_your_own(tmp_path):
    """The graph's imports: register its env in a fresh run.py too."""
    import examples.corridor  # noqa: F401 - registers Corridor-v0 here, to make the run

    agent = {"env_id": "Corridor-v0", "env_kwargs": {"length": 4},
             "algorithm": {"name": "dqn", "fc_layer_params": [8]}}
    run_dir, _, _ = make_run(tmp_path / "run", agent, final=False,
                             graph={"imports": ["examples.corridor"]})
    done = subprocess.run([sys.executable, os.path.join(ROOT, "run.py"), "play", run_dir,
                           "--episodes", "1"], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^episode 1: return [01]\.0 \(\d+ steps\)$", done.stdout, re.M), done.stdout


def test_play_video(tmp_path, capsys):
    run_dir, _, _ = make_run(tmp_path / "run", AGENTS["dqn"], final=False)
    video = str(tmp_path / "videos" / "play.mp4")
    code = main(["play", run_dir, "--episodes", "2", "--video", video])
    out, err = capsys.readouterr()
    if importlib.util.find_spec("moviepy") is None:
        assert code == 2 and not os.path.exists(video)
        assert err == "error: --video needs moviepy: pip install -e '.[video]'\n"
    else:
        assert code == 0, err
        assert os.path.getsize(video) > 1000 and f"video of episode 1: {video}" in out
        assert not [n for n in os.listdir(os.path.dirname(video)) if n != "play.mp4"]


def test_play_user_errors_are_one_line(tmp_path, capsys):
    def error(*argv) -> str:
        assert main(["play", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err
        return err

    assert "no run directory" in error(str(tmp_path / "missing"))
    run_dir, _, _ = make_run(tmp_path / "run", AGENTS["dqn_minatar_stacked"], final=False)
    assert "'latest' is none of them" in error(run_dir, "--which", "latest")
    assert "no reached policy" in error(run_dir, "--which", "reached")
    assert "draws no frames" in error(run_dir, "--render", "human")
    assert "--episodes" in error(run_dir, "--episodes", "0")
