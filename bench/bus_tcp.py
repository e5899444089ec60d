"""Reliable-topic throughput over tcp with and without CurveZMQ: Conduit's bus vs raw pyzmq.

    python bench/bus_tcp.py [--seconds 1.5] [--repeats 2] [--sizes 64KiB,1MiB]

Two processes (spawned) move messages over ``tcp://127.0.0.1`` for ``--seconds``, four ways in
turn within each size (the machine is shared: alternating, best of ``--repeats``):

* ``ours``: a :class:`pipeline.bus.Bus` ``ReliablePublisher`` and ``ReliableSubscriber``
  (consumer group ``sink``), as :mod:`bench.bus_throughput` does over ipc;
* ``ours+curve``: the same with :func:`pipeline.sockets.use_curve` in both processes, keys made
  by :func:`pipeline.curve.ensure_keys` (the publisher binds as CURVE server behind the ZAP
  gate, the subscriber connects as a node's client);
* ``raw``: PUSH/PULL with the bare payload (zero-copy);
* ``raw+curve``: the same with CURVE (server key on the PULL, a ZAP authenticator admitting the
  PUSH's key).

The last line is one JSON object; ``ratios`` are ours / raw messages per second with CURVE on
and off. Target (issue 12): ``ours+curve`` >= 0.6 of ``raw+curve`` at 64 KiB and 1 MiB.
(A separate file from ``bench/bus_throughput.py``, which measures ipc.)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bus_throughput import Rate  # noqa: E402

SIZES = {"4KiB": 4 << 10, "64KiB": 64 << 10, "1MiB": 1 << 20}
TOPIC, HWM = "bench", 1000
KINDS = ("ours", "ours+curve", "raw", "raw+curve")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _use_keys(keys: dict | None, as_node: str) -> None:
    if keys is None:
        return
    from pipeline import curve, sockets

    sockets.use_curve(curve.load(curve.launch_spec(keys["run_dir"], keys["publics"],
                                                   curve.node_key_name(as_node))))


async def _publish(endpoint: str, size: int, seconds: float) -> dict:
    import numpy as np

    from pipeline.bus import Bus, TopicSpec
    from pipeline.messages import Record

    bus = Bus("source.0~0", "source", {TOPIC: TopicSpec("reliable", HWM)}, {TOPIC: endpoint},
              {TOPIC: ["sink"]})
    try:
        pub = bus.publisher(TOPIC)
        payload = np.zeros(size, dtype=np.uint8)
        deadline, sent = time.perf_counter() + seconds, 0
        while time.perf_counter() < deadline:
            for _ in range(16):
                sent += 1
                await pub.send(Record(origin=sent, data=payload))
        await pub.send(Record(origin=-1, data=None))
        if not await pub.flush(60):
            raise RuntimeError("subscriber did not acknowledge everything")
        return {"sent": sent}
    finally:
        bus.close()


async def _subscribe(endpoint: str, size: int) -> dict:
    from pipeline.bus import Bus, TopicSpec

    bus = Bus("sink.0~0", "sink", {TOPIC: TopicSpec("reliable", HWM)}, {}, {})
    try:
        bus.set_peers({TOPIC: [endpoint]}, {})
        sub = bus.subscriber(TOPIC)
        rate = Rate()
        async for envelope in sub:
            if envelope.message.origin < 0:
                break
            rate.tick()
        return {**rate.result(), "gaps": sub.stats.gaps}
    finally:
        bus.close()


def _ours(role: str, endpoint: str, size: int, seconds: float, keys, conn) -> None:
    import uvloop

    _use_keys(keys, "source" if role == "pub" else "sink")
    if role == "pub":
        conn.send(uvloop.run(_publish(endpoint, size, seconds)))
    else:
        conn.send(uvloop.run(_subscribe(endpoint, size)))


def _raw(role: str, endpoint: str, size: int, seconds: float, keys, conn) -> None:
    import zmq

    ctx = zmq.Context()
    auth = None
    if role == "pub":
        sock = ctx.socket(zmq.PUSH)
        if keys is not None:
            sock.curve_publickey, sock.curve_secretkey = keys["client"]
            sock.curve_serverkey = keys["server"][0]
        sock.connect(endpoint)
        payload, deadline, sent = bytes(size), time.perf_counter() + seconds, 0
        while time.perf_counter() < deadline:
            for _ in range(16):
                sock.send(payload, copy=False)
                sent += 1
        sock.send(b"")
        result = {"sent": sent}
    else:
        sock = ctx.socket(zmq.PULL)
        if keys is not None:
            from zmq.auth.thread import ThreadAuthenticator

            auth = ThreadAuthenticator(ctx)
            auth.start()
            admitted = {keys["client"][0]}

            class Provider:
                def callback(self, domain, key):
                    return key in admitted

            auth.configure_curve_callback("*", credentials_provider=Provider())
            sock.curve_server = 1
            sock.curve_publickey, sock.curve_secretkey = keys["server"]
        sock.rcvtimeo = 30_000
        sock.bind(endpoint)
        rate = Rate()
        while True:
            frame = sock.recv(copy=False)
            if len(frame) == 0:
                break
            rate.tick()
        result = {**rate.result(), "gaps": 0}
    sock.close(linger=-1)
    if auth is not None:
        auth.stop()
    ctx.term()
    conn.send(result)


def measure(kind: str, size: int, seconds: float, keys: dict) -> float:
    ctx = mp.get_context("spawn")
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    curve_keys = (keys if kind == "ours+curve" else keys["raw"] if kind == "raw+curve"
                  else None)
    target = _ours if kind.startswith("ours") else _raw
    procs, pipes = [], []
    for role in ("sub", "pub"):
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=target, args=(role, endpoint, size, seconds, curve_keys,
                                                child))
        proc.start()
        procs.append(proc)
        pipes.append(parent)
    try:
        results = {}
        for role, pipe in zip(("sub", "pub"), pipes, strict=True):
            if not pipe.poll(seconds + 90):
                raise RuntimeError(f"{kind} {role} ({size} B) produced no result")
            results[role] = pipe.recv()
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    sub = results["sub"]
    if sub["gaps"] or sub["received"] != results["pub"]["sent"]:
        raise RuntimeError(f"{kind} {size} B: sent {results['pub']['sent']}, received "
                           f"{sub['received']}, gaps {sub['gaps']}")
    return sub["rate"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sizes", default="64KiB,1MiB")
    args = parser.parse_args(argv)
    import zmq

    from pipeline import curve

    run_dir = tempfile.mkdtemp(prefix="conduit-bench-tcp-")
    publics = curve.ensure_keys(run_dir, ["source", "sink"])
    keys = {"run_dir": run_dir, "publics": publics,
            "raw": {"server": zmq.curve_keypair(), "client": zmq.curve_keypair()}}
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    table: dict = {}
    for name in sizes:
        size = SIZES[name]
        best = dict.fromkeys(KINDS, 0.0)
        for _ in range(args.repeats):
            for kind in KINDS:
                best[kind] = max(best[kind], measure(kind, size, args.seconds, keys))
        table[name] = best
        print(f"{name:>6}  " + "  ".join(f"{k} {v:8.0f}/s" for k, v in best.items()),
              flush=True)
    ratios = {name: {"curve": round(t["ours+curve"] / t["raw+curve"], 3),
                     "plain": round(t["ours"] / t["raw"], 3)} for name, t in table.items()}
    print(json.dumps({"msgs_per_s": {n: {k: round(v) for k, v in t.items()}
                                     for n, t in table.items()},
                      "ratios": ratios, "cpus": os.cpu_count()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
