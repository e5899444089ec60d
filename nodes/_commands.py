"""``run.py play`` and ``run.py export``: a run's trained policy, watched and shipped.

    python run.py play RUN_DIR [--which best] [--episodes N] [--video out.mp4] [--render human]
                               [--seed S]
    python run.py export RUN_DIR --to FILE [--which best]

Registered with :func:`pipeline.cli.register_command` when :mod:`nodes` is imported (run.py
does). Both work through :func:`nodes._policy.load_policy` (public as ``conduit.load_policy``),
imported when a command runs, so a node process never imports it. A
user mistake (no such run directory, no best policy yet, an unknown ``--which``, a missing
extra) is one line and exit code 2.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile

from nodes import _datasets as _datasets  # noqa: F401 - run.py dataset (offline RL)
from pipeline.cli import EXIT_OK, UsageError, register_command

VIDEO_EXTRA = "pip install -e '.[video]'"


def _policy_arguments(p) -> None:
    p.add_argument("run_dir", help="a run directory (runs/<graph>/<time>)")
    p.add_argument("--which", default="best",
                   help="best (default): the evaluator's best evaluation; reached: the one that "
                        "met stop_at_return; final: the learner's newest checkpoint; or a path")


def _load(args, device: str = "cpu"):
    from nodes._policy import PolicyError, load_policy

    try:
        return load_policy(args.run_dir, args.which, device)
    except PolicyError as exc:
        raise UsageError(str(exc)) from None


def _describe(policy) -> str:
    """Where a policy's parameters came from, in a few words."""
    info = policy.info
    said = [f"{info['which']} policy"]
    if info.get("mean_return") is not None:
        said.append(f"evaluated {info['mean_return']:.1f}")
    if info.get("env_steps") is not None:
        said.append(f"at {info['env_steps']:,} env steps")
    if info.get("version") is not None:
        said.append(f"version {info['version']}")
    return ", ".join(said)


# --- play ----------------------------------------------------------------------------------------


def _play_arguments(p) -> None:
    _policy_arguments(p)
    p.add_argument("--episodes", type=int, default=10, help="episodes to play (default 10)")
    p.add_argument("--video", metavar="OUT.mp4",
                   help=f"record the first episode to this mp4 (Gymnasium's RecordVideo; "
                        f"{VIDEO_EXTRA})")
    p.add_argument("--render", choices=["human"], help="draw the episodes in a window")
    p.add_argument("--seed", type=int, default=0, help="the first episode's env seed")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or auto")


def play(args) -> int:
    """Play ``--episodes`` greedy episodes one after another; print each return and the mean."""
    if args.episodes < 1:
        raise UsageError(f"--episodes: expected at least 1, got {args.episodes}")
    if args.video and args.render:
        raise UsageError("--video and --render: choose one (a window or a file)")
    if args.video and importlib.util.find_spec("moviepy") is None:
        raise UsageError(f"--video needs moviepy: {VIDEO_EXTRA}")
    policy = _load(args, args.device)
    env = _env(policy, "rgb_array" if args.video else args.render,
               "--video" if args.video else "--render")
    folder = None
    if args.video:
        from gymnasium.wrappers import RecordVideo

        out_dir = os.path.dirname(os.path.abspath(args.video))
        os.makedirs(out_dir, exist_ok=True)
        # RecordVideo writes into a folder of its own; the file moves to --video at the end.
        folder = tempfile.mkdtemp(prefix=".video-", dir=out_dir)
        env = RecordVideo(env, os.path.join(folder, "video"), episode_trigger=lambda episode: episode == 0,
                          name_prefix="play")
    returns = []
    try:
        for episode in range(args.episodes):
            total, steps = _episode(env, policy, args.seed if episode == 0 else None)
            returns.append(total)
            print(f"episode {episode + 1}: return {total:.1f} ({steps} steps)", flush=True)
        env.close()  # RecordVideo writes the file here at the latest
        if folder is not None:
            videos = [os.path.join(folder, "video", name)
                      for name in os.listdir(os.path.join(folder, "video")) if name.endswith(".mp4")]
            if not videos:
                raise UsageError(f"--video: {policy.agent.env_id} drew no frames")
            os.replace(videos[0], args.video)
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    mean = sum(returns) / len(returns)
    print(f"mean return {mean:.1f} over {len(returns)} episodes ({_describe(policy)})")
    if args.video:
        print(f"video of episode 1: {args.video}")
    return EXIT_OK


def _env(policy, render_mode: str | None, flag: str):
    import gymnasium as gym

    from nodes._policy import PolicyError

    try:
        return policy.make_env(render_mode)
    except PolicyError as exc:
        raise UsageError(f"{flag}: {exc}") from None
    except gym.error.DependencyNotInstalled as exc:  # pygame, for the classic-control envs
        raise UsageError(f"{flag}: {_first_line(exc)} ({VIDEO_EXTRA})") from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0]


def _episode(env, policy, seed: int | None) -> tuple[float, int]:
    """One greedy episode: ``(return, steps)``."""
    obs, _ = env.reset(seed=seed)
    action, state = policy.act(obs)
    total, steps = 0.0, 0
    while True:
        obs, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        steps += 1
        if terminated or truncated:
            return total, steps
        action, state = policy.act(obs, state)


# --- export --------------------------------------------------------------------------------------


def _export_arguments(p) -> None:
    _policy_arguments(p)
    p.add_argument("--to", required=True, metavar="FILE",
                   help="the file to write (a torch.export program; .pt2 by convention)")


def export(args) -> int:
    """Write the greedy policy as a file that loads with torch alone."""
    policy = _load(args)
    path = policy.export(args.to)
    state = "state" if policy.module.state_specs else "state ()"
    print(f"wrote {path} ({_describe(policy)}): torch.export.load(path).module()"
          f"(observation, first, {state}) -> (action, state); docs/policy.md")
    return EXIT_OK


register_command("play", "play a run's trained policy: each episode's return and the mean",
                 _play_arguments, play)
register_command("export", "write a run's trained policy as a file that loads with torch alone",
                 _export_arguments, export)
