"""``run.py dataset``: a run's replay contents as a Minari dataset; and the check that a dataset
fits an agent, shared by the graph check and the replay store that loads it.

    python run.py dataset RUN_DIR --to DIR [--id NAME-vN] [--checkpoint CKPT_DIR] [--replay-files]

It reads the newest complete checkpoint of the run (or ``--checkpoint``): every replay store's
state (``replay_store.pt``, one per shard), memory-mapped so a large buffer is never loaded
whole, and writes its episodes with :func:`storage.datasets.write_dataset`. The metadata names
the run, the checkpoint, the env (id, kwargs, spec) and the learner's policy version and env
steps at that checkpoint. ``--replay-files`` (the default without a checkpoint) reads the
memory-mapped replay a stopped run left in its stores' ``storage_dir`` instead
(:func:`storage.datasets.ring_files`). A user mistake (no such run, no checkpoint, a checkpoint
without replay, replay files still held by a running store, an existing ``--to``) is one line
and exit code 2.
"""

from __future__ import annotations

import os
import re

from pipeline.cli import EXIT_OK, UsageError, register_command
from pipeline.kinds import register_graph_check
from typedconfig import ConfigError

_ID = re.compile(r"^[-_\w]+-v\d+$")


@register_graph_check
def datasets_fit_the_graph(graph) -> None:
    """A replay store's datasets agree with its inputs: an offline store (no ``experience``)
    samples only its datasets and has nothing to rate-limit against; a hybrid one must leave
    room in each batch for the experience it subscribes to."""
    for name, spec in graph.nodes.items():
        if spec.kind != "replay_store" or not graph.configs[name].datasets:
            continue
        config, key = graph.configs[name], f"nodes.{name}.config"
        if "experience" in spec.subscribes:
            if config.offline_share >= 1.0:
                raise ConfigError(f"{key}.offline_share", "is 1.0, so the experience this "
                                  "store subscribes to is never sampled: set it below 1 "
                                  "(hybrid) or drop the experience input (offline)")
        else:
            if config.offline_share < 1.0:
                raise ConfigError(f"{key}.offline_share", f"is {config.offline_share} but "
                                  f"{name} has no experience input to draw the rest from: "
                                  f"set 1.0 (offline) or subscribe it to experience")
            if config.samples_per_insert is not None:
                raise ConfigError(f"{key}.samples_per_insert", "nothing is inserted in an "
                                  "offline graph (no experience input): remove it")


def missing_dataset(path: str) -> str:
    """The one line for a dataset directory that does not exist, with how to make it."""
    return (f"dataset {path}: no such directory (make one with run.py dataset RUN_DIR --to "
            f"{path}; the example graphs' with python bench/datasets.py pendulum or "
            f"halfcheetah)")


def check_dataset(path: str, agent):
    """Open dataset ``path`` (:class:`storage.datasets.Dataset`) and check it against
    ``agent``: the same env id (when the dataset records one) and, field by field, the
    observation and action dtypes and shapes of the agent's experience schema. Raises
    :class:`storage.datasets.DatasetError` with one line."""
    from nodes._common import experience_schema
    from storage.datasets import Dataset, DatasetError

    if not os.path.isdir(path):
        raise DatasetError(missing_dataset(path))
    dataset = Dataset(path)
    if dataset.env_id is not None and agent.env_id != dataset.env_id and \
            agent.env_id.split(":")[-1] != dataset.env_id:
        raise DatasetError(f"dataset {path} was recorded on {dataset.env_id}, the agent's "
                           f"env_id is {agent.env_id}")
    schema = experience_schema(agent).fields
    for name, space, field in (("observations", dataset.observation_space, "observation"),
                               ("actions", dataset.action_space, "action")):
        want = schema[field]
        discrete = hasattr(space, "n") and not space.shape
        got_shape = () if discrete else tuple(space.shape)
        got_dtype = "int64" if discrete else space.dtype.name
        if got_shape != tuple(want.shape) or got_dtype != want.dtype:
            raise DatasetError(f"dataset {path}: {name} are {got_dtype}{list(got_shape)}, "
                               f"{agent.env_id} with {agent.algorithm.name} needs {want}")
    return dataset


