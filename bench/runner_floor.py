"""The ceiling under issue 13's item 2 on this machine: one runner of 64 CartPole envs whose
actions come from another process, with nothing of Conduit in the way.

    python bench/runner_floor.py [--envs 64] [--seconds 3] [--rounds 3]

Why: the graph's env runner (``bench/pipeline_throughput.py --envs-per-runner 64``) stays at
0.42-0.59 of one process stepping the same envs, and sessions 6-17 cut its own overheads without
reaching 0.7. This bench asks what the separate process alone costs: the runner sends the
envs' observations over a Unix stream socket (``socketpair``) and blocks on the reply; the
other process answers each request with random actions and does nothing else (no decoding, no
replay, no event loop). Placements, each beside one process stepping the same envs with random
actions in the same round:

* ``apart``: the scheduler's choice (on two CPUs, mostly one process per CPU);
* ``one CPU``: both pinned to CPU 0 (a wake-up stays on its CPU);
* ``spinning``: as ``apart``, the answering process polling its socket instead of sleeping (no
  wake-up on the request's side).

Printed: env steps/s, the one process's, and their ratio; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import time

import gymnasium as gym
import numpy as np
from pipeline_throughput import single_process_rate  # the limit item 2 is measured against

_LENGTH = struct.Struct("<I")


def make_envs(num_envs: int) -> gym.vector.VectorEnv:
    return gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP})


def _read(sock: socket.socket, size: int, buf: bytearray) -> memoryview:
    view, got = memoryview(buf)[:size], 0
    while got < size:
        try:
            n = sock.recv_into(view[got:], size - got)
        except BlockingIOError:  # the spinning side polls
            continue
        if not n:
            raise EOFError
        got += n
    return view


def _answer(sock: socket.socket, num_envs: int, spin: bool) -> None:
    """The policy's process: random actions for every request until the runner hangs up."""
    sock.setblocking(not spin)
    rng, buf = np.random.default_rng(0), bytearray(1 << 16)
    while True:
        try:
            size = _LENGTH.unpack(_read(sock, 4, buf))[0]
            _read(sock, size, buf)
        except EOFError:
            return
        actions = rng.integers(0, 2, size=num_envs).tobytes()
        sock.setblocking(True)
        sock.sendall(_LENGTH.pack(len(actions)) + actions)
        sock.setblocking(not spin)


def two_processes(num_envs: int, seconds: float, placement: str) -> float:
    """Env steps/s of a runner whose actions come from another process."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        mine.close()
        if placement == "one CPU":
            os.sched_setaffinity(0, {0})
        _answer(theirs, num_envs, spin=placement == "spinning")
        os._exit(0)
    theirs.close()
    if placement == "one CPU":
        os.sched_setaffinity(0, {0})
    try:
        envs, buf = make_envs(num_envs), bytearray(1 << 16)
        obs, _ = envs.reset(seed=0)
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            payload = obs.astype(np.float32).tobytes()
            mine.sendall(_LENGTH.pack(len(payload)) + payload)
            size = _LENGTH.unpack(_read(mine, 4, buf))[0]
            actions = np.frombuffer(_read(mine, size, buf), np.int64).copy()
            obs = envs.step(actions)[0]
            steps += num_envs
        rate = steps / (time.perf_counter() - start)
        envs.close()
    finally:
        mine.close()
        os.waitpid(pid, 0)
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    placements = ["apart", "one CPU", "spinning"]
    ratios: dict[str, list[float]] = {p: [] for p in placements}
    print(f"{'placement':>10}{'two processes steps/s':>23}{'one process steps/s':>21}{'ratio':>8}")
    for _ in range(args.rounds):
        for placement in placements:
            ours = two_processes(args.envs, args.seconds, placement)
            limit = single_process_rate(args.envs, args.seconds)
            ratios[placement].append(ours / limit)
            print(f"{placement:>10}{ours:>23.0f}{limit:>21.0f}{ours / limit:>8.2f}", flush=True)
    print(json.dumps({"bench": "runner_floor", "envs": args.envs, "cpus": os.cpu_count(),
                      "median_ratio": {p: round(statistics.median(r), 3)
                                       for p, r in ratios.items()}}))


if __name__ == "__main__":
    main()
