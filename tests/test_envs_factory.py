"""The environment factory: id families, one-line errors at graph load, MinAtar and Atari
semantics (NEXT_STEP autoreset, episodic life with the game going on, raw score in metrics).
Atari and MinAtar tests skip when their extra is not installed."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest

from algorithms.envs import atari, check_env_id, env_spaces, make_env, minatar
from algorithms.steps import StepType, VectorEnvStepper
from nodes.env_runner import EpisodeStats

HAS_ALE = importlib.util.find_spec("ale_py") is not None
HAS_ENVPOOL = importlib.util.find_spec("envpool") is not None
needs_minatar = pytest.mark.skipif(not minatar.installed(), reason="needs the [minatar] extra")
needs_ale = pytest.mark.skipif(not HAS_ALE, reason="needs the [atari] extra")


@pytest.mark.parametrize("env_id,env_kwargs,words", [
    ("NoSuchEnv-v0", {}, "unknown environment id 'NoSuchEnv-v0'"),
    ("MinAtar/Brakeout-v1", {}, "unknown MinAtar id"),
    ("MinAtar/Breakout-v1", {"frame_skip": 4}, "unknown key 'frame_skip' for MinAtar"),
    ("ALE/Breakout-v5", {"sticky": 0.1}, "unknown key 'sticky' for Atari"),
    ("ALE/Breakout-v5", {"backend": "gpu"}, "backend 'gpu' is not one of ale, envpool"),
])
def test_bad_env_ids_and_kwargs_are_one_line_errors(env_id, env_kwargs, words):
    with pytest.raises(ValueError, match=words) as err:
        check_env_id(env_id, env_kwargs)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("env_id,extra", [("ALE/Pong-v5", "atari"),
                                          ("BreakoutNoFrameskip-v4", "atari"),
                                          ("MinAtar/Breakout-v1", "minatar")])
def test_a_missing_extra_is_named(monkeypatch, env_id, extra):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("ale_py", "minatar") else real(name, *a))
    with pytest.raises(ValueError, match=rf"needs the \[{extra}\] extra: pip install "
                                         rf"-e '\.\[{extra}\]'"):
        check_env_id(env_id, {})


def test_plain_gymnasium_ids_take_make_kwargs():
    env = make_env("CartPole-v1", 2, 0, {"max_episode_steps": 5})
    stepper = VectorEnvStepper(env, 0)
    stepper.reset()
    types = [stepper.step(np.zeros(2, np.int64)).step_type[0] for _ in range(6)]
    assert types[4] == StepType.LAST and types[5] == StepType.FIRST
    assert env_spaces("CartPole-v1")[0].dtype == np.float32


@needs_minatar
def test_minatar_frames_are_uint8_channels_first_and_reset_next_step():
    obs_space, act_space = env_spaces("MinAtar/Breakout-v1")
    assert obs_space.shape == (4, 10, 10) and obs_space.dtype == np.uint8
    assert act_space == gym.spaces.Discrete(3)
    assert env_spaces("MinAtar/Breakout-v0")[1] == gym.spaces.Discrete(6)
    env = make_env("MinAtar/Breakout-v1", 3, 7, {"sticky_action_prob": 0.0})
    obs, _ = env.reset(seed=7)
    assert obs.dtype == np.uint8 and obs.shape == (3, 4, 10, 10)
    assert set(np.unique(obs)) == {0, 255}
    done = np.zeros(3, bool)
    for _ in range(500):  # always "no-op": the ball is lost within a few dozen steps
        obs, reward, terminated, truncated, _ = env.step(np.zeros(3, np.int64))
        if done.any():  # the step after an end resets that game
            assert not reward[done].any() and not terminated[done].any()
            assert (obs[done][:, 3] == 255).sum() == 30  # the three full rows of bricks again
            break
        done = terminated | truncated
    else:
        pytest.fail("no episode ended")


@needs_minatar
def test_minatar_is_seeded_and_truncates():
    def rollout(seed):
        env = make_env("MinAtar/Breakout-v1", 2, seed, {"max_episode_steps": 4})
        obs, _ = env.reset(seed=seed)
        rng = np.random.default_rng(0)
        frames, truncs = [obs], []
        for _ in range(20):
            obs, _, _, truncated, _ = env.step(rng.integers(3, size=2))
            frames.append(obs)
            truncs.append(truncated.copy())
        return np.stack(frames), np.stack(truncs)

    a, trunc = rollout(3)
    b, _ = rollout(3)
    assert np.array_equal(a, b)
    assert trunc[3].all() and not trunc[:3].any() and not trunc[4].any()


class _ScriptedAtari(gym.vector.VectorEnv):
    """A backend that plays a fixed script: (raw reward, terminated, lives) per step."""

    def __init__(self, script):
        self.script = script
        self.num_envs = 1
        self.single_observation_space = gym.spaces.Box(0, 255, (1, 84, 84), np.uint8)
        self.single_action_space = gym.spaces.Discrete(4)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, 1)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, 1)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.zeros((1, 1, 84, 84), np.uint8), {"lives": np.array([3])}

    def step(self, actions):
        reward, terminated, lives = self.script[self.t]
        self.t += 1
        return (np.full((1, 1, 84, 84), self.t, np.uint8), np.array([reward], np.float32),
                np.array([terminated]), np.array([False]), {"lives": np.array([lives])})


# One game of three lives: 4 points, a life lost, 7 points, the last two lives lost together
# (game over), then the backend's reset step.
SCRIPT = [(4, False, 3), (0, False, 2), (0, False, 2), (7, False, 2), (0, False, 2),
          (0, True, 0), (0, False, 3)]


def _play(env):
    stepper = VectorEnvStepper(env)
    stepper.reset()
    stats = EpisodeStats(1)
    steps = []
    for _ in SCRIPT:
        ts = stepper.step(np.zeros(1, np.int64))
        stats.update(ts, 0, stepper.score, stepper.episode_start, stepper.episode_end)
        steps.append((int(ts.step_type[0]), float(ts.reward[0]), float(ts.discount[0])))
    return steps, stats.flush()


def test_training_atari_ends_episodes_at_lost_lives_but_metrics_count_whole_games():
    F, M, L = StepType.FIRST, StepType.MID, StepType.LAST
    steps, metrics = _play(atari.AtariEnv(_ScriptedAtari(SCRIPT), True, True))
    # Rewards clipped to their sign; a lost life is a LAST with discount 0, and the step after
    # it is a FIRST although the game went on (the frame is the game's next one).
    assert steps == [(M, 1, 1), (L, 0, 0), (F, 0, 1), (M, 1, 1), (M, 0, 1), (L, 0, 0), (F, 0, 1)]
    assert metrics == {"train/episode_return": 11.0, "train/episode_length": 6.0,
                       "train/episodes": 1,
                       # The learner's episodes, lives of clipped rewards: 1 in 2 steps, 1 in 3.
                       "train/learner_episode_return": 1.0,
                       "train/learner_episode_length": 2.5, "train/learner_episodes": 2}


def test_evaluation_atari_plays_whole_games_with_raw_rewards():
    F, M, L = StepType.FIRST, StepType.MID, StepType.LAST
    steps, metrics = _play(atari.AtariEnv(_ScriptedAtari(SCRIPT), False, False))
    assert steps == [(M, 4, 1), (M, 0, 1), (M, 0, 1), (M, 7, 1), (M, 0, 1), (L, 0, 0), (F, 0, 1)]
    assert metrics["train/episode_return"] == 11.0
    assert not any(k.startswith("train/learner_episode") for k in metrics)  # the same episodes


def test_the_stepper_says_which_envs_report_episode_marks():
    # Atari's wrapper reports raw rewards and game overs: the runner folds its marks in.
    stepper = VectorEnvStepper(atari.AtariEnv(_ScriptedAtari(SCRIPT), True, True))
    stepper.reset()
    assert not stepper.has_marks
    stepper.step(np.zeros(1, np.int64))
    assert stepper.has_marks
    # A plain Gymnasium env has none: the runner skips them (its episodes are the game's).
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    try:
        stepper = VectorEnvStepper(env, seed=0)
        stepper.reset()
        for _ in range(30):
            stepper.step(np.zeros(2, np.int64))
        assert not stepper.has_marks
    finally:
        env.close()


@needs_ale
@pytest.mark.parametrize("backend", ["ale", pytest.param("envpool", marks=pytest.mark.skipif(
    not HAS_ENVPOOL, reason="EnvPool is not installed"))])
def test_atari_breakout_preprocessing_and_lost_lives(backend):
    kwargs = {"backend": backend}
    obs_space, act_space = env_spaces("ALE/Breakout-v5", kwargs)
    assert obs_space.shape == (1, 84, 84) and obs_space.dtype == np.uint8
    assert act_space == gym.spaces.Discrete(4)
    env = make_env("ALE/Breakout-v5", 2, 0, kwargs, training=True)
    try:
        obs, info = env.reset(seed=0)
        assert obs.shape == (2, 1, 84, 84) and obs.dtype == np.uint8
        rng = np.random.default_rng(0)
        lives = env._lives.copy()
        for _ in range(400):  # random play loses a life within ~100 steps
            obs, _, terminated, _, info = env.step(rng.integers(4, size=2))
            if terminated.any():
                break
        else:
            pytest.fail("no life lost")
        assert obs.max() > 0 and not info["game_over"][terminated].any()
        assert (env._lives[terminated] == lives[terminated] - 1).all()
        # The game goes on: the next step is not a reset (the lives stay down).
        env.step(np.zeros(2, np.int64))
        assert (env._lives[terminated] == lives[terminated] - 1).all()
    finally:
        env.close()
