"""Datasets in the Minari format: episodes cut out of replay rings (table-driven), written and
read back (by Minari itself too), damaged or mismatched datasets refused in one line, and the
read-only rows a replay store samples from."""

import json
import os

import gymnasium as gym
import h5py
import numpy as np
import pytest

from algorithms.config_offline import BcConfig
from nodes._agent import Agent
from nodes._datasets import check_dataset
from storage.datasets import (
    Dataset,
    DatasetError,
    DatasetRows,
    Episode,
    episode_steps,
    episodes_from_ring,
    write_dataset,
)

F, M, L = 0, 1, 2  # StepType


def _ring(step_types, discounts, max_length=None, pos=None):
    """One environment's ring holding ``step_types``: observation and action at step ``i``
    are ``i`` (so every cut can be read off), reward ``10 * i``."""
    n = len(step_types)
    max_length = max_length or n
    pos = n if pos is None else pos
    fields = {"step_type": np.zeros((1, max_length), np.int64),
              "discount": np.ones((1, max_length), np.float32),
              "reward": np.zeros((1, max_length), np.float32),
              "observation": np.zeros((1, max_length, 1), np.float32),
              "action": np.zeros((1, max_length, 1), np.float32)}
    for i, (st, d) in enumerate(zip(step_types, discounts, strict=True)):
        slot = (pos - n + i) % max_length
        fields["step_type"][0, slot] = st
        fields["discount"][0, slot] = d
        fields["reward"][0, slot] = 10 * i
        fields["observation"][0, slot, 0] = i
        fields["action"][0, slot, 0] = i
    return fields, np.array([pos]), np.array([n])


CUTS = [
    # (step types, discounts, expected episodes as (first step, last step, terminated))
    ("two whole episodes", [F, M, L, F, M, M, L], [1, 1, 0, 1, 1, 1, 1],
     [(0, 2, True), (3, 6, False)]),
    ("a ring that overwrote an episode's start", [M, L, F, M, L], [1, 1, 1, 1, 0],
     [(2, 4, True)]),
    ("an episode still running is cut, truncated", [F, M, L, F, M, M], [1, 1, 1, 1, 1, 1],
     [(0, 2, False), (3, 5, False)]),
    ("a lone FIRST has no transition", [F, M, L, F], [1, 1, 0, 1], [(0, 2, True)]),
]


@pytest.mark.parametrize("types,discounts,expected", [c[1:] for c in CUTS],
                         ids=[c[0] for c in CUTS])
def test_episodes_from_ring(types, discounts, expected):
    episodes = list(episodes_from_ring(*_ring(types, discounts)))
    assert len(episodes) == len(expected)
    for ep, (first, last, terminated) in zip(episodes, expected, strict=True):
        n = last - first
        assert ep.observations[:, 0].tolist() == list(range(first, last + 1))
        assert ep.actions[:, 0].tolist() == list(range(first, last))
        # The reward of the transition from i to i + 1 is stored at i + 1.
        assert ep.rewards.tolist() == [10.0 * i for i in range(first + 1, last + 1)]
        assert ep.terminations.tolist() == [False] * (n - 1) + [terminated]
        assert ep.truncations.tolist() == [False] * (n - 1) + [not terminated]


def test_a_wrapped_ring_is_read_in_order():
    fields, pos, size = _ring([F, M, L, F, M, L], [1, 1, 0, 1, 1, 0], max_length=6, pos=9)
    episodes = list(episodes_from_ring(fields, pos, size))
    assert [ep.observations[:, 0].tolist() for ep in episodes] == [[0, 1, 2], [3, 4, 5]]


