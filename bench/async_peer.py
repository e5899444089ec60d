"""Conduit's APPO graph against Sample Factory's APPO on Atari Breakout, same machine, back to
back: training env steps/s over the same wall-clock window, the policy lag of each, and the
training episode return at equal env steps.

    bash bench/peers/setup_sample_factory.sh      # once: bench/.venv-sf (Sample Factory 2.1.1)
    python bench/async_peer.py                    # 240 s each, Conduit then Sample Factory
    python bench/async_peer.py --window 600 --rounds 2
    python bench/async_peer.py --curve 1000000 --window 9000   # both at once: return curves
    python bench/async_peer.py --curve 1000000 --stop-at 500000 --seed 1 --out runs/curve_s1
    python bench/async_peer.py --median runs/curve_s0 runs/curve_s1 runs/curve_s2

Both sides: 16 Breakout environments (Conduit: 2 runners x 8 ale-py envs; Sample Factory:
``--num_workers 2 --env_agents 8`` EnvPool envs), 4 stacked 84x84 frames, the Nature CNN,
rollouts of 128, 4 epochs of 4 mini-batches of 256 per 1,024 steps, clipping 0.1, Adam
2.5e-4, on the CPU. Sample Factory runs its own Atari defaults (V-trace off there, as in its
published Atari runs; ``--peer-vtrace`` turns it on). Env steps are agent steps (4 frames
each; Sample Factory's frame counts are divided by its frameskip of 4).

The rate is the slope of trained env steps over the window after ``--warmup`` seconds (the
learner's ``env_steps`` in Conduit's metrics; Sample Factory's "Total num frames" log lines).
Lag: Conduit's learner reports ``lag/versions_*`` per metrics period; Sample Factory prints
``Policy #0 lag: (min, avg, max)``. The last line is one JSON object with both sides and the
ratio (Conduit / Sample Factory).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SF_PYTHON = ROOT / "bench" / ".venv-sf" / "bin" / "python"
FRAMESKIP = 4
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SF_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")
_SF_FRAMES = re.compile(r"Total num frames: (\d+)")
_SF_LAG = re.compile(r"Policy #0 lag: \(min: ([\d.-]+), avg: ([\d.-]+), max: ([\d.-]+)\)")
_SF_REWARD = re.compile(r"Avg episode reward: \[\(0, '([\d.-]+)'\)\]")


def slope(points: list[tuple[float, float]], start: float) -> float | None:
    """Least-squares env steps per second of ``(seconds, env_steps)`` after ``start``."""
    pts = [(t, s) for t, s in points if t >= start]
    if len(pts) < 2:
        return None
    mt = statistics.fmean(t for t, _ in pts)
    ms = statistics.fmean(s for _, s in pts)
    den = sum((t - mt) ** 2 for t, _ in pts)
    return sum((t - mt) * (s - ms) for t, s in pts) / den if den else None


# EnvPool's Breakout (the peer's) has no sticky actions; ALE/Breakout-v5 has them at 0.25 unless
# told otherwise: Conduit's side is set to the peer's task.
PEER_TASK = ["agent.env_kwargs.repeat_action_probability=0"]


def run_conduit(window: float, warmup: float, env_steps: int = 100_000_000,
                keep: Path | None = None, settings: tuple[str, ...] = (), seed: int = 0,
                stop_at: int | None = None) -> dict:
    """``graphs/appo_atari.yaml`` for ``window`` seconds or ``stop_at`` env steps (by default
    ``env_steps``, the budget its learning rate decays over), whichever comes first, with
    ``settings`` (``KEY=VALUE``, as ``run.py --set``) last; its run directory is kept at
    ``keep`` (a temporary one otherwise)."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = str(keep or Path(tmp) / "run")
        cmd = [sys.executable, str(ROOT / "run.py"), "run", str(ROOT / "graphs/appo_atari.yaml"),
               "--run-dir", run_dir, "--quiet", "--seed", str(seed),
               "--set", f"run.duration_s={window}", "--set", "run.on_duration=stop",
               "--set", f"nodes.learner.config.num_env_steps={stop_at or env_steps}",
               "--set", "nodes.learner.config.metrics_interval_s=2",
               "--set", "nodes.evaluator.config.eval_interval=100000000"]
        for setting in PEER_TASK:
            cmd += ["--set", setting]
        # The learning rate decays to 0 over the budget, as Sample Factory's over its own.
        cmd += ["--set", f"agent.algorithm.learning_rate_anneal_steps={env_steps}"]
        for setting in settings:
            cmd += ["--set", setting]
        t0 = time.time()
        code = subprocess.run(cmd, cwd=ROOT).returncode
        figures = conduit_figures(Path(run_dir), warmup, t0)
    return {"exit_code": code, **figures}


