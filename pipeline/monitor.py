"""What a user reads of a run: ``run.py monitor``, the progress line and the end-of-run block.

``monitor`` is a live view that can never slow the run down. It reads the supervisor's status
(fed by heartbeats the nodes send anyway), derives messages/s per topic from successive
counters, and with ``--topic`` attaches a SUB socket to lossy and latest topics directly and to
reliable topics through their taps: all of these drop instead of blocking, so a slow terminal
costs the graph nothing.

The progress line (:class:`Progress`) and the end-of-run block (:func:`format_summary`) read
the run at a glance from the same status, or from ``summary.json`` once it ended. pipeline/
knows no RL: they read status keys any node kind may report (:func:`figures`).
"""

from __future__ import annotations

import collections
import math
import re
import sys
import time

import numpy as np
import zmq

from pipeline import batch_codec, codec, curve


def monitor(run_dir: str, topics: list[str], interval: float, count: int, control) -> int:
    status = control(run_dir, "status", timeout=10)
    if topics:
        return _tail_topics(status, topics, count)
    previous, previous_t = None, None
    shown = 0
    while True:
        status = control(run_dir, "status", timeout=10)
        t = time.monotonic()
        print(render(status, previous, t - previous_t if previous_t else None), flush=True)
        previous, previous_t = status, t
        shown += 1
        if count and shown >= count:
            return 0
        time.sleep(interval)  # display period


def _sent_by_topic(status: dict) -> dict[str, int]:
    totals: dict[str, int] = {}
    for info in status["nodes"].values():
        for key, stats in (info.get("topics") or {}).items():
            if key.startswith("pub:"):
                totals[key[4:]] = totals.get(key[4:], 0) + stats.get("sent", 0)
    return totals


def render(status: dict, previous: dict | None, dt: float | None) -> str:
    lines = [f"== {status['graph']}  up {status['uptime_s']:.0f}s  {status['run_dir']}"]
    lines.append(f"{'instance':<22}{'state':<11}{'restarts':>8}  status")
    for instance, info in status["nodes"].items():
        st = " ".join(f"{k}={_fmt(v)}" for k, v in (info.get("status") or {}).items())
        lines.append(f"{instance:<22}{info['state']:<11}{info['restarts']:>8}  {st}")
    sent = _sent_by_topic(status)
    before = _sent_by_topic(previous) if previous else {}
    lines.append(f"{'topic':<22}{'delivery':<11}{'msg/s':>10}{'sent':>12}{'gaps':>6}"
                 f"{'depth':>7}")
    for topic, info in status["topics"].items():
        rate = ((sent.get(topic, 0) - before.get(topic, 0)) / dt) if dt else float("nan")
        gaps = depth = 0
        for node in status["nodes"].values():
            for key, stats in (node.get("topics") or {}).items():
                if key.split(":", 1)[1] == topic:
                    gaps += stats.get("gaps", 0)
                    depth = max(depth, stats.get("depth", 0))
        lines.append(f"{topic:<22}{info['delivery']:<11}{rate:>10.1f}{sent.get(topic, 0):>12}"
                     f"{gaps:>6}{depth:>7}")
    return "\n".join(lines)


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _tail_topics(status: dict, topics: list[str], count: int) -> int:
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 100)
    keys = curve.operator(status["run_dir"])
    if keys is not None:  # tcp with CURVE: subscribe as the run's operator
        curve.make_client(sock, keys)
    try:
        for topic in topics:
            info = status["topics"].get(topic)
            if info is None:
                print(f"error: no topic {topic!r} (topics: {', '.join(status['topics'])})",
                      file=sys.stderr)
                return 2
            endpoints = info["taps"] if info["delivery"] == "reliable" else info["publishers"]
            for ep in endpoints:
                sock.connect(ep)
            sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        sock.connect(status["events"])
        sock.setsockopt(zmq.SUBSCRIBE, b"supervisor.")
        seen = 0
        while not count or seen < count:
            frames = sock.recv_multipart()
            try:
                envs = batch_codec.messages_of(codec.decode(frames[1:]))
            except codec.ProtocolError as exc:
                print(f"{frames[0].decode(errors='replace')}: malformed: {exc}")
                continue
            for env in envs[:count - seen] if count else envs:
                print(f"{frames[0].decode()} {env.sender} #{env.seq} {describe(env.message)}",
                      flush=True)
                seen += 1
    except KeyboardInterrupt:
        pass
    finally:
        sock.close(linger=0)
    return 0