def test_episode_steps_inverts_the_cut():
    fields, pos, size = _ring([F, M, M, L], [1, 1, 1, 0])
    (episode,) = episodes_from_ring(fields, pos, size)
    steps = episode_steps(episode)
    assert steps["step_type"].tolist() == [F, M, M, L]
    assert steps["discount"].tolist() == [1, 1, 1, 0]
    assert steps["reward"].tolist() == [0, 10, 20, 30]
    assert steps["observation"][:, 0].tolist() == [0, 1, 2, 3]
    assert steps["action"][:, 0].tolist() == [0, 1, 2, 0]  # nothing acts at LAST
    assert steps["prev_action"][:, 0].tolist() == [0, 0, 1, 2]


def _random_episodes(env_id: str, count: int, seed: int = 0):
    """Real episodes of a real env under uniform actions (CartPole terminates, Pendulum is
    truncated at 200 steps)."""
    env = gym.make(env_id)
    env.action_space.seed(seed)
    for k in range(count):
        obs, _ = env.reset(seed=seed + k)
        observations, actions, rewards = [obs], [], []
        while True:
            action = env.action_space.sample()
            obs, reward, terminated, truncated, _ = env.step(action)
            observations.append(obs)
            actions.append(action)
            rewards.append(reward)
            if terminated or truncated:
                break
        n = len(rewards)
        end = np.zeros(n, bool)
        end[-1] = True
        yield Episode(np.array(observations), np.array(actions), np.array(rewards, np.float32),
                      end & terminated, end & (not terminated))


def _write(tmp_path, env_id="CartPole-v1", count=4, name="cartpole-random-v0"):
    env = gym.make(env_id)
    path = os.path.join(tmp_path, name)
    episodes = list(_random_episodes(env_id, count))
    write_dataset(path, iter(episodes), env.observation_space, env.action_space,
                  dataset_id=name, env_spec=env.spec, metadata={"conduit": {"run_dir": "r"}})
    return path, episodes


def test_a_written_dataset_loads_with_minari(tmp_path, monkeypatch):
    import minari

    path, episodes = _write(tmp_path)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    dataset = minari.load_dataset("cartpole-random-v0")
    assert dataset.total_episodes == len(episodes)
    assert dataset.total_steps == sum(len(ep) for ep in episodes)
    assert dataset.spec.env_spec.id == "CartPole-v1"
    for got, want in zip(dataset.iterate_episodes(), episodes, strict=True):
        np.testing.assert_array_equal(got.observations, want.observations)
        np.testing.assert_array_equal(got.actions, want.actions)
        np.testing.assert_array_equal(got.rewards, want.rewards)
        np.testing.assert_array_equal(got.terminations, want.terminations)
        np.testing.assert_array_equal(got.truncations, want.truncations)
    ours = Dataset(path)
    assert ours.env_id == "CartPole-v1" and ours.metadata["conduit"] == {"run_dir": "r"}
    for got, want in zip(ours.episodes(), episodes, strict=True):
        np.testing.assert_array_equal(got.observations, want.observations)


def test_writing_over_a_dataset_or_with_a_bad_id_is_refused(tmp_path):
    path, _ = _write(tmp_path)
    env = gym.make("CartPole-v1")
    with pytest.raises(DatasetError, match="exists"):
        write_dataset(path, _random_episodes("CartPole-v1", 1), env.observation_space,
                      env.action_space, dataset_id="cartpole-random-v0")
    with pytest.raises(DatasetError, match="name-v<version>"):
        write_dataset(os.path.join(tmp_path, "x"), _random_episodes("CartPole-v1", 1),
                      env.observation_space, env.action_space, dataset_id="no version")
    assert not os.path.exists(os.path.join(tmp_path, "x"))


def _one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message
    return message


