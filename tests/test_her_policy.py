"""``conduit.load_policy`` on a goal-conditioned ``Dict`` observation (FetchReach-v4):
``act`` on one observation and on a batch acts as the evaluator's ``predict_step``, through
episodes of the real env, and the exported program takes the dict and acts alike.

Run directories are made by hand with the nodes' own writers (tests/test_policy_load.py's
``make_run``)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from algorithms.steps import StepType, TimeStep, VectorEnvStepper, make_vector_env
from conduit import load_policy
from nodes._policy import load_exported
from tests.test_policy_load import make_run

pytest.importorskip("gymnasium_robotics")

AGENT = {"env_id": "FetchReach-v4", "algorithm": {
    "name": "sac", "actor_fc_layer_params": [32, 32], "critic_fc_layer_params": [32, 32],
    "data_transformers": [{"name": "observation_concat", "keys": ["observation", "desired_goal"]},
                          {"name": "observation_normalizer", "clipping": 5.0}]}}


def observations(space, n: int, seed: int = 0) -> dict:
    space.seed(seed)
    samples = [space.sample() for _ in range(n)]
    return {k: np.stack([s[k] for s in samples]) for k in samples[0]}


def evaluator_actions(alg, obs: dict) -> np.ndarray:
    b = len(next(iter(obs.values())))
    ts = TimeStep(step_type=np.full(b, StepType.FIRST, np.int64), reward=np.zeros(b, np.float32),
                  discount=np.ones(b, np.float32), observation=obs,
                  env_id=np.arange(b, dtype=np.int64))
    with torch.no_grad():
        action = alg.predict_step(ts).output.numpy()
    return np.clip(action, -1, 1)


def test_act_takes_dict_observations(tmp_path):
    run_dir, best_alg, _ = make_run(tmp_path / "run", AGENT, final=False, wild=True)
    policy = load_policy(run_dir, "best")
    obs = observations(policy.observation_space, 16)
    want = evaluator_actions(best_alg, obs)
    assert not np.allclose(want, want[:1]), "one action for every observation: no test"
    got, _ = policy.act(obs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    single, _ = policy.act({k: v[3] for k, v in obs.items()})
    assert single.shape == (4,)
    np.testing.assert_allclose(single, want[3], rtol=1e-5, atol=1e-6)
    # The achieved goal is not among the keys the policy reads: changing it changes nothing;
    # the desired goal is.
    moved = dict(obs, achieved_goal=obs["achieved_goal"] + 1.0)
    np.testing.assert_allclose(policy.act(moved)[0], want, rtol=1e-5, atol=1e-6)
    elsewhere = dict(obs, desired_goal=obs["desired_goal"] + 1.0)
    assert not np.allclose(policy.act(elsewhere)[0], want)


def test_act_names_what_does_not_fit(tmp_path):
    run_dir, _, _ = make_run(tmp_path / "run", AGENT, final=False)
    policy = load_policy(run_dir, "best")
    obs = observations(policy.observation_space, 2)
    with pytest.raises(ValueError, match="expected a dict"):
        policy.act(obs["observation"])
    with pytest.raises(ValueError, match="no key 'desired_goal'"):
        policy.act({k: v for k, v in obs.items() if k != "desired_goal"})
    with pytest.raises(ValueError, match=r"observation\['observation'\]: expected shape"):
        policy.act(dict(obs, observation=obs["observation"][:, :5]))


def test_acts_as_the_evaluator_through_episodes_and_exports(tmp_path):
    run_dir, alg, _ = make_run(tmp_path / "run", AGENT, final=False, wild=True)
    policy = load_policy(run_dir, "best")
    module, record = load_exported(policy.export(str(tmp_path / "policy.pt2")))
    assert record["observation_shape"] == {"achieved_goal": [3], "desired_goal": [3],
                                           "observation": [10]}
    env = make_vector_env("FetchReach-v4", 3, seed=7)
    try:
        stepper = VectorEnvStepper(env, 7)
        ts = stepper.reset()
        for _ in range(60):  # past the 50-step truncation: the resets included
            with torch.no_grad():
                want = alg.predict_step(ts).output.numpy()
            action, _ = policy.act(ts.observation)
            np.testing.assert_allclose(action, np.clip(want, -1, 1), rtol=1e-5, atol=1e-6)
            first = torch.as_tensor(ts.step_type == StepType.FIRST)
            with torch.no_grad():
                exported, _ = module({k: torch.as_tensor(v) for k, v in ts.observation.items()},
                                     first, ())
            np.testing.assert_allclose(exported.numpy(), action, rtol=1e-5, atol=1e-6)
            ts = stepper.step(action)
    finally:
        env.close()


def test_play_env_gives_dict_observations(tmp_path):
    run_dir, _, _ = make_run(tmp_path / "run", AGENT, final=False)
    policy = load_policy(run_dir, "best")
    env = policy.make_env()
    try:
        obs, _ = env.reset(seed=0)
        assert set(obs) == {"achieved_goal", "desired_goal", "observation"}
        action, _ = policy.act(obs)
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs["observation"].shape == (10,) and reward in (-1.0, 0.0)
        assert "is_success" in info
    finally:
        env.close()


def test_a_dict_observation_run_is_refused_as_a_dataset_in_one_line(tmp_path):
    """``run.py dataset`` of a goal-conditioned run: one line naming the keys, exit 2 (a
    dataset holds one observation array), not a traceback from the replay's field names."""
    import subprocess
    import sys

    from tests.pipeline_harness import ROOT

    run_dir, _, _ = make_run(tmp_path / "run", AGENT)
    ckpt_root = os.path.join(run_dir, "checkpoints")
    (ckpt,) = os.listdir(ckpt_root)
    open(os.path.join(ckpt_root, ckpt, "replay_store.pt"), "wb").close()
    done = subprocess.run([sys.executable, "run.py", "dataset", run_dir, "--to",
                           str(tmp_path / "fetch-v0"), "--checkpoint",
                           os.path.join(ckpt_root, ckpt)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "FetchReach-v4: Dict observations (achieved_goal, desired_goal, observation)" in line
    assert not (tmp_path / "fetch-v0").exists()
