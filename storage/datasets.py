"""Datasets in the Minari format (Farama's standard for offline RL), written from and read into
replay storage.

A dataset is a directory ``DIR/data/`` holding ``metadata.json`` and ``main_data.hdf5`` with one
group ``episode_<i>`` per episode: ``observations`` (``n + 1`` rows: the final observation
included), ``actions``, ``rewards``, ``terminations`` and ``truncations`` (``n`` rows each).
``minari.load_dataset(ID)`` opens it when ``DIR`` is named ``ID`` and ``MINARI_DATASETS_PATH``
is its parent; ``minari.MinariDataset(DIR/data)`` opens it from anywhere.

Why not Minari's ``DataCollector``: it records by stepping an env (and needs ``minari[create]``,
which pulls jax), while a dataset here is made from steps already stored, long after they were
collected. So episodes are cut out of a replay ring (:func:`episodes_from_ring`) and written
through Minari's own storage class (``MinariStorage``, ``minari[hdf5]`` only), one episode at
a time. Reading goes straight to the HDF5 file, one episode at a time (:meth:`Dataset.episodes`),
so neither writing nor loading holds a dataset twice in memory: the replay store copies each
episode into its rings as it reads it.

Stored steps follow ALF (see ``storage.nest.StepType``): step ``t`` holds the time step that
arrived at ``t`` (its reward and discount) and the action taken at ``t``; an episode is
``FIRST, MID..., LAST``; a LAST step with discount 0 terminated, one with discount 1 was
truncated. :func:`episode_steps` is the inverse of the cut: a Minari episode as stored steps.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from storage.nest import StepType

DATA = "data"
METADATA = "metadata.json"
MAIN = "main_data.hdf5"
OFFLINE_EXTRA = "pip install -e '.[offline]'"


class DatasetError(ValueError):
    """A dataset that cannot be read or does not fit: one line naming the path."""


@dataclass(frozen=True)
class Episode:
    """One episode as Minari stores it (``n`` transitions)."""

    observations: np.ndarray   # [n + 1, ...]
    actions: np.ndarray        # [n, ...]
    rewards: np.ndarray        # [n]
    terminations: np.ndarray   # [n] bool: only the last may be true
    truncations: np.ndarray    # [n] bool: only the last may be true

    def __len__(self) -> int:
        return len(self.rewards)


# ----- replay rings -> episodes ------------------------------------------------------------------
def episodes_from_ring(fields: Mapping[str, np.ndarray], current_pos, current_size
                       ) -> Iterator[Episode]:
    """Cut the episodes out of replay rings, oldest first, environment by environment.

    ``fields``: ``step_type``, ``reward``, ``discount``, ``observation``, ``action``, each
    ``[num_envs, max_length, ...]`` (numpy arrays; memory-mapped ones are read an episode at a
    time). ``current_pos``/``current_size``: each ring's write position and stored steps.
    Steps before an environment's first stored ``FIRST`` (the ring overwrote their episode's
    start) are skipped; an episode still running at the newest step is cut there and marked
    truncated, which is what it is to an offline learner: its value past that step is unknown,
    not zero. An episode of no transition is skipped."""
    step_type = fields["step_type"]
    max_length = step_type.shape[1]
    for env in range(step_type.shape[0]):
        end, size = int(current_pos[env]), int(current_size[env])
        idx = np.arange(end - size, end) % max_length
        types = np.asarray(step_type[env])[idx]
        starts = np.flatnonzero(types == StepType.FIRST)
        for k, start in enumerate(starts):
            stop = starts[k + 1] if k + 1 < len(starts) else len(types)
            lasts = np.flatnonzero(types[start:stop] == StepType.LAST)
            last = start + lasts[0] if len(lasts) else stop - 1
            if last == start:
                continue
            rows = idx[start:last + 1]
            yield _episode(fields, env, rows, ended=bool(len(lasts)))


@contextlib.contextmanager
def ring_files(directory: str):
    """The rings a memory-mapped replay buffer (``storage_dir``) left in ``directory``, mapped
    read-only: ``(fields, current_pos, current_size)`` for :func:`episodes_from_ring`.

    Only while no writer holds the directory (a running store keeps an exclusive flock on
    ``lock``; this holds a shared one meanwhile), so the rings do not move under the reader.
    The cursors move last on every append (``storage.ring``), so what they count is written."""
    layout_path = os.path.join(directory, "layout.json")
    if not os.path.exists(layout_path):
        raise DatasetError(f"{directory}: no layout.json (not a memory-mapped replay buffer)")
    fd = os.open(os.path.join(directory, "lock"), os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            raise DatasetError(f"{directory} is in use by a running replay store: stop the run "
                               f"first, or use a checkpoint") from None
        with open(layout_path) as f:
            layout = json.load(f)
        arrays = {name: np.memmap(os.path.join(directory, f"{name}.bin"), mode="r",
                                  dtype=np.dtype(entry["dtype"].removeprefix("torch.")),
                                  shape=tuple(entry["shape"]))
                  for name, entry in layout.items()
                  if name.startswith(("data.", "writer."))}
        fields = {k.removeprefix("data."): v for k, v in arrays.items() if k.startswith("data.")}
        yield fields, np.asarray(arrays["writer.current_pos"]), \
            np.asarray(arrays["writer.current_size"])
    finally:
        os.close(fd)


def _episode(fields, env: int, rows: np.ndarray, ended: bool) -> Episode:
    """Stored steps ``rows`` of ``env`` (FIRST .. LAST, or cut) as a Minari episode."""
    n = len(rows) - 1
    discount = np.asarray(fields["discount"][env])[rows[-1]]
    terminations = np.zeros(n, bool)
    truncations = np.zeros(n, bool)
    terminated = ended and float(discount) == 0.0
    terminations[-1], truncations[-1] = terminated, not terminated
    return Episode(
        observations=np.asarray(fields["observation"][env][rows]),
        actions=np.asarray(fields["action"][env][rows[:-1]]),
        rewards=np.asarray(fields["reward"][env][rows[1:]], np.float32),
        terminations=terminations, truncations=truncations)


# ----- episodes -> stored steps --------------------------------------------------------------------
def episode_steps(episode: Episode) -> dict[str, np.ndarray]:
    """A Minari episode as ``n + 1`` stored steps (ALF's layout): ``FIRST`` with reward 0,
    the observation at each step, the action taken there (zeros at the final step, whose
    action nothing reads: no transition leaves a LAST step), the previous action, and the
    discount that says how the episode ended (0 after a termination, else 1)."""
    n = len(episode)
    step_type = np.full(n + 1, StepType.MID, np.int64)
    step_type[0], step_type[-1] = StepType.FIRST, StepType.LAST
    reward = np.zeros(n + 1, np.float32)
    reward[1:] = episode.rewards
    discount = np.ones(n + 1, np.float32)
    if bool(episode.terminations[-1]):
        discount[-1] = 0.0
    actions = np.asarray(episode.actions)
    action = np.concatenate([actions, np.zeros_like(actions[:1])])
    prev_action = np.concatenate([np.zeros_like(actions[:1]), actions])
    return {"step_type": step_type, "reward": reward, "discount": discount,
            "observation": np.asarray(episode.observations), "prev_action": prev_action,
            "action": action}


# ----- writing ---------------------------------------------------------------------------------
def write_dataset(path: str, episodes: Iterable[Episode], observation_space, action_space, *,
                  dataset_id: str, env_spec=None, metadata: Mapping | None = None) -> dict:
    """Write ``episodes`` as a Minari dataset in directory ``path`` (made whole in a hidden
    sibling, then renamed: a crash never leaves a half dataset under the name). ``env_spec``:
    the Gymnasium ``EnvSpec`` (or None: the spaces alone); ``metadata``: extra keys for
    ``metadata.json`` (which run, which policy). Returns the metadata written."""
    minari, MinariStorage, EpisodeBuffer = _minari()
    if os.path.exists(path):
        raise DatasetError(f"{path} exists: remove it or choose another --to")
    _check_dataset_id(dataset_id)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        storage = MinariStorage.new(os.path.join(tmp, DATA), observation_space=observation_space,
                                    action_space=action_space, env_spec=env_spec,
                                    data_format="hdf5", jpeg_encoding=False)
        # A generator: Minari's HDF5 storage writes each episode as it comes, in one file open.
        storage.update_episodes(
            EpisodeBuffer(observations=ep.observations, actions=ep.actions,
                          rewards=ep.rewards, terminations=ep.terminations,
                          truncations=ep.truncations)
            for ep in episodes)
        if storage.total_episodes == 0:
            raise DatasetError(f"{path}: no complete transition to write")
        storage.update_metadata({"dataset_id": dataset_id, "minari_version": minari.__version__,
                                 **dict(metadata or {})})
        written = storage.metadata
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return written


def _check_dataset_id(dataset_id: str) -> None:
    from minari.dataset.minari_dataset import DATASET_ID_RE

    if not DATASET_ID_RE.fullmatch(dataset_id) or "-v" not in dataset_id:
        raise DatasetError(f"dataset id {dataset_id!r}: Minari ids are "
                           f"[namespace/]name-v<version>, e.g. pendulum-sac-v0")


def _minari():
    try:
        import minari
        from minari.data_collector.episode_buffer import EpisodeBuffer
        from minari.dataset.minari_storage import MinariStorage
    except ImportError:
        raise DatasetError(f"datasets need minari with h5py: {OFFLINE_EXTRA}") from None
    return minari, MinariStorage, EpisodeBuffer


# ----- reading -------------------------------------------------------------------------------------
class Dataset:
    """A Minari dataset on disk, read lazily: the metadata and spaces at once, the episodes one
    at a time. ``path``: the dataset's directory (or its ``data/``). Anything unreadable or
    inconsistent is a :class:`DatasetError` naming the path (and the episode)."""

    def __init__(self, path: str):
        self.path = path
        data = path if os.path.exists(os.path.join(path, METADATA)) else os.path.join(path, DATA)
        meta_file = os.path.join(data, METADATA)
        if not os.path.isdir(path):
            raise DatasetError(f"dataset {path}: no such directory")
        if not os.path.exists(meta_file):
            raise DatasetError(f"dataset {path}: no {DATA}/{METADATA} (not a Minari dataset)")
        try:
            with open(meta_file) as f:
                self.metadata = json.load(f)
        except (OSError, ValueError) as exc:
            raise DatasetError(f"dataset {path}: {METADATA} unreadable: {exc}") from None
        if self.metadata.get("data_format", "hdf5") != "hdf5":
            raise DatasetError(f"dataset {path}: data_format "
                               f"{self.metadata.get('data_format')!r}, only hdf5 is read")
        self.file = os.path.join(data, MAIN)
        try:
            from minari.serialization import deserialize_space
            self.observation_space = deserialize_space(self.metadata["observation_space"])
            self.action_space = deserialize_space(self.metadata["action_space"])
            self.total_episodes = int(self.metadata["total_episodes"])
            self.total_steps = int(self.metadata["total_steps"])
        except ImportError:
            raise DatasetError(f"datasets need minari with h5py: {OFFLINE_EXTRA}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise DatasetError(f"dataset {path}: {METADATA} lacks or garbles "
                               f"{exc}") from None
        self.env_id = _env_id(self.metadata.get("env_spec"))
        self._check_file()

    def _check_file(self) -> None:
        """The file opens and holds the episodes the metadata counts (cheap: no data read)."""
        h5py = _h5py()
        try:
            with h5py.File(self.file, "r") as f:
                count = sum(1 for k in f if k.startswith("episode_"))
        except OSError as exc:
            raise DatasetError(f"dataset {self.path}: {MAIN} unreadable: "
                               f"{str(exc).splitlines()[0]}") from None
        if count != self.total_episodes:
            raise DatasetError(f"dataset {self.path}: {MAIN} holds {count} episodes, "
                               f"{METADATA} says {self.total_episodes}")

    @property
    def stored_steps(self) -> int:
        """Steps a replay ring needs for all of it: each episode's transitions plus its
        final step."""
        return self.total_steps + self.total_episodes

    def episodes(self) -> Iterator[Episode]:
        """The episodes in order, each read when asked for and checked against the spaces."""
        h5py = _h5py()
        obs_shape, obs_dtype = _space_layout(self.observation_space)
        act_shape, act_dtype = _space_layout(self.action_space)
        try:
            with h5py.File(self.file, "r") as f:
                for i in range(self.total_episodes):
                    where = f"dataset {self.path}: episode_{i}"
                    try:
                        group = f[f"episode_{i}"]
                        ep = Episode(observations=group["observations"][()],
                                     actions=group["actions"][()],
                                     rewards=group["rewards"][()],
                                     terminations=group["terminations"][()],
                                     truncations=group["truncations"][()])
                    except (KeyError, OSError, TypeError) as exc:
                        raise DatasetError(f"{where}: unreadable "
                                           f"({str(exc).splitlines()[0]})") from None
                    _check_episode(ep, where, obs_shape, obs_dtype, act_shape, act_dtype)
                    yield ep
        except OSError as exc:
            raise DatasetError(f"dataset {self.path}: {MAIN} unreadable: "
                               f"{str(exc).splitlines()[0]}") from None


def _h5py():
    try:
        import h5py
    except ImportError:
        raise DatasetError(f"datasets need h5py: {OFFLINE_EXTRA}") from None
    return h5py


def _env_id(env_spec_json) -> str | None:
    if not env_spec_json:
        return None
    try:
        return json.loads(env_spec_json).get("id")
    except (TypeError, ValueError):
        return None


def _space_layout(space) -> tuple[tuple, str | None]:
    """``(shape, dtype name)`` of a Box or Discrete space's single element."""
    if hasattr(space, "n") and not getattr(space, "shape", None):
        return (), None  # Discrete: any integer dtype
    return tuple(space.shape), np.dtype(space.dtype).name


def _check_episode(ep: Episode, where: str, obs_shape, obs_dtype, act_shape, act_dtype) -> None:
    n = len(ep.rewards)
    if n == 0:
        raise DatasetError(f"{where}: no transition")
    for name, rows in (("observations", n + 1), ("actions", n), ("terminations", n),
                       ("truncations", n)):
        got = len(getattr(ep, name))
        if got != rows:
            raise DatasetError(f"{where}: {got} {name} for {n} rewards (expected {rows})")
    for name, array, shape, dtype in (("observations", ep.observations, obs_shape, obs_dtype),
                                      ("actions", ep.actions, act_shape, act_dtype)):
        if tuple(array.shape[1:]) != shape or (dtype is not None and array.dtype.name != dtype):
            raise DatasetError(f"{where}: {name} are {array.dtype.name}{list(array.shape[1:])}, "
                               f"the dataset's space says {dtype}{list(shape)}")
        if dtype is None and not np.issubdtype(array.dtype, np.integer):
            raise DatasetError(f"{where}: {name} are {array.dtype.name}, a Discrete space needs "
                               f"integers")


# ----- read-only rows for sampling ---------------------------------------------------------------
class DatasetRows:
    """A dataset's stored steps, read-only, for uniform sampling of ``[B, T]`` windows.

    Not a :class:`~storage.ReplayBuffer`: nothing is appended, evicted or re-prioritized, so
    the rows are one flat array per field (episodes one after another, as one environment's
    ring would hold them), filled episode by episode from :meth:`Dataset.episodes` (the file is
    never in memory twice) and sampled with replacement among the valid window starts. A start
    is valid where a whole window fits and its first step is not ``LAST`` (no transition
    leaves a LAST step: a window there would train on nothing). Windows may cross into the
    next episode, as in a ring; the losses stop at ``LAST`` as they do online.

    ``spec``: field -> ``(shape, numpy dtype)`` of one step (the agent's experience schema:
    observations are cast to it, e.g. float64 to float32); ``cap``: at most this many steps
    (the first ones); ``env_id``: the value of the ``env_id`` field of every row."""

    def __init__(self, dataset: Dataset, spec: Mapping[str, tuple], cap: int | None = None,
                 env_id: int = 0):
        total = dataset.stored_steps if cap is None else min(cap, dataset.stored_steps)
        self.fields = {name: np.empty((total, *shape), dtype) for name, (shape, dtype)
                       in spec.items()}
        filled = 0
        for episode in dataset.episodes():
            if filled >= total:
                break
            steps = episode_steps(episode)
            n = min(len(steps["step_type"]), total - filled)
            for name, array in self.fields.items():
                if name == "env_id":
                    array[filled:filled + n] = env_id
                elif name in steps:
                    array[filled:filled + n] = steps[name][:n]
                else:
                    raise DatasetError(f"dataset {dataset.path}: the agent's experience needs "
                                       f"{name!r}, which a dataset does not hold")
            filled += n
        self.size = filled
        self.fields = {k: v[:filled] for k, v in self.fields.items()}
        self.dataset = dataset
        self._starts_for: dict[int, np.ndarray] = {}

    def starts(self, length: int) -> np.ndarray:
        """Positions where a window of ``length`` steps may start (cached per length)."""
        if length not in self._starts_for:
            last = self.size - length
            types = self.fields["step_type"][:max(last + 1, 0)]
            self._starts_for[length] = np.flatnonzero(types != StepType.LAST)
        return self._starts_for[length]

    def sample(self, count: int, length: int, rng: np.random.Generator
               ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """``count`` windows ``[count, length, ...]`` drawn uniformly with replacement, and
        their start positions."""
        starts = self.starts(length)
        if len(starts) == 0:
            raise DatasetError(f"dataset {self.dataset.path}: no window of {length} steps")
        positions = starts[rng.integers(len(starts), size=count)]
        rows = positions[:, None] + np.arange(length)
        return {k: v[rows] for k, v in self.fields.items()}, positions
