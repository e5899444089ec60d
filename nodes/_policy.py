"""The policy a run trained, without ZeroMQ or a running graph: :func:`load_policy`,
:class:`Policy`, the export. The public names are re-exported by the top-level ``conduit``
module (``from conduit import load_policy``); ``run.py play``/``export`` use them here."""

from __future__ import annotations

import dataclasses
import io
import json
import os
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import typedconfig
from algorithms.steps import StepType, TimeStep, batch_size_of, observation_array
from nodes._agent import Agent
from nodes._common import make_algorithm
from nodes.evaluator import BEST, POLICY_FILE, REACHED
from pipeline import graphyaml, kinds
from pipeline.wiring import latest_checkpoint

__all__ = ["OneEnv", "Policy", "PolicyError", "load_exported", "load_policy"]

FINAL = "final"
WHICH = (BEST, REACHED, FINAL)
# The exported file's record (observation, state, where the parameters came from), read with
# torch.export.load(path, extra_files={EXPORT_INFO: ""}).
EXPORT_INFO = "conduit.json"


class PolicyError(ValueError):
    """The run directory or ``which`` holds no policy (no such directory, no best policy
    yet, an unknown ``which``): a one-line message for the user."""


def load_policy(run_dir: str, which: str = BEST, device: str = "cpu") -> Policy:
    """The policy ``which`` of the run in ``run_dir``, on ``device`` (``cpu``, ``cuda``,
    ``auto``). Raises :class:`PolicyError` with one line when there is none."""
    agent = read_agent(run_dir)
    if agent.is_random:
        raise PolicyError(f"{run_dir}: the agent is {agent.algorithm.name!r}, which has no "
                          f"parameters to load")
    path, state = _policy_file(run_dir, which)
    alg = make_algorithm(agent, device)
    params, info = _policy_params(state, alg, path)
    try:
        alg.load_policy_state_dict(params)
    except (RuntimeError, ValueError, KeyError) as exc:
        raise PolicyError(f"{path}: does not fit the agent in {run_dir}/graph.yaml: "
                          f"{_first_line(exc)}") from None
    info = {"which": which, "path": path, **info}
    return Policy(PolicyModule(alg), agent, info)


def read_agent(run_dir: str) -> Agent:
    """The ``agent:`` section of the run's ``graph.yaml``, built as the graph loader builds
    it (its env id checked against what is installed)."""
    from algorithms.envs import check_env_id

    if not os.path.isdir(run_dir):
        raise PolicyError(f"no run directory at {run_dir}")
    path = os.path.join(run_dir, "graph.yaml")
    if not os.path.exists(path):
        raise PolicyError(f"{run_dir} has no graph.yaml: not a run directory")
    with open(path) as f:
        try:
            data, _ = graphyaml.read(f.read(), path)
        except graphyaml.GraphError as exc:
            raise PolicyError(str(exc)) from None
    if not isinstance(data, dict) or "agent" not in data:
        raise PolicyError(f"{path}: no agent: section (a run of a graph written before it)")
    try:
        # The graph's imports: register its own envs, as they did for the run (from the
        # working directory, as run.py imports them).
        kinds.import_modules(data.get("imports") or ())
        agent = typedconfig.build(Agent, data["agent"], "agent")
        check_env_id(agent.env_id, agent.env_kwargs)
    except (ValueError, kinds.ImportFailed) as exc:  # typedconfig.ConfigError included
        raise PolicyError(f"{path}: {exc}") from None
    return agent


