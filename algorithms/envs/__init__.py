"""The one environment factory: every process that steps or sizes an environment (env runner,
evaluator, the nodes that build the algorithm's spaces, the single-process trainer) calls it, so
they all see the same observations for the same ``env_id`` and ``env_kwargs``.

Three families, told apart by the id:

* Atari (``ALE/<Game>-v5``, ``<Game>NoFrameskip-v4``): :mod:`algorithms.envs.atari`, the
  ``[atari]`` extra; ``env_kwargs`` are :class:`~algorithms.envs.atari.AtariOptions`.
* MinAtar (``MinAtar/<Game>-v0|v1``): :mod:`algorithms.envs.minatar`, the ``[minatar]`` extra;
  ``env_kwargs`` are :class:`~algorithms.envs.minatar.MinAtarOptions`.
* any other registered Gymnasium id: ``gymnasium.make_vec`` (sync), ``env_kwargs`` go to
  ``gymnasium.make``; :mod:`algorithms.envs.pomdp` registers the partially observed ones
  (``CartPoleNoVelocity-v1``); Gymnasium-Robotics' ids (``FetchReach-v4``: a ``Dict``
  observation, goal-conditioned) are registered when first asked for, if installed.

Any id may name the module that registers it, Gymnasium's ``"module:EnvId"`` form
(``"corridor:Corridor-v0"`` imports ``corridor``, then makes ``Corridor-v0``): the module is
imported here, in whichever process asks (the graph check, a runner, the evaluator), and one
that does not import is one line naming it.

Every env it makes is a ``NEXT_STEP`` autoreset vector env (the step after a terminated or
truncated one is a reset, reward 0), which :class:`algorithms.steps.VectorEnvStepper` turns into
ALF time steps. No torch here: an env runner starts without importing it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import logging

import gymnasium as gym

from algorithms.envs import atari, minatar, pomdp

log = logging.getLogger(__name__)

pomdp.register()


def registered_id(env_id: str) -> str:
    """``env_id`` without its module: for ``"module:EnvId"`` (Gymnasium's form) the module is
    imported first, which registers ``EnvId``. Raises ``ValueError`` with one line naming a
    module that does not import, and why."""
    module, sep, name = env_id.partition(":")
    if not sep:
        return env_id
    if not module or not name:
        raise ValueError(f"expected an env id or module:EnvId, got {env_id!r}")
    try:
        importlib.import_module(module)
    except Exception as exc:  # user code: a SyntaxError or a raise at import is a mistake too
        reason = " ".join(str(exc).split())
        if not isinstance(exc, ImportError):
            reason = f"{type(exc).__name__}: {reason}"
        raise ValueError(f"cannot import module {module!r}: {reason}") from None
    return name


def check_env_id(env_id: str, env_kwargs: dict | None = None) -> None:
    """Raise ``ValueError`` with one line if ``env_id``/``env_kwargs`` cannot make an env here:
    an unknown id, a missing extra (named), an unknown ``env_kwargs`` key. Cheap: it makes no
    environment, so a graph can be checked at load time."""
    env_id = registered_id(env_id)
    env_kwargs = dict(env_kwargs or {})
    if atari.parse_id(env_id) is not None:
        atari.check(env_id, atari.options(env_kwargs))
    elif minatar.parse_id(env_id) is not None:
        minatar.options(env_kwargs)
        if not minatar.installed():
            raise ValueError(f"{env_id} needs the [{minatar.EXTRA}] extra: "
                             f"pip install -e '.[{minatar.EXTRA}]'")
    else:
        try:
            _spec_with_robotics(env_id)
        except gym.error.Error as exc:
            raise ValueError(f"unknown environment id {env_id!r}: {exc} (your own? name the "
                             f"module that registers it: module:{env_id}, or the graph's "
                             f"imports:)") from None


# Gymnasium-Robotics' env families, named when the package is missing (else an unknown id).
ROBOTICS_PREFIXES = ("Fetch", "HandReach", "HandManipulate", "AdroitHand", "PointMaze",
                     "AntMaze", "FrankaKitchen")
ROBOTICS_EXTRA = "mujoco"


def _spec_with_robotics(env_id: str):
    """``gym.spec(env_id)``, registering Gymnasium-Robotics' envs (FetchReach-v4, ...) first
    when the id is not known yet and the package is installed (the ``[mujoco]`` extra).

    Why lazily, and only for its families' ids: importing it loads MuJoCo's Python bindings,
    which no other env needs, and prints a notice on stderr (about its Adroit envs' rewards),
    which would make a user's one-line error two lines; it registers its ids only when
    imported (``gym.register_envs``)."""
    try:
        return gym.spec(env_id)
    except gym.error.Error:
        if not env_id.startswith(ROBOTICS_PREFIXES):
            raise
        if importlib.util.find_spec("gymnasium_robotics") is None:
            raise ValueError(f"{env_id} needs the [{ROBOTICS_EXTRA}] extra "
                             f"(gymnasium-robotics): pip install -e "
                             f"'.[{ROBOTICS_EXTRA}]'") from None
    notice = io.StringIO()
    with contextlib.redirect_stderr(notice):
        robotics = importlib.import_module("gymnasium_robotics")
    if notice.getvalue().strip():
        log.debug("gymnasium_robotics: %s", notice.getvalue().strip())
    gym.register_envs(robotics)
    return gym.spec(env_id)


def make_env(env_id: str, num_envs: int, seed: int | None = None,
             env_kwargs: dict | None = None, training: bool = True) -> gym.vector.VectorEnv:
    """A ``NEXT_STEP`` vector env of ``num_envs`` copies of ``env_id``.

    ``training=False`` is for evaluation: Atari then plays whole games (no episodic life) with
    raw rewards (no clipping). ``seed`` seeds the action space here and the envs at the
    stepper's ``reset(seed)`` (EnvPool: here).
    """
    env_kwargs = dict(env_kwargs or {})
    check_env_id(env_id, env_kwargs)
    env_id = registered_id(env_id)
    if atari.parse_id(env_id) is not None:
        env = atari.make(env_id, num_envs, seed, atari.options(env_kwargs), training)
    elif minatar.parse_id(env_id) is not None:
        env = minatar.MinAtarVectorEnv(env_id, num_envs, minatar.options(env_kwargs))
    else:
        env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                           vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP},
                           **env_kwargs)
    env.action_space.seed(seed)
    return env


def env_spaces(env_id: str, env_kwargs: dict | None = None) -> tuple[gym.Space, gym.Space]:
    """``(observation space, action space)`` of one env, as :func:`make_env` makes it (for
    Atari the preprocessed ``[1, 84, 84]`` uint8 frame, not the raw screen)."""
    env = make_env(env_id, 1, None, env_kwargs, training=False)
    try:
        return env.single_observation_space, env.single_action_space
    finally:
        env.close()


__all__ = ["check_env_id", "env_spaces", "make_env", "registered_id"]
