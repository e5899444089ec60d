"""``run.py dataset``: a run's replay contents as a Minari dataset; and the check that a dataset
fits an agent, shared by the graph check and the replay store that loads it.

    python run.py dataset RUN_DIR --to DIR [--id NAME-vN] [--checkpoint CKPT_DIR]

It reads the newest complete checkpoint of the run (or ``--checkpoint``): every replay store's
state (``replay_store.pt``, one per shard), memory-mapped so a large buffer is never loaded
whole, and writes its episodes with :func:`storage.datasets.write_dataset`. The metadata names
the run, the checkpoint, the env (id, kwargs, spec) and the learner's policy version and env
steps at that checkpoint. A user mistake (no such run, no checkpoint, a checkpoint without
replay, an existing ``--to``) is one line and exit code 2.
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


def check_dataset(path: str, agent):
    """Open dataset ``path`` (:class:`storage.datasets.Dataset`) and check it against
    ``agent``: the same env id (when the dataset records one) and, field by field, the
    observation and action dtypes and shapes of the agent's experience schema. Raises
    :class:`storage.datasets.DatasetError` with one line."""
    from nodes._common import experience_schema
    from storage.datasets import Dataset, DatasetError

    if not os.path.isdir(path):
        raise DatasetError(f"dataset {path}: no such directory (make one with run.py dataset "
                           f"RUN_DIR --to {path}; the example graphs' with python "
                           f"bench/datasets.py pendulum)")
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
    ckpt = args.checkpoint or latest_checkpoint(run_dir)
    if ckpt is None or not os.path.isdir(ckpt):
        raise UsageError(f"{run_dir}: no complete checkpoint (a graph with a checkpointer "
                         f"writes one every interval_s and when it stops)")
    replay_files = sorted(f for f in os.listdir(ckpt)
                          if f.startswith("replay_store") and f.endswith(".pt"))
    if not replay_files:
        raise UsageError(f"{ckpt}: no replay_store state (the checkpointer's services must "
                         f"include replay_state)")
    with open(graph_file) as f:
        graph = yaml.safe_load(f) or {}
    agent = graph.get("agent") or {}
    env_id, env_kwargs = agent.get("env_id"), agent.get("env_kwargs") or {}
    if not env_id:
        raise UsageError(f"{graph_file}: no agent.env_id")
    dataset_id = args.dataset_id or _default_id(os.path.basename(os.path.normpath(args.to)))
    learner = _learner_stamp(ckpt)
    metadata = {
        "algorithm_name": str((agent.get("algorithm") or {}).get("name", "")),
        "conduit": {"run_dir": os.path.abspath(run_dir), "checkpoint": os.path.abspath(ckpt),
                    "graph": graph.get("name"), "env_id": env_id, "env_kwargs": env_kwargs,
                    "data_transformers": (agent.get("algorithm") or {}).get(
                        "data_transformers", []),
                    **learner}}
    try:
        written = _write(args.to, ckpt, replay_files, env_id, env_kwargs, dataset_id, metadata)
    except DatasetError as exc:
        raise UsageError(str(exc)) from None
    print(f"wrote {args.to}: {written['total_episodes']} episodes, {written['total_steps']} "
          f"transitions of {env_id} (dataset id {dataset_id}; from {ckpt}, policy version "
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


def _write(to: str, ckpt: str, replay_files: list[str], env_id: str, env_kwargs: dict,
           dataset_id: str, metadata: dict) -> dict:
    import dataclasses

    import gymnasium as gym
    import torch

    from algorithms.envs import env_spaces
    from storage.datasets import episodes_from_ring, write_dataset

    obs_space, action_space = env_spaces(env_id, env_kwargs)
    states = [torch.load(os.path.join(ckpt, f), map_location="cpu", weights_only=True, mmap=True)
              for f in replay_files]
    buffers = [s["buffer"] for s in states if s.get("buffer") and "storage" in s["buffer"]]
    if not buffers:
        raise UsageError(f"{ckpt}: the replay state holds no steps")
    dtypes = {k: v.numpy().dtype for k, v in buffers[0]["storage"].items()}
    # The spaces as the steps were stored: an env whose observation space is float64 stores
    # float32 observations (algorithms.schema), and the dataset says what its arrays are.
    obs_space = _as_stored(obs_space, dtypes["observation"])
    action_space = _as_stored(action_space, dtypes["action"])

    def episodes():
        for buffer in buffers:
            fields = {k: v.numpy() for k, v in buffer["storage"].items()}
            writer = buffer["writer"]
            yield from episodes_from_ring(fields, writer["current_pos"].numpy(),
                                          writer["current_size"].numpy())

    try:
        spec = gym.spec(env_id.split(":")[-1])
        spec = dataclasses.replace(spec, kwargs={**spec.kwargs, **env_kwargs})
    except Exception:  # an env Gymnasium does not know by id: the spaces say enough
        spec = None
    return write_dataset(to, episodes(), obs_space, action_space, dataset_id=dataset_id,
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