def _policy_file(run_dir: str, which: str) -> tuple[str, dict]:
    """``(path, contents)`` of the file that holds the policy ``which``."""
    if which in (BEST, REACHED):
        path = os.path.join(run_dir, which, POLICY_FILE)
        if not os.path.exists(path):
            raise PolicyError(
                f"no {which} policy in {run_dir} yet: the evaluator writes {which}/ "
                + ("when an evaluation beats the best so far" if which == BEST else
                   "when an evaluation reaches its stop_at_return"))
    elif which == FINAL:
        checkpoint = latest_checkpoint(run_dir)
        if checkpoint is None:
            raise PolicyError(f"no complete checkpoint in {run_dir}/checkpoints")
        path = os.path.join(checkpoint, "learner.pt")
        if not os.path.exists(path):
            raise PolicyError(f"{checkpoint} has no learner.pt")
    elif os.path.isdir(which):
        found = [os.path.join(which, name) for name in (POLICY_FILE, "learner.pt")
                 if os.path.exists(os.path.join(which, name))]
        if not found:
            raise PolicyError(f"{which} holds neither {POLICY_FILE} nor learner.pt")
        path = found[0]
    elif os.path.isfile(which):
        path = which
    else:
        raise PolicyError(f"which: expected {', '.join(WHICH)} or a path to a policy; "
                          f"{which!r} is none of them")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or foreign file: say which one
        raise PolicyError(f"cannot load {path}: {type(exc).__name__}: "
                          f"{_first_line(exc)}") from None
    return path, state


def _policy_params(state: Any, alg, path: str) -> tuple[dict, dict]:
    """The policy's tensors in ``state`` (an evaluator's kept policy, or a learner's or
    unroller's checkpoint state) and what is known about them."""
    if isinstance(state, dict) and "policy" in state:  # nodes.evaluator.keep_policy
        return state["policy"], dict(state.get("info") or {})
    module = state.get("algorithm", {}).get("module") if isinstance(state, dict) else None
    if module is None:
        raise PolicyError(f"{path}: neither a kept policy nor a learner's or unroller's "
                          f"checkpoint state")
    # The checkpoint holds the whole algorithm (target networks, critics, counters); acting
    # needs the modules of policy_state_dict(), under the same names.
    wanted = alg.policy_state_dict()
    missing = [k for k in wanted if k not in module]
    if missing:
        raise PolicyError(f"{path}: does not fit the agent in graph.yaml (no {missing[0]})")
    info = {k: int(state[k]) for k in ("env_steps", "version") if k in state}
    return {k: module[k] for k in wanted}, info


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0]


