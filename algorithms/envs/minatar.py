"""MinAtar games (10x10 Atari in miniature) as a ``NEXT_STEP`` vector env of uint8 images.

Ids are ``MinAtar/<Game>-v0`` (all six actions) and ``MinAtar/<Game>-v1`` (the game's minimal
action set), the ids the ``minatar`` package registers. Observations are ``[C, 10, 10]`` uint8,
one channel per object kind with values 0 or 255 (the package's bool ``[10, 10, C]`` state, put
channels first for torch convolutions): uint8 images are 0-255 pixels everywhere, so the
networks' one scaling (x / 255) gives MinAtar's 0/1.

The games' own modules are loaded straight from the installed package, without its
``__init__``: that imports matplotlib's pyplot and seaborn for rendering (2.4 s of CPU here, paid
by every node that builds the env's spaces). Sticky actions and seeding, which the package keeps
in its ``Environment`` wrapper, are re-done here in a few lines.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import ModuleType

import gymnasium as gym
import numpy as np

GAMES = {"Asterix": "asterix", "Breakout": "breakout", "Freeway": "freeway",
         "Seaquest": "seaquest", "SpaceInvaders": "space_invaders"}
EXTRA = "minatar"


@dataclass(frozen=True)
class MinAtarOptions:
    """``env_kwargs`` for MinAtar ids (unknown keys are an error)."""

    sticky_action_prob: float = field(default=0.1, metadata={
        "doc": "probability of repeating the previous action (MinAtar's default)"})
    difficulty_ramping: bool = field(default=True, metadata={
        "doc": "games speed up as the episode goes on (MinAtar's default)"})
    max_episode_steps: int | None = field(default=10_000, metadata={
        "doc": "truncate longer episodes (a strong Breakout policy can play forever)"})


def parse_id(env_id: str) -> tuple[str, bool] | None:
    """``(module name, minimal action set)`` for a MinAtar id, None for any other id."""
    if not env_id.startswith("MinAtar/"):
        return None
    name, _, version = env_id[len("MinAtar/"):].rpartition("-")
    if name not in GAMES or version not in ("v0", "v1"):
        raise ValueError(f"unknown MinAtar id {env_id!r} (games: {', '.join(GAMES)}; "
                         "versions v0 = all actions, v1 = minimal action set)")
    return GAMES[name], version == "v1"


def options(env_kwargs: dict) -> MinAtarOptions:
    known = {f.name for f in fields(MinAtarOptions)}
    for key in env_kwargs:
        if key not in known:
            raise ValueError(f"env_kwargs: unknown key {key!r} for MinAtar ids "
                             f"(known: {', '.join(sorted(known))})")
    return MinAtarOptions(**env_kwargs)


def installed() -> bool:
    return importlib.util.find_spec("minatar") is not None


_modules: dict[str, ModuleType] = {}


def _game_module(game: str) -> ModuleType:
    if game not in _modules:
        spec = importlib.util.find_spec("minatar")
        path = Path(next(iter(spec.submodule_search_locations))) / "environments" / f"{game}.py"
        module_spec = importlib.util.spec_from_file_location(f"_conduit_minatar_{game}", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        _modules[game] = module
    return _modules[game]


class MinAtarVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` games stepped in a loop, ``NEXT_STEP`` autoreset (the step after a
    terminated/truncated one resets that game and returns reward 0)."""

    def __init__(self, env_id: str, num_envs: int, opts: MinAtarOptions):
        game, minimal = parse_id(env_id)
        module = _game_module(game)
        self.games = [module.Env(ramping=opts.difficulty_ramping) for _ in range(num_envs)]
        self.action_set = np.asarray(self.games[0].minimal_action_set() if minimal
                                     else range(6), dtype=np.int64)
        self.opts = opts
        self.num_envs = num_envs
        h, w, c = self.games[0].state_shape()
        self.single_observation_space = gym.spaces.Box(0, 255, (c, h, w), np.uint8)
        self.single_action_space = gym.spaces.Discrete(len(self.action_set))
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space,
                                                              num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
        self._rng = np.random.default_rng()
        self._last_action = np.zeros(num_envs, np.int64)
        self._steps = np.zeros(num_envs, np.int64)
        self._needs_reset = np.zeros(num_envs, bool)

    def _observe(self) -> np.ndarray:
        state = np.stack([g.state() for g in self.games]).transpose(0, 3, 1, 2)
        return state.astype(np.uint8) * np.uint8(255)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
            for i, g in enumerate(self.games):
                g.random = np.random.RandomState(seed + i)
        for g in self.games:
            g.reset()
        self._last_action[:] = 0
        self._steps[:] = 0
        self._needs_reset[:] = False
        return self._observe(), {}

    def step(self, actions):
        actions = self.action_set[np.asarray(actions, dtype=np.int64)]
        sticky = self._rng.random(self.num_envs) < self.opts.sticky_action_prob
        actions = np.where(sticky, self._last_action, actions)
        self._last_action = actions
        reward = np.zeros(self.num_envs, np.float32)
        terminated = np.zeros(self.num_envs, bool)
        for i, g in enumerate(self.games):
            if self._needs_reset[i]:
                g.reset()
                self._steps[i] = 0
                self._last_action[i] = 0
            else:
                reward[i], terminated[i] = g.act(int(actions[i]))
                self._steps[i] += 1
        limit = self.opts.max_episode_steps
        truncated = (self._steps >= limit) & ~terminated if limit else np.zeros_like(terminated)
        self._needs_reset = terminated | truncated
        return self._observe(), reward, terminated, truncated, {}

    def close(self, **kwargs):
        self.games = []