def weighted(records: list[dict], key: str) -> list[tuple[float, float, int]]:
    """``(env_steps, mean return, episodes)`` of each runner report of ``key``_return (the
    episodes that ended in its period: ``key``s counts them per runner)."""
    points, seen = [], {}
    for m in records:
        if f"{key}_return" in m:
            count = m[f"{key}s"] - seen.get(m["source"], 0)
            seen[m["source"]] = m[f"{key}s"]
            points.append((m["env_steps"], m[f"{key}_return"], count))
    return points


def conduit_figures(run_dir: Path, warmup: float, t0: float | None = None) -> dict:
    """Rate, lag and training returns of a finished Conduit run (``t0``: its launch, by default
    its first learner report)."""
    with open(run_dir / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    learner = [m for m in records if m["source"].startswith("learner")]
    t0 = learner[0]["time"] if t0 is None and learner else t0 or 0.0
    points = [(m["time"] - t0, m["env_steps"]) for m in learner]
    lags = [m for m in learner if "lag/versions_mean" in m and m["time"] - t0 >= warmup]
    # Sample Factory's "episode reward" is the learner's episode (a life, clipped rewards, its
    # EnvPool settings): the runners report the same as train/learner_episode_return.
    returns, games = weighted(records, "train/learner_episode"), weighted(records, "train/episode")
    return {"env_steps_per_s": slope(points, warmup),
            "trained_env_steps": max((s for _, s in points), default=0),
            "lag_mean": lags and round(statistics.fmean(m["lag/versions_mean"] for m in lags), 2),
            "lag_max": lags and max(m["lag/versions_max"] for m in lags),
            "returns": returns, "game_returns": games}


def run_sample_factory(window: float, warmup: float, vtrace: bool,
                       env_steps: int = 100_000_000, log: Path | None = None, seed: int = 0,
                       stop_at: int | None = None) -> dict:
    """Sample Factory's Atari APPO for ``window`` seconds or ``stop_at`` env steps (agent
    steps; by default ``env_steps``, the budget its learning rate decays over: its frame budget
    is 4x that), whichever comes first; its log is copied to ``log``."""
    if not SF_PYTHON.exists():
        raise SystemExit(f"{SF_PYTHON} is missing: bash bench/peers/setup_sample_factory.sh")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [str(SF_PYTHON), "-m", "sf_examples.envpool.atari.train_envpool_atari",
               "--env=atari_breakout", "--experiment=bench", f"--train_dir={tmp}",
               "--device=cpu", "--num_workers=2", "--env_agents=8", f"--seed={seed}",
               f"--with_vtrace={vtrace}", "--save_every_sec=100000",
               f"--train_for_env_steps={env_steps * FRAMESKIP}",
               "--keep_checkpoints=1", "--experiment_summaries_interval=2"]
        # Its own process group: Sample Factory's spawned workers go with it at the end.
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"},
                                start_new_session=True)
        t0 = time.time()
        lines = []
        try:
            for line in proc.stdout:
                lines.append(line)
                frames = _SF_FRAMES.search(_ANSI.sub("", line))
                if time.time() - t0 > window or (
                        stop_at and frames and int(frames.group(1)) >= stop_at * FRAMESKIP):
                    break
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    if log is not None:
        log.write_text("".join(lines))
    return sample_factory_figures(lines, warmup, t0)


