import gymnasium as gym
import numpy as np
import pytest

import algorithms
from algorithms.configs import DqnConfig, PpoConfig
from algorithms.data import Experience, StepType
from algorithms.sync_trainer import TinyReplay, TrainerConfig, VectorEnvStepper, train

F, M, L = int(StepType.FIRST), int(StepType.MID), int(StepType.LAST)


class Countdown(gym.Env):
    """obs = steps taken in the episode, reward 1 per step, terminates after 3 steps."""

    observation_space = gym.spaces.Box(0, 100, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, terminate: bool):
        self.terminate, self.t = terminate, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t], np.float32), 1.0, self.terminate and self.t == 3, False, {}


def _vec(terminate: bool):
    def make():
        env = Countdown(terminate)
        return env if terminate else gym.wrappers.TimeLimit(env, max_episode_steps=3)
    return gym.vector.SyncVectorEnv([make], autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)


@pytest.mark.parametrize("terminate,last_discount", [(True, 0.0), (False, 1.0)],
                         ids=["termination", "truncation"])
def test_stepper_step_types(terminate, last_discount):
    stepper = VectorEnvStepper(_vec(terminate), seed=0)
    rows = [stepper.reset()] + [stepper.step(np.zeros(1, np.int64)) for _ in range(6)]
    table = [(int(r.step_type[0]), float(r.reward[0]), float(r.discount[0]),
              float(r.observation[0, 0])) for r in rows]
    assert table == [
        (F, 0.0, 1.0, 0.0), (M, 1.0, 1.0, 1.0), (M, 1.0, 1.0, 2.0),
        (L, 1.0, last_discount, 3.0),       # final observation on LAST
        (F, 0.0, 1.0, 0.0),                 # reset step: reward 0, action ignored
        (M, 1.0, 1.0, 1.0), (M, 1.0, 1.0, 2.0)]


def test_tiny_replay_windows_never_straddle_the_write_head():
    replay = TinyReplay(capacity=5, num_envs=2, rng=np.random.default_rng(0))
    for t in range(7):
        replay.add(Experience(step_type=np.full(2, M), observation=np.array([[t], [100 + t]]),
                              action=np.zeros(2, np.int64)))
    batch = replay.sample(256, 3)
    obs = batch.observation[..., 0]
    assert obs.shape == (256, 3)
    base = obs % 100
    assert (np.diff(base, axis=1) == 1).all()             # consecutive, no wrap-around
    assert base.min() >= 2 and base.max() <= 6            # only the newest 5 steps
    assert set(base[:, 0]) == {2, 3, 4}                   # every valid start is used
    assert ((obs >= 100).all(1) | (obs < 100).all(1)).all()  # one env per window


def test_trainer_options_reject_unknown_keys():
    with pytest.raises(TypeError, match="mini_batch_sise"):
        TrainerConfig.from_kwargs(mini_batch_sise=3)


@pytest.mark.parametrize("name", ["dqn", "ppo"])
def test_train_runs_end_to_end(name):
    env = gym.make("CartPole-v1")
    small = {"dqn": DqnConfig(fc_layer_params=[16]),
             "ppo": PpoConfig(actor_fc_layer_params=[16], value_fc_layer_params=[16])}[name]
    alg = algorithms.make(small, env.observation_space, env.action_space)
    cfg = TrainerConfig(num_envs=2, num_env_steps=400, unroll_length=8, initial_collect_steps=64,
                        mini_batch_size=16, eval_interval=200, num_eval_episodes=2)
    result = train(alg, "CartPole-v1", cfg, seed=0)
    assert result.env_steps == 400 and len(result.evals) == 2
    assert result.last_metrics and int(alg.train_steps) > 0