class PolicyModule(nn.Module):
    """An algorithm's acting, as one module from raw observations to actions.

    ``forward(observation [B, ...], first [B] bool, state) -> (action [B, ...], state)``:
    ``first`` marks the rows whose episode starts at this observation; ``state`` is a tuple of
    ``[B, ...]`` tensors (each frame stacker's previous frames, then a recurrent policy's
    core state; ``()`` for a feed-forward policy without frame stacking), zeros at the start
    (:meth:`initial_state`), which ``first`` resets in any case. Box actions are clipped to the
    action space's bounds, as the env runners clip them. The same module acts in
    :meth:`Policy.act` and is what ``Policy.export`` writes, so both act alike.

    Why not the algorithm's ``predict_step`` on raw observations: its frame stacker keeps the
    history inside the algorithm, per env id (how the evaluator uses it). Here the data
    transformers run with explicit state (``transform_timestep(time_step, state)``), and
    ``predict_step`` runs on a copy of the algorithm built without transformers for the
    transformed observation space (the same networks, the same parameters).
    """

    def __init__(self, alg):
        super().__init__()
        self.observation_space = alg.observation_space
        self.action_space = alg.action_space
        self.transformer = alg.data_transformer  # None, or the transformers with statistics
        self.acting = _acting_copy(alg)
        # A Dict space's observation is a dict of tensors here too (dtype per key).
        self.observation_dtype = _map(lambda a: a.dtype,
                                      observation_array(self.observation_space.sample()))
        self.bounded = hasattr(self.action_space, "low")
        if self.bounded:
            self.register_buffer("low", torch.as_tensor(self.action_space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(self.action_space.high,
                                                         dtype=torch.float32))
        # Which transformers carry a state (frame stackers), and the state's shapes, from one
        # step on a sample observation.
        first = torch.ones(1, dtype=torch.bool, device=alg.device)
        ts = self._time_step(self._sample_observation(1), first)
        transformer_state = ()
        if self.transformer is not None:
            _, transformer_state = self.transformer.transform_timestep(
                ts, self.transformer.get_initial_state(1))
        self.stateful = tuple(i for i, s in enumerate(transformer_state)
                              if isinstance(s, torch.Tensor))
        core = self.acting.get_initial_state(1)
        self.recurrent = isinstance(core, torch.Tensor)
        states = [transformer_state[i] for i in self.stateful] + ([core] if self.recurrent else [])
        self.state_specs = [(tuple(s.shape[1:]), s.dtype) for s in states]

    @property
    def device(self) -> torch.device:
        return self.acting.device

    def initial_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        """The state before any observation: zeros (``first`` resets every row anyway)."""
        return tuple(torch.zeros(batch_size, *shape, dtype=dtype, device=self.device)
                     for shape, dtype in self.state_specs)

    def forward(self, observation: torch.Tensor, first: torch.Tensor,
                state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, tuple]:
        """Greedy actions (``predict_step``)."""
        ts, transformer_state, core = self._transformed(observation, first, state)
        step = self.acting.predict_step(ts, core)
        return self._clipped(step.output), self._state(transformer_state, step.state)

    @torch.no_grad()
    def sample(self, observation: torch.Tensor, first: torch.Tensor,
               state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, tuple]:
        """Exploring actions (``rollout_step``: the algorithm's own exploration, at the
        env steps its parameters were trained to)."""
        ts, transformer_state, core = self._transformed(observation, first, state)
        step = self.acting.rollout_step(ts, core)
        return self._clipped(step.output), self._state(transformer_state, step.state)

    def _transformed(self, observation, first, state):
        transformer_state: tuple = ()
        if self.transformer is not None:
            slots: list = [()] * len(self.transformer.transformers)
            for slot, s in zip(self.stateful, state, strict=False):
                slots[slot] = s
            transformer_state = tuple(slots)
        core = state[len(self.stateful)] if self.recurrent else ()
        ts = self._time_step(observation, first)
        if self.transformer is not None:
            ts, transformer_state = self.transformer.transform_timestep(ts, transformer_state)
        return ts, transformer_state, core

    def _state(self, transformer_state, core) -> tuple:
        return tuple(transformer_state[i] for i in self.stateful) + \
            ((core,) if self.recurrent else ())

    @staticmethod
    def _time_step(observation, first: torch.Tensor) -> TimeStep:
        b = batch_size_of(observation)
        # Rewards only matter to reward transformers, which acting does not use.
        return TimeStep(step_type=torch.where(first, int(StepType.FIRST), int(StepType.MID)),
                        reward=torch.zeros(b, device=first.device),
                        discount=torch.ones(b, device=first.device),
                        observation=observation)

    def _clipped(self, action: torch.Tensor) -> torch.Tensor:
        if not self.bounded:
            return action
        return torch.minimum(torch.maximum(action, self.low), self.high)

    def _sample_observation(self, batch_size: int):
        samples = [observation_array(self.observation_space.sample()) for _ in range(batch_size)]
        if isinstance(samples[0], dict):
            return {k: torch.as_tensor(np.stack([s[k] for s in samples]), device=self.device)
                    for k in samples[0]}
        return torch.as_tensor(np.stack(samples), device=self.device)


def _acting_copy(alg):
    """``alg`` without data transformers, for the observations they make, holding the
    parameters of the modules acting needs (those of ``policy_state_dict()``) and no others'.

    Why the others go: ``torch.export`` keeps every parameter of the module it exports, and
    target networks and critics are most of them (SAC's actor is a tenth of the algorithm)."""
    import algorithms

    config = dataclasses.replace(alg.config, data_transformers=[])
    acting = algorithms.make(config, alg.input_space, alg.action_space, device=alg.device)
    params = {k: v for k, v in alg.policy_state_dict().items()
              if not k.startswith("data_transformer.")}
    acting.load_policy_state_dict(params)
    needed = {k.split(".", 1)[0] for k in params}
    for name, child in list(acting.named_children()):
        if name not in needed and child.state_dict():  # parameter-less ones cost nothing
            setattr(acting, name, None)
    return acting.eval()


class Policy:
    """A trained policy: observations in, the actions the algorithm takes out.

    ``agent`` is the run's agent (env id and kwargs, the algorithm's config); ``info`` says
    where the parameters came from (``which``, ``path``, ``env_steps``, ``version``, and for
    an evaluator's policy its ``mean_return``)."""

    def __init__(self, module: PolicyModule, agent: Agent, info: dict):
        self.module = module.eval()
        self.agent = agent
        self.info = info
        self.observation_space = module.observation_space
        self.action_space = module.action_space
        env_steps = int(info.get("env_steps", 0))
        # Exploration schedules (DQN's epsilon, random warm-up steps) read the env steps.
        module.acting.load_state_dict(
            {"rollout_env_steps": torch.tensor(env_steps, dtype=torch.int64)}, strict=False)

    @property
    def recurrent(self) -> bool:
        """The policy has a recurrent core (PPO with ``rnn_size``)."""
        return self.module.recurrent

    def initial_state(self, batch_size: int = 1) -> tuple[torch.Tensor, ...]:
        return self.module.initial_state(batch_size)

    def act(self, observation, state: tuple | None = None, deterministic: bool = True,
            episode_start=None) -> tuple[Any, tuple]:
        """The action for ``observation`` (one observation, or a batch ``[B, ...]``) and the
        state to pass with the next observation of the same episodes.

        ``state`` None: every observation starts an episode; else the state the previous
        ``act`` returned, and ``episode_start`` (``[B]`` bools, default all False) marks the
        rows whose episode starts here (a vector env's resets). ``deterministic``: the greedy
        action (``predict_step``, as the evaluator acts), else the algorithm's exploring one
        (``rollout_step``). Returns numpy: an action for one observation, ``[B, ...]`` for a
        batch; Box actions clipped to the bounds."""
        obs, single = _batched_observation(observation, self.observation_space)
        b = batch_size_of(obs)
        device = self.module.device
        if state is None:
            state = self.initial_state(b)
            first = torch.ones(b, dtype=torch.bool, device=device)
        else:
            first = torch.zeros(b, dtype=torch.bool, device=device) if episode_start is None \
                else torch.as_tensor(np.asarray(episode_start, bool).reshape(b), device=device)
        x = _map(lambda a, dtype: torch.as_tensor(a.astype(dtype, copy=False), device=device),
                 obs, self.module.observation_dtype)
        with torch.no_grad():
            action, state = (self.module(x, first, state) if deterministic else
                             self.module.sample(x, first, state))
        action = action.cpu().numpy()
        return (action[0] if single else action), state

    def make_env(self, render_mode: str | None = None) -> gym.Env:
        """One env of the agent's, as the evaluator makes it (:func:`algorithms.envs.make_env`:
        the same observations, Atari and MinAtar preprocessing included), as a
        ``gymnasium.Env``; ``render_mode`` (``rgb_array``, ``human``) for Gymnasium ids only."""
        from algorithms.envs import atari, make_env, minatar

        env_id, env_kwargs = self.agent.env_id, dict(self.agent.env_kwargs)
        if render_mode is not None:
            if atari.parse_id(env_id) is not None or minatar.parse_id(env_id) is not None:
                raise PolicyError(f"{env_id} steps in Conduit's own vector env, which draws no "
                                  f"frames (render_mode: Gymnasium ids only)")
            env_kwargs["render_mode"] = render_mode
        return OneEnv(make_env(env_id, 1, None, env_kwargs, training=False))

    def export(self, path: str) -> str:
        """Write the greedy policy to ``path`` as a ``torch.export`` program that loads with
        torch alone (:func:`load_exported`); returns ``path``."""
        module = self.module
        example = (module._sample_observation(2),
                   torch.tensor([True, False], device=module.device), module.initial_state(2))
        batch = torch.export.Dim("batch")
        dynamic = (_map(lambda _: {0: batch}, example[0]), {0: batch},
                   tuple({0: batch} for _ in example[2]))
        with torch.no_grad():
            program = torch.export.export(module, example, dynamic_shapes=dynamic, strict=False)
        record = {
            "observation_shape": _map(lambda space: list(space.shape),
                                      _spaces(self.observation_space)),
            "observation_dtype": _map(str, module.observation_dtype),
            "state": [{"shape": list(shape), "dtype": str(dtype).removeprefix("torch.")}
                      for shape, dtype in module.state_specs],
            "recurrent": module.recurrent, "env_id": self.agent.env_id,
            "env_kwargs": self.agent.env_kwargs, "algorithm": self.agent.algorithm.name,
            "policy": {k: v for k, v in self.info.items() if _plain(v)}}
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        buffer = io.BytesIO()
        torch.export.save(program, buffer, extra_files={EXPORT_INFO: json.dumps(record)})
        with open(path + ".tmp", "wb") as f:  # all of it or nothing at path
            f.write(buffer.getvalue())
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
        return path


class OneEnv(gym.Env):
    """The one env of a ``NEXT_STEP`` vector env as a ``gymnasium.Env`` (what ``RecordVideo``
    wraps): each episode starts with ``reset``, never with the vector env's autoreset step; Box
    actions are clipped to the bounds, as the env runners clip them."""

    def __init__(self, vector: gym.vector.VectorEnv):
        self.vector = vector
        self.observation_space = vector.single_observation_space
        self.action_space = vector.single_action_space
        self.render_mode = getattr(vector, "render_mode", None)
        self.metadata = dict(vector.metadata)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, _ = self.vector.reset(seed=seed)
        return _map(lambda a: a[0], obs), {}

    def step(self, action):
        action = np.asarray(action)
        if isinstance(self.action_space, gym.spaces.Box):
            action = np.clip(action, self.action_space.low, self.action_space.high)
        obs, reward, terminated, truncated, info = self.vector.step(action[None])
        info = {k: v[0] for k, v in info.items() if k == "is_success"}  # goal envs' verdict
        return (_map(lambda a: a[0], obs), float(reward[0]), bool(terminated[0]),
                bool(truncated[0]), info)

    def render(self):
        frames = self.vector.render()
        return None if frames is None else frames[0]

    def close(self):
        self.vector.close()


def load_exported(path: str):
    """``(module, record)`` of a file :meth:`Policy.export` wrote: ``module(observation,
    first, state) -> (action, state)`` as :class:`PolicyModule`, ``record`` its JSON record
    (observation shape and dtype, the state's shapes and dtypes). Needs torch alone:
    ``torch.export.load(path, extra_files={"conduit.json": ""}).module()`` is the same."""
    extra = {EXPORT_INFO: ""}
    program = torch.export.load(path, extra_files=extra)
    return program.module(), json.loads(extra[EXPORT_INFO])


def _map(fn, value, *more):
    """``fn`` of ``value`` (and the matching ``more``), per key where ``value`` is a dict:
    a Dict space's observation is handled key by key, an array one at once."""
    if isinstance(value, dict):
        return {k: fn(v, *(m[k] for m in more)) for k, v in value.items()}
    return fn(value, *more)


def _spaces(space: gym.Space):
    return dict(space.spaces) if isinstance(space, gym.spaces.Dict) else space


def _batched_observation(observation, space: gym.Space) -> tuple[Any, bool]:
    """``(observation as [B, ...] numpy arrays, whether one observation was given)``: a dict
    for a ``Dict`` space (its keys, each shaped as the space says). Raises ``ValueError``
    naming what does not fit."""
    def array(x):
        return observation_array(x.cpu().numpy() if isinstance(x, torch.Tensor)
                                 else np.asarray(x))

    if isinstance(space, gym.spaces.Dict):
        if not isinstance(observation, dict):
            raise ValueError(f"observation: expected a dict with keys "
                             f"{', '.join(space.spaces)}, got {type(observation).__name__}")
        missing = [k for k in space.spaces if k not in observation]
        if missing:
            raise ValueError(f"observation: no key {missing[0]!r} (expected "
                             f"{', '.join(space.spaces)})")
        obs = {k: array(observation[k]) for k in space.spaces}
        shapes = {k: tuple(sub.shape) for k, sub in space.spaces.items()}
    else:
        obs, shapes = array(observation), tuple(space.shape)
    given = _map(lambda a: tuple(a.shape), obs)
    single = _map(lambda a, shape: a.ndim == len(shape), obs, shapes)
    single = all(single.values()) if isinstance(single, dict) else single
    if single:
        obs = _map(lambda a: a[None], obs)
    checks = ([(f"observation[{k!r}]", obs[k], shapes[k], given[k]) for k in obs]
              if isinstance(obs, dict) else [("observation", obs, shapes, given)])
    for where, a, shape, got in checks:
        if tuple(a.shape[1:]) != shape:
            raise ValueError(f"{where}: expected shape {shape} or [B, *{shape}], got {got}")
    return obs, single


def _plain(value) -> bool:
    return value is None or isinstance(value, bool | int | float | str)
