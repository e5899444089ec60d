"""``run.py monitor``: a live view of a run that can never slow it down.

It reads the supervisor's status (fed by heartbeats the nodes send anyway), derives messages/s
per topic from successive counters, and with ``--topic`` attaches a SUB socket to lossy and
latest topics directly and to reliable topics through their taps: all of these drop instead of
blocking, so a slow terminal costs the graph nothing.
"""

from __future__ import annotations

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