def describe(msg) -> str:
    """A short one-line rendering: scalars as values, arrays as dtype[shape]."""

    def short(v):
        if isinstance(v, np.ndarray) or hasattr(v, "shape"):
            return f"{getattr(v, 'dtype', '?')}{list(v.shape)}"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k}: {short(x)}" for k, x in list(v.items())[:8]) + "}"
        if isinstance(v, list | tuple):
            return "[" + ", ".join(short(x) for x in v[:4]) + (", ..." if len(v) > 4 else "]")
        return repr(v)[:60]

    fields = getattr(msg, "__dataclass_fields__", {})
    return f"{msg.KIND}(" + ", ".join(f"{k}={short(getattr(msg, k))}" for k in fields) + ")"


# --- a run at a glance ---------------------------------------------------------------------------
# Status keys a node kind may report for these (the learner, the evaluator and the unroller do):
#   env_steps         environment steps so far, as this node counts them (the largest is shown)
#   env_steps_target  the run's budget of env steps (the learner's num_env_steps): % and ETA
#   eval_return       the latest evaluation's return
#   best_return       the best evaluation's return, with best_dir: where its policy is kept
#   reached           in a finished node's summary: the value that met its threshold (its
#                     latest evaluation, which a last status may not have carried)

WIDTH = 79  # the progress line fits an 80-column terminal


def figures(status: dict) -> dict:
    """The run's headline figures from a status (live, or ``summary.json``): ``env_steps``,
    ``env_steps_target``, ``eval_return``, ``best_return``, ``best_dir``; None where no node
    reports one."""
    out = dict.fromkeys(("env_steps", "env_steps_target", "eval_return", "best_return",
                         "best_dir"))
    for info in status["nodes"].values():
        st = info.get("status") or {}
        for key in ("env_steps", "env_steps_target"):
            value = _finite(st.get(key))
            if value is not None and (out[key] is None or value > out[key]):
                out[key] = int(value)
        if out["eval_return"] is None:
            out["eval_return"] = _finite(st.get("reached", st.get("eval_return")))
        best = _finite(st.get("best_return"))
        if best is not None and (out["best_return"] is None or best > out["best_return"]):
            out["best_return"], out["best_dir"] = best, st.get("best_dir")
    if out["best_return"] is None:  # a node that reports no best: its latest is the best known
        out["best_return"] = out["eval_return"]
    return out


class Progress:
    """The progress line, one call of :meth:`line` per refresh: elapsed time, env steps of
    the budget, env steps/s (over the last ``WINDOW_S``), the ETA (the budget's at this rate,
    or when ``duration_s`` ends the run if that comes first), the latest and best eval
    return, and any node that is not running (``stopping`` once the run ends). Per-node
    details are ``run.py monitor``'s."""

    WINDOW_S = 10.0

    def __init__(self, duration_s: float | None = None):
        self.duration_s = duration_s
        self.samples: collections.deque = collections.deque()  # (uptime_s, env_steps)

    def line(self, status: dict, ending: bool = False) -> str:
        """``ending``: the run is being stopped (its nodes stop one wave after another)."""
        up = float(status["uptime_s"])
        fig = figures(status)
        parts = [f"[{clock(up)}]"]
        steps, target = fig["env_steps"], fig["env_steps_target"]
        if steps is None and fig["eval_return"] is None:
            if target is None:  # a graph without env steps (the demo): its nodes' numbers
                return f"{parts[0]} {_nodes_numbers(status)}"
            steps = 0  # the budget is known, no step taken yet
        rate = None
        if steps is not None:
            self.samples.append((up, steps))
            while len(self.samples) > 2 and up - self.samples[0][0] > self.WINDOW_S:
                self.samples.popleft()
            (t0, s0), (t1, s1) = self.samples[0], self.samples[-1]
            rate = (s1 - s0) / (t1 - t0) if t1 > t0 else None
            text = f"steps {count(steps)}"
            if target:
                text += f"/{count(target)} {min(100, int(100 * steps / target))}%"
            parts.append(text)
            parts.append(f"{count(round(rate))}/s" if rate is not None else "-/s")
        eta = []
        if target and steps is not None and rate:
            eta.append(max(0.0, (target - steps) / rate))
        if self.duration_s:
            eta.append(max(0.0, self.duration_s - up))
        if eta or target:
            parts.append(f"ETA {clock(min(eta))}" if eta else "ETA -")
        line = " ".join(parts)
        if fig["eval_return"] is not None:
            line += f" | eval {ret(fig['eval_return'])} best {ret(fig['best_return'])}"
        else:
            line += " | eval -"
        trouble = "stopping" if ending else _not_running(status)
        return f"{line} | {trouble}" if trouble else line