# --- run.py dataset --------------------------------------------------------------------------


def _arguments(p) -> None:
    p.add_argument("run_dir", help="a run directory (runs/<graph>/<time>) with a checkpoint")
    p.add_argument("--to", required=True, metavar="DIR",
                   help="the dataset directory to write (name it as its id, e.g. "
                        "datasets/pendulum-sac-v0, for minari.load_dataset)")
    p.add_argument("--id", dest="dataset_id", metavar="NAME-vN",
                   help="the Minari dataset id (default: DIR's name, with -v0 added if it has "
                        "no version)")
    p.add_argument("--checkpoint", metavar="CKPT_DIR",
                   help="a checkpoint directory of the run (default: the newest complete one)")
    p.add_argument("--replay-files", action="store_true",
                   help="read the memory-mapped replay files of a stopped run (its replay "
                        "stores' storage_dir) instead of a checkpoint: everything stored up "
                        "to the stop, also after a crash (default when there is no checkpoint)")


def make_dataset(args) -> int:
    """Write the replay contents of a run's checkpoint as a Minari dataset."""
    import yaml

    from pipeline.wiring import latest_checkpoint
    from storage.datasets import DatasetError

    run_dir = args.run_dir
    graph_file = os.path.join(run_dir, "graph.yaml")
    if not os.path.isdir(run_dir):
        raise UsageError(f"{run_dir}: no such run directory")
    if not os.path.exists(graph_file):
        raise UsageError(f"{run_dir}: no graph.yaml (not a run directory)")
    with open(graph_file) as f:
        graph = yaml.safe_load(f) or {}
    ckpt = args.checkpoint or latest_checkpoint(run_dir)
    storage_dirs = [os.path.join(run_dir, node["config"]["storage_dir"])
                    for node in (graph.get("nodes") or {}).values()
                    if node.get("kind") == "replay_store"
                    and (node.get("config") or {}).get("storage_dir")]
    use_files = args.replay_files or (ckpt is None and not args.checkpoint and any(
        os.path.exists(os.path.join(d, "layout.json")) for d in storage_dirs))
    replay_files: list[str] = []
    if use_files:
        storage_dirs = [d for d in storage_dirs if os.path.exists(os.path.join(d, "layout.json"))]
        if not storage_dirs:
            raise UsageError(f"{run_dir}: no memory-mapped replay files (no replay store with "
                             f"a storage_dir that holds a layout.json)")
    else:
        if ckpt is None or not os.path.isdir(ckpt):
            raise UsageError(f"{run_dir}: no complete checkpoint (a graph with a checkpointer "
                             f"writes one every interval_s and when it stops)")
        replay_files = sorted(f for f in os.listdir(ckpt)
                              if f.startswith("replay_store") and f.endswith(".pt"))
        if not replay_files:
            raise UsageError(f"{ckpt}: no replay_store state (the checkpointer's services must "
                             f"include replay_state)")
    agent = graph.get("agent") or {}
    env_id, env_kwargs = agent.get("env_id"), agent.get("env_kwargs") or {}
    if not env_id:
        raise UsageError(f"{graph_file}: no agent.env_id")
    dataset_id = args.dataset_id or _default_id(os.path.basename(os.path.normpath(args.to)))
    learner = _learner_stamp(ckpt) if ckpt else {"policy_version": None, "env_steps": None}
    source = storage_dirs if use_files else ckpt
    metadata = {
        "algorithm_name": str((agent.get("algorithm") or {}).get("name", "")),
        "conduit": {"run_dir": os.path.abspath(run_dir),
                    "checkpoint": None if use_files else os.path.abspath(ckpt),
                    "replay_files": [os.path.abspath(d) for d in storage_dirs] if use_files
                    else None,
                    "graph": graph.get("name"), "env_id": env_id, "env_kwargs": env_kwargs,
                    "data_transformers": (agent.get("algorithm") or {}).get(
                        "data_transformers", []),
                    **learner}}
    try:
        written = _write(args.to, ckpt, replay_files, env_id, env_kwargs, dataset_id, metadata,
                         storage_dirs if use_files else None)
    except DatasetError as exc:
        raise UsageError(str(exc)) from None
    print(f"wrote {args.to}: {written['total_episodes']} episodes, {written['total_steps']} "
          f"transitions of {env_id} (dataset id {dataset_id}; from {source}, policy version "
          f"{learner.get('policy_version')})")
    return EXIT_OK


