"""Atari 2600 games with the standard DQN preprocessing, as a ``NEXT_STEP`` vector env.

Ids: ``ALE/<Game>-v5`` (sticky actions with probability 0.25, as Gymnasium's v5 ids) and
``<Game>NoFrameskip-v4`` (no sticky actions). Whatever the id, frame skipping is ours
(``frame_skip``), not the id's.

Two backends step the games in C++ and preprocess there (no-op starts, frame skip with a max over
the last two frames, 84x84 grayscale, fire on reset): ale-py's own vector env (``backend: ale``,
the ``[atari]`` extra; its wheel ships the ROMs) and EnvPool (``backend: envpool``, where it is
installed). Both run with episodic life and reward clipping off: :class:`AtariEnv` does those two
in numpy on top, the same way for both backends, because the two libraries differ there (ale-py's
episodic life restarts the whole game at a life loss) and because the raw game score must
survive for the episode metrics.

Observations are single ``[1, H, W]`` uint8 frames; stacking the last k frames is the replay
store's and the acting policy's business, so each frame crosses the wire once.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field, fields

import gymnasium as gym
import numpy as np

EXTRA = "atari"
BACKENDS = ("ale", "envpool")


@dataclass(frozen=True)
class AtariOptions:
    """``env_kwargs`` for Atari ids (unknown keys are an error). ``episodic_life`` and
    ``clip_rewards`` apply to training envs only; evaluation plays whole games for the raw
    score."""

    backend: str = field(default="ale", metadata={"doc": "ale (ale-py) or envpool"})
    noop_max: int = field(default=30, metadata={"doc": "up to this many no-ops after a reset"})
    frame_skip: int = field(default=4, metadata={
        "doc": "emulator frames per action; the frame seen is the max of the last two"})
    screen_size: int = field(default=84, metadata={"doc": "observations are screen_size^2"})
    grayscale: bool = field(default=True, metadata={"doc": "False: RGB [H, W, 3] frames"})
    episodic_life: bool = field(default=True, metadata={
        "doc": "training: a lost life ends the episode for the learner (discount 0) while the "
               "game goes on; episode metrics still report whole games"})
    fire_reset: bool = field(default=True, metadata={
        "doc": "press FIRE after a reset in games that need it to start"})
    clip_rewards: bool = field(default=True, metadata={
        "doc": "training: rewards become their sign; metrics report the raw score"})
    repeat_action_probability: float | None = field(default=None, metadata={
        "doc": "sticky actions; None: 0.25 for ALE/...-v5 ids, 0 for NoFrameskip-v4 ids"})
    full_action_space: bool = field(default=False, metadata={"doc": "all 18 actions"})
    max_episode_frames: int = field(default=108_000, metadata={
        "doc": "truncate a game after this many emulator frames (30 minutes)"})
    num_threads: int = field(default=1, metadata={
        "doc": "backend threads stepping this runner's games"})


_V5 = re.compile(r"^ALE/([A-Za-z]+)-v5$")
_V4 = re.compile(r"^([A-Za-z]+)NoFrameskip-v4$")


def parse_id(env_id: str) -> tuple[str, float] | None:
    """``(game name in CamelCase, default sticky-action probability)``, None if not Atari."""
    if m := _V5.match(env_id):
        return m.group(1), 0.25
    if m := _V4.match(env_id):
        return m.group(1), 0.0
    return None


def rom_name(game: str) -> str:
    """``SpaceInvaders`` -> ``space_invaders`` (ale-py's ROM names)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", game).lower()


def options(env_kwargs: dict) -> AtariOptions:
    known = {f.name for f in fields(AtariOptions)}
    for key in env_kwargs:
        if key not in known:
            raise ValueError(f"env_kwargs: unknown key {key!r} for Atari ids "
                             f"(known: {', '.join(sorted(known))})")
    opts = AtariOptions(**env_kwargs)
    if opts.backend not in BACKENDS:
        raise ValueError(f"env_kwargs: backend {opts.backend!r} is not one of "
                         f"{', '.join(BACKENDS)}")
    return opts


def check(env_id: str, opts: AtariOptions) -> None:
    """Raise a one-line ValueError if the backend is missing or the game unknown."""
    game, _ = parse_id(env_id)
    if opts.backend == "envpool":
        if importlib.util.find_spec("envpool") is None:
            raise ValueError(f"{env_id} with backend envpool needs EnvPool: pip install -e '.[envpool]'")
        return
    if importlib.util.find_spec("ale_py") is None:
        raise ValueError(f"{env_id} needs the [{EXTRA}] extra: pip install -e '.[{EXTRA}]'")
    from ale_py import roms

    if rom_name(game) not in roms.get_all_rom_ids():
        raise ValueError(f"{env_id}: ale-py has no ROM named {rom_name(game)!r}")


def _backend(env_id: str, num_envs: int, seed: int | None, opts: AtariOptions):
    """The backend's vector env, preprocessing on, episodic life and clipping off."""
    game, sticky = parse_id(env_id)
    if opts.repeat_action_probability is not None:
        sticky = opts.repeat_action_probability
    if opts.backend == "envpool":
        import envpool

        return envpool.make_gymnasium(
            f"{game}-v5", num_envs=num_envs, batch_size=num_envs, num_threads=opts.num_threads,
            seed=0 if seed is None else seed, stack_num=1, frame_skip=opts.frame_skip,
            noop_max=opts.noop_max, img_height=opts.screen_size, img_width=opts.screen_size,
            gray_scale=opts.grayscale, episodic_life=False, reward_clip=False,
            use_fire_reset=opts.fire_reset, repeat_action_probability=sticky,
            full_action_space=opts.full_action_space,
            max_episode_steps=opts.max_episode_frames // opts.frame_skip)
    from ale_py import AtariVectorEnv

    return AtariVectorEnv(
        rom_name(game), num_envs, num_threads=opts.num_threads, stack_num=1,
        frameskip=opts.frame_skip, maxpool=True, noop_max=opts.noop_max,
        img_height=opts.screen_size, img_width=opts.screen_size, grayscale=opts.grayscale,
        episodic_life=False, life_loss_info=False, reward_clipping=False,
        use_fire_reset=opts.fire_reset, repeat_action_probability=sticky,
        full_action_space=opts.full_action_space,
        max_num_frames_per_episode=opts.max_episode_frames)


class AtariEnv(gym.vector.VectorEnv):
    """Episodic life and reward clipping over a backend, with the raw score in ``info``.

    ``info["raw_reward"]``: the raw game reward of each env's step; ``info["game_over"]``: the game
    really ended (terminated or truncated), as opposed to a lost life that ends the learner's
    episode. With episodic life, a life loss is reported as terminated while the game goes on:
    the step after it (the pipeline's FIRST) is the game's next frame, not a reset. (A game
    that ended on that very step would be seen one step late; a lost life takes longer than one
    agent step to play out in the ALE games, so this does not happen in practice.)
    """

    def __init__(self, inner: gym.vector.VectorEnv, episodic_life: bool, clip_rewards: bool,
                 envpool: bool = False):
        self.inner = inner
        self.episodic_life = episodic_life
        self.clip_rewards = clip_rewards
        self.num_envs = inner.num_envs
        self.single_observation_space = inner.single_observation_space
        self.single_action_space = inner.single_action_space
        self.observation_space = inner.observation_space
        self.action_space = inner.action_space
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
        self._envpool = envpool
        self._lives = np.zeros(self.num_envs, np.int64)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        # EnvPool is seeded when made and its reset takes no seed.
        obs, info = self.inner.reset() if self._envpool else self.inner.reset(seed=seed)
        self._lives = np.asarray(info["lives"], np.int64).copy()
        zeros = np.zeros(self.num_envs, np.float32)
        return obs, {"raw_reward": zeros, "game_over": np.zeros(self.num_envs, bool)}

    def step(self, actions):
        obs, raw, terminated, truncated, info = self.inner.step(
            np.asarray(actions, dtype=np.int32 if self._envpool else np.int64))
        raw = np.asarray(raw, np.float32)
        game_over = terminated | truncated
        lives = np.asarray(info["lives"], np.int64)
        if self.episodic_life:
            terminated = terminated | ((lives < self._lives) & ~game_over)
        self._lives = lives.copy()
        reward = np.sign(raw) if self.clip_rewards else raw
        return obs, reward, terminated, truncated, {"raw_reward": raw, "game_over": game_over}

    def close(self, **kwargs):
        self.inner.close()


def make(env_id: str, num_envs: int, seed: int | None, opts: AtariOptions,
         training: bool) -> AtariEnv:
    """The backend with :class:`AtariEnv` on top; evaluation (``training=False``) plays whole
    games with raw rewards."""
    return AtariEnv(_backend(env_id, num_envs, seed, opts), training and opts.episodic_life,
                    training and opts.clip_rewards, envpool=opts.backend == "envpool")