def sample_factory_figures(lines: list[str], warmup: float, t0: float | None = None) -> dict:
    """Rate, lag and training returns from Sample Factory's log lines (``t0``: its launch, by
    default its first report)."""
    points, lags, returns, frames = [], [], [], 0
    for line in (_ANSI.sub("", raw) for raw in lines):
        stamp = _SF_TIME.match(line)
        if (m := _SF_FRAMES.search(line)) and stamp:
            at = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            t0 = at if t0 is None else t0
            frames = int(m.group(1))
            points.append((at - t0, frames / FRAMESKIP))
        if (m := _SF_LAG.search(line)) and points and points[-1][0] >= warmup:
            lags.append(tuple(float(x) for x in m.groups()))
        if m := _SF_REWARD.search(line):
            returns.append((frames / FRAMESKIP, float(m.group(1))))
    return {"env_steps_per_s": slope(points, warmup),
            "trained_env_steps": points[-1][1] if points else 0,
            "lag_mean": lags and round(statistics.fmean(a for _, a, _ in lags), 2),
            "lag_max": lags and max(x for _, _, x in lags),
            "returns": returns, "log_tail": "".join(lines[-5:]) if not points else ""}


def binned(returns: list[tuple], width: int) -> dict[int, float]:
    """Mean training episode return per ``width`` env steps, keyed by the bin's end, from
    ``(env_steps, return)`` or ``(env_steps, mean return, episodes)`` points."""
    bins: dict[int, list[float]] = {}
    for steps, ret, *count in returns:
        weight = count[0] if count else 1
        total = bins.setdefault((int(steps) // width + 1) * width, [0.0, 0])
        total[0] += ret * weight
        total[1] += weight
    return {end: round(s / n, 2) for end, (s, n) in sorted(bins.items()) if n}


def curves(args) -> int:
    """Both sides at once (each gets about one of the two cores), to the same env-step budget:
    the comparison is return at equal env steps, not speed (the rates above measure speed,
    one side at a time). Training returns per life in clipped rewards on both sides (the
    learner's episodes, what Sample Factory prints), Conduit's whole games beside them."""
    if args.read:  # a finished pair: --read CONDUIT_RUN_DIR SAMPLE_FACTORY_LOG
        ours = conduit_figures(Path(args.read[0]), args.warmup)
        peer = sample_factory_figures(Path(args.read[1]).read_text().splitlines(True),
                                      args.warmup)
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        log = args.out / "sample_factory.log"
        with ThreadPoolExecutor(2) as pool:
            ours = pool.submit(run_conduit, args.window, args.warmup, args.curve,
                               args.out / "conduit", tuple(args.conduit_set), args.seed,
                               args.stop_at) if "conduit" in args.sides else None
            peer = pool.submit(run_sample_factory, args.window, args.warmup, args.peer_vtrace,
                               args.curve, log, args.seed, args.stop_at) \
                if "peer" in args.sides else None
            # Both waited for before the other side's finished run is read.
            ours, peer = ours and ours.result(), peer and peer.result()
        ours = ours or conduit_figures(args.out / "conduit", args.warmup)
        peer = peer or sample_factory_figures(log.read_text().splitlines(True), args.warmup)
        (args.out / "curves.json").write_text(json.dumps({"conduit": ours,
                                                          "sample_factory": peer}))
    a, b = binned(ours["returns"], args.bin), binned(peer["returns"], args.bin)
    games = binned(ours["game_returns"], args.bin)
    print("training return per life (clipped rewards), mean over each bin of env steps; "
          "Conduit's whole games in raw score beside it")
    print(f"{'env steps':>10} {'conduit APPO':>13} {'Sample Factory':>15} {'ratio':>6} "
          f"{'conduit games':>14}")
    for end in sorted(set(a) | set(b)):
        x, y = a.get(end), b.get(end)
        ratio = f"{x / y:.2f}" if x is not None and y else "-"
        print(f"{end:>10} {x if x is not None else '-':>13} {y if y is not None else '-':>15} "
              f"{ratio:>6} {games.get(end, '-'):>14}")
    print(json.dumps({"bin": args.bin, "conduit": a, "sample_factory": b, "conduit_games": games,
                      "trained_env_steps": [ours["trained_env_steps"],
                                            peer["trained_env_steps"]],
                      "lag": [[ours["lag_mean"], ours["lag_max"]],
                              [peer["lag_mean"], peer["lag_max"]]],
                      "load": os.getloadavg()[0]}))
    return 0


def medians(out_dirs: list[Path], width: int, warmup: float) -> int:
    """Per bin, each side's median over the pairs in ``out_dirs`` that reached it (the
    seeds' curves: the claim "no worse at equal env steps" is about their medians)."""
    ours, peers = [], []
    for out in out_dirs:
        ours.append(binned(conduit_figures(out / "conduit", warmup)["returns"], width))
        log = (out / "sample_factory.log").read_text().splitlines(True)
        peers.append(binned(sample_factory_figures(log, warmup)["returns"], width))
    print(f"median training return per life over {len(out_dirs)} pairs "
          f"({', '.join(map(str, out_dirs))}), per bin of {width} env steps")
    print(f"{'env steps':>10} {'conduit APPO':>24} {'Sample Factory':>24} {'ratio':>6}")
    table = {}
    for end in sorted(set().union(*ours, *peers)):
        a = [c[end] for c in ours if end in c]
        b = [c[end] for c in peers if end in c]
        x, y = (statistics.median(v) if v else None for v in (a, b))
        table[end] = {"conduit": a, "sample_factory": b, "ratio": x / y if x and y else None}
        ratio = f"{x / y:.2f}" if x is not None and y else "-"
        cell = [f"{m:.2f} ({len(v)}: {' / '.join(f'{r:.2f}' for r in v)})" if v else "-"
                for m, v in ((x, a), (y, b))]
        print(f"{end:>10} {cell[0]:>24} {cell[1]:>24} {ratio:>6}")
    print(json.dumps({"bin": width, "pairs": [str(d) for d in out_dirs], "bins": table}))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window", type=float, default=240.0, help="seconds each side runs")
    ap.add_argument("--warmup", type=float, default=30.0, help="seconds left out of the rate")
    ap.add_argument("--rounds", type=int, default=1, help="Conduit, peer, Conduit, peer...")
    ap.add_argument("--peer-vtrace", action="store_true", help="Sample Factory with V-trace")
    ap.add_argument("--curve", type=int, metavar="ENV_STEPS",
                    help="learning curves instead: both sides at once, each to ENV_STEPS "
                         "or --window seconds, training return per --bin env steps")
    ap.add_argument("--bin", type=int, default=100_000, help="env steps per curve point")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "async_peer_curve",
                    help="--curve keeps Conduit's run and Sample Factory's log here")
    ap.add_argument("--sides", nargs="+", choices=["conduit", "peer"],
                    default=["conduit", "peer"],
                    help="--curve: run only these (the other's finished run lies in --out)")
    ap.add_argument("--conduit-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a graph setting for Conduit's side (run.py --set; repeatable)")
    ap.add_argument("--read", nargs=2, metavar=("CONDUIT_RUN_DIR", "SAMPLE_FACTORY_LOG"),
                    help="--curve's table from a finished pair instead of running one")
    ap.add_argument("--seed", type=int, default=0, help="both sides' seed")
    ap.add_argument("--stop-at", type=int, metavar="ENV_STEPS",
                    help="--curve: stop both sides there, their learning rates still decaying "
                         "over --curve's budget (a shorter run on the same schedule)")
    ap.add_argument("--median", nargs="+", type=Path, metavar="OUT_DIR",
                    help="the median over finished --curve pairs (each an --out directory: "
                         "conduit/ and sample_factory.log), bin by bin")
    args = ap.parse_args(argv)
    if args.median:
        return medians(args.median, args.bin, args.warmup)
    if args.curve or args.read:
        return curves(args)
    ours, peers = [], []
    for _ in range(args.rounds):
        ours.append(run_conduit(args.window, args.warmup, settings=tuple(args.conduit_set)))
        print("conduit", json.dumps({k: v for k, v in ours[-1].items() if k != "returns"}),
              flush=True)
        peers.append(run_sample_factory(args.window, args.warmup, args.peer_vtrace))
        print("sample-factory", json.dumps({k: v for k, v in peers[-1].items()
                                            if k != "returns"}), flush=True)
    rate = statistics.median(r["env_steps_per_s"] or 0 for r in ours)
    peer_rate = statistics.median(r["env_steps_per_s"] or 0 for r in peers)
    print(f"training env steps/s: conduit APPO {rate:.0f}, Sample Factory APPO {peer_rate:.0f}, "
          f"ratio {rate / peer_rate if peer_rate else float('nan'):.3f} "
          f"(window {args.window:.0f} s after {args.warmup:.0f} s, {args.rounds} round(s), "
          f"load {os.getloadavg()[0]:.1f})")
    print(json.dumps({"window_s": args.window, "conduit": ours, "sample_factory": peers,
                      "ratio": rate / peer_rate if peer_rate else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