def test_damaged_datasets_are_one_line_errors(tmp_path):
    path, _ = _write(tmp_path)
    meta = os.path.join(path, "data", "metadata.json")
    with open(meta) as f:
        good = json.load(f)
    # The metadata counts an episode the file does not hold.
    with open(meta, "w") as f:
        json.dump({**good, "total_episodes": good["total_episodes"] + 1}, f)
    with pytest.raises(DatasetError) as exc:
        Dataset(path)
    assert "holds 4 episodes" in _one_line(exc)
    # Garbage metadata.
    with open(meta, "w") as f:
        f.write("{not json")
    with pytest.raises(DatasetError) as exc:
        Dataset(path)
    assert "metadata.json unreadable" in _one_line(exc)
    with open(meta, "w") as f:
        json.dump(good, f)
    # A truncated HDF5 file.
    main = os.path.join(path, "data", "main_data.hdf5")
    with open(main, "r+b") as f:
        f.truncate(100)
    with pytest.raises(DatasetError) as exc:
        Dataset(path)
    assert "main_data.hdf5 unreadable" in _one_line(exc)
    with pytest.raises(DatasetError) as exc:
        Dataset(os.path.join(tmp_path, "missing"))
    assert "no such directory" in _one_line(exc)


def test_an_episode_of_the_wrong_dtype_is_refused_when_read(tmp_path):
    path, _ = _write(tmp_path)
    with h5py.File(os.path.join(path, "data", "main_data.hdf5"), "a") as f:
        observations = f["episode_2/observations"][()]
        del f["episode_2/observations"]
        f["episode_2/observations"] = observations.astype(np.float64)
    episodes = Dataset(path).episodes()
    next(episodes), next(episodes)
    with pytest.raises(DatasetError) as exc:
        next(episodes)
    assert "episode_2: observations are float64[4]" in _one_line(exc)


def test_a_dataset_must_fit_the_agent(tmp_path):
    path, _ = _write(tmp_path)
    check_dataset(path, Agent(env_id="CartPole-v1", algorithm=BcConfig()))
    with pytest.raises(DatasetError) as exc:
        check_dataset(path, Agent(env_id="Acrobot-v1", algorithm=BcConfig()))
    assert "recorded on CartPole-v1" in _one_line(exc)
    # No env spec recorded: the spaces decide (Acrobot's observations are 6 wide, not 4).
    meta = os.path.join(path, "data", "metadata.json")
    with open(meta) as f:
        good = json.load(f)
    with open(meta, "w") as f:
        json.dump({k: v for k, v in good.items() if k != "env_spec"}, f)
    with pytest.raises(DatasetError) as exc:
        check_dataset(path, Agent(env_id="Acrobot-v1", algorithm=BcConfig()))
    assert "observations are float32[4]" in _one_line(exc)


def test_rows_sample_windows_that_start_before_last(tmp_path):
    path, episodes = _write(tmp_path, "Pendulum-v1", count=2, name="pendulum-random-v0")
    spec = {"step_type": ((), np.int64), "reward": ((), np.float32),
            "discount": ((), np.float32), "observation": ((3,), np.float32),
            "prev_action": ((1,), np.float32), "env_id": ((), np.int64),
            "action": ((1,), np.float32)}
    rows = DatasetRows(Dataset(path), spec, env_id=5)
    assert rows.size == 2 * 201
    data, starts = rows.sample(1000, 2, np.random.default_rng(0))
    assert data["observation"].shape == (1000, 2, 3)
    assert (data["step_type"][:, 0] != L).all() and (data["env_id"] == 5).all()
    # Each window is two consecutive stored steps of the dataset.
    first = episodes[0]
    inside = starts < 200
    np.testing.assert_array_equal(data["observation"][inside, 0],
                                  first.observations[starts[inside]])
    np.testing.assert_array_equal(data["action"][inside, 0], first.actions[starts[inside]])
    np.testing.assert_array_equal(data["reward"][inside, 1], first.rewards[starts[inside]])
    assert set(rows.starts(2).tolist()) == set(range(200)) | set(range(201, 401))
    assert set(starts.tolist()) <= set(rows.starts(2).tolist())
    capped = DatasetRows(Dataset(path), spec, cap=150)
    assert capped.size == 150
    assert capped.starts(2).max() == 148