def _default_id(name: str) -> str:
    name = re.sub(r"[^-_\w]", "-", name) or "dataset"
    return name if _ID.match(name) else f"{name}-v0"


def _learner_stamp(ckpt: str) -> dict:
    """The learner's version and env steps at this checkpoint (none if it holds no learner)."""
    import torch

    path = os.path.join(ckpt, "learner.pt")
    if not os.path.exists(path):
        return {"policy_version": None, "env_steps": None}
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return {"policy_version": int(state.get("version", 0)),
            "env_steps": int(state.get("env_steps", 0))}


def _write(to: str, ckpt: str | None, replay_files: list[str], env_id: str, env_kwargs: dict,
           dataset_id: str, metadata: dict, storage_dirs: list[str] | None) -> dict:
    import contextlib
    import dataclasses

    import gymnasium as gym
    import torch

    from algorithms.envs import env_spaces
    from storage.datasets import episodes_from_ring, ring_files, write_dataset

    obs_space, action_space = env_spaces(env_id, env_kwargs)
    if isinstance(obs_space, gym.spaces.Dict):
        raise UsageError(f"{env_id}: Dict observations ({', '.join(obs_space.spaces)}) cannot "
                         f"be written as a dataset yet: a dataset holds one observation array "
                         f"(docs/offline.md)")
    with contextlib.ExitStack() as stack:
        if storage_dirs is not None:  # memory-mapped files, each held against writers
            rings = [stack.enter_context(ring_files(d)) for d in storage_dirs]
        else:
            states = [torch.load(os.path.join(ckpt, f), map_location="cpu", weights_only=True,
                                 mmap=True) for f in replay_files]
            rings = [({k: v.numpy() for k, v in s["buffer"]["storage"].items()},
                      s["buffer"]["writer"]["current_pos"].numpy(),
                      s["buffer"]["writer"]["current_size"].numpy())
                     for s in states if s.get("buffer") and "storage" in s["buffer"]]
        if not rings:
            raise UsageError(f"{ckpt}: the replay state holds no steps")
        # The spaces as the steps were stored: an env whose observation space is float64
        # stores float32 observations (algorithms.schema); the dataset says what its arrays are.
        obs_space = _as_stored(obs_space, rings[0][0]["observation"].dtype)
        action_space = _as_stored(action_space, rings[0][0]["action"].dtype)
        episodes = (episode for ring in rings for episode in episodes_from_ring(*ring))
        try:
            spec = gym.spec(env_id.split(":")[-1])
            spec = dataclasses.replace(spec, kwargs={**spec.kwargs, **env_kwargs})
        except Exception:  # an env Gymnasium does not know by id: the spaces say enough
            spec = None
        return write_dataset(to, episodes, obs_space, action_space, dataset_id=dataset_id,
                             env_spec=spec, metadata=metadata)


def _as_stored(space, dtype):
    import gymnasium as gym
    import numpy as np

    if isinstance(space, gym.spaces.Box) and space.dtype != np.dtype(dtype):
        return gym.spaces.Box(space.low.astype(dtype), space.high.astype(dtype), space.shape,
                              dtype=dtype)
    return space


register_command("dataset", "write a run's replay contents as a Minari dataset (offline RL)",
                 _arguments, make_dataset)