def _not_running(status: dict) -> str:
    """Nodes not running (starting, backoff, failed...), shortest first, for the line's end."""
    odd = [f"{instance} {info['state']}" for instance, info in status["nodes"].items()
           if info["state"] not in ("running", "finished")]
    if len(odd) > 1:
        return f"{len(odd)} nodes not running"
    return odd[0] if odd else ""


def _nodes_numbers(status: dict) -> str:
    parts = []
    for instance, info in status["nodes"].items():
        shown = {k: v for k, v in (info.get("status") or {}).items()
                 if isinstance(v, int | float) and not isinstance(v, bool)}
        numbers = " ".join(f"{k}={_short(v)}" for k, v in list(shown.items())[:2])
        parts.append(f"{instance}:{info['state']}" + (f" {numbers}" if numbers else ""))
    return " | ".join(parts)


def _short(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else count(v)


def format_summary(summary: dict) -> str:
    """The end-of-run block from ``summary.json``'s data: why the run ended, the best eval
    return and where its policy is, env steps, wall time, the run directory."""
    ended = summary.get("ended") or {}
    fig = figures(summary)
    lines = [_why(summary, ended, fig)]
    if fig["best_return"] is not None:
        lines.append(f"  best eval return  {ret(fig['best_return'])}")
        if fig["best_dir"]:
            lines.append(f"  best policy       {fig['best_dir']}")
    if fig["env_steps"] is not None:
        target = fig["env_steps_target"]
        lines.append(f"  env steps         {fig['env_steps']:,}" +
                     (f" of {target:,}" if target else ""))
    up = float(summary.get("uptime_s") or 0)
    rate = f" ({count(round(fig['env_steps'] / up))} env steps/s)" \
        if fig["env_steps"] and up > 0 else ""
    lines.append(f"  wall time         {clock(up) if up >= 60 else f'{up:.1f} s'}{rate}")
    lines.append(f"  run directory     {summary.get('run_dir')}")
    return "\n".join(lines)


def _why(summary: dict, ended: dict, fig: dict) -> str:
    reason, node = ended.get("reason"), ended.get("node")
    if summary.get("failure"):
        if reason == "duration":
            return (f"run failed: duration_s={ended.get('duration_s'):g} reached before the "
                    f"stop condition (the error below)")
        failed = re.match(r"node (\S+)", summary["failure"])
        return f"run failed{f' in node {failed[1]}' if failed else ''}: the error below"
    if reason == "stop condition" and node:
        st = (summary["nodes"].get(node) or {}).get("status") or {}
        steps, target = _finite(st.get("env_steps")), _finite(st.get("env_steps_target"))
        if target and steps is not None and steps >= target:
            return f"run ended: budget reached ({node} finished {int(target):,} env steps)"
        reached = _finite(st.get("reached"))
        if reached is not None:
            return f"run ended: threshold reached ({node} finished at {ret(reached)})"
        return f"run ended: stop condition ({node} finished)"
    if reason == "duration":
        why = "run.on_duration: stop" if ended.get("stop_when") else "the graph's stop condition"
        return f"run ended: duration_s={ended.get('duration_s'):g} reached ({why})"
    if reason == "stop requested":
        return "run stopped: run.py stop"
    if reason == "signal SIGINT":
        return "run stopped: Ctrl-C (SIGINT)"
    if reason and reason.startswith("signal "):
        return f"run stopped: {reason[len('signal '):]}"
    return f"run ended{f': {reason}' if reason else ''}"


def _finite(value) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return value
    return None


def clock(seconds: float) -> str:
    """h:mm:ss, or m:ss under an hour."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def count(n: float) -> str:
    """A count in at most five characters or so: 9876, 12.3k, 1.25M."""
    n = int(n)
    if abs(n) < 10_000:
        return str(n)
    if abs(n) < 1_000_000:
        return f"{n / 1e3:.1f}".rstrip("0").rstrip(".") + "k"
    return f"{n / 1e6:.2f}".rstrip("0").rstrip(".") + "M"


def ret(value: float) -> str:
    """A return: one decimal below 1,000 in size, none above."""
    return f"{value:.1f}" if abs(value) < 1000 else f"{value:.0f}"
