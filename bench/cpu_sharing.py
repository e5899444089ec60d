"""What two processes on two CPUs cost each other on this machine: the floor under the graph.

    python bench/cpu_sharing.py [--round-trips 5000] [--seconds 2] [--rounds 3]

Why: every node of a graph is a process, and on a 2-vCPU machine the nodes of one round trip
(an env runner and the unroller) often sit on different CPUs, where each wake-up of the other
side (its ZeroMQ I/O thread, then its main thread) crosses the CPUs. This bench measures what
that costs on the machine it runs on, with nothing of Conduit in the way: a raw pyzmq
DEALER/ROUTER round trip (200 B, ipc) between two processes, both pinned to one CPU against
pinned to different CPUs, in the same run. Printed: the p50 round trip and the caller's CPU
time per round trip (its I/O thread included), and the ratios two CPUs / one CPU. Then the
same over a plain Unix stream socket (what same-machine services use, ``pipeline.stream``),
and its ratio to ZeroMQ across the CPUs.

Second, what such messaging does to the code around it: the CPU time per env step of 64
CartPole envs stepped in one process pinned to CPU 0 (``bench/pipeline_throughput.py``'s
one-process limit), alone against beside a raw round-trip loop between two other processes,
its echo side on the stepper's CPU or both sides on the other CPU. Nothing of the round trips
runs in the stepper's thread, so a rise is the toll of the other threads' wake-ups on its
CPU (its caches refilled after each switch); an env runner in the graph pays it, with its own
I/O thread and event loop waking on its CPU every step (``env.step CPU`` in
``bench/pipeline_throughput.py``).

Tried and not kept here: a DQN update beside a busy process on the other CPU. On this VM it
measured anywhere from 0.8x to 1.3x of the update alone from one hour to the next (the host's
other tenants), so it could not show a property of the code.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import time

import zmq


def _pin(cpu: int) -> None:
    """This process and all its threads (the ZeroMQ I/O thread included) on ``cpu``."""
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        os.sched_setaffinity(int(tid), {cpu})


def _echo(endpoint: str, cpu: int) -> None:
    sock = zmq.Context().socket(zmq.ROUTER)
    sock.connect(endpoint)
    _pin(cpu)
    while True:
        frames = sock.recv_multipart()
        if frames[-1] == b"stop":
            return
        sock.send_multipart(frames)


def round_trips(mine: int, theirs: int, count: int) -> dict:
    """p50 wall-clock and the caller's CPU (its I/O thread included) per round trip."""
    endpoint = f"ipc:///tmp/conduit-cpu-sharing-{os.getpid()}.ipc"
    sock = zmq.Context().socket(zmq.DEALER)
    sock.bind(endpoint)
    peer = mp.Process(target=_echo, args=(endpoint, theirs))
    peer.start()
    try:
        _pin(mine)
        payload = b"x" * 200
        for _ in range(500):  # connected, pinned, warm
            sock.send_multipart([b"", payload])
            sock.recv_multipart()
        walls = []
        cpu = time.process_time()
        for _ in range(count):
            t = time.perf_counter()
            sock.send_multipart([b"", payload])
            sock.recv_multipart()
            walls.append(time.perf_counter() - t)
        cpu = time.process_time() - cpu
        sock.send_multipart([b"", b"stop"])
    finally:
        peer.join(10)
        sock.close(linger=0)
        os.sched_setaffinity(0, range(os.cpu_count()))
    return {"p50_us": round(statistics.median(walls) * 1e6, 1),
            "cpu_us": round(cpu / count * 1e6, 1)}


def _echo_unix(sock: socket.socket, cpu: int) -> None:
    _pin(cpu)
    while True:
        data = sock.recv(4096)
        if not data or data == b"stop":
            return
        sock.sendall(data)


def unix_round_trips(mine: int, theirs: int, count: int) -> dict:
    """The same round trip over a plain Unix stream socket, each side one blocking thread: the
    wake-ups a same-machine service pays (``pipeline.stream``), none of ZeroMQ's I/O threads."""
    ours, their_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    peer = mp.Process(target=_echo_unix, args=(their_end, theirs))
    peer.start()
    their_end.close()
    try:
        _pin(mine)
        payload = b"x" * 200
        for _ in range(500):
            ours.sendall(payload)
            ours.recv(4096)
        walls = []
        cpu = time.process_time()
        for _ in range(count):
            t = time.perf_counter()
            ours.sendall(payload)
            ours.recv(4096)
            walls.append(time.perf_counter() - t)
        cpu = time.process_time() - cpu
        ours.sendall(b"stop")
    finally:
        peer.join(10)
        ours.close()
        os.sched_setaffinity(0, range(os.cpu_count()))
    return {"p50_us": round(statistics.median(walls) * 1e6, 1),
            "cpu_us": round(cpu / count * 1e6, 1)}


def _ping(endpoint: str, cpu: int, stop) -> None:
    """Round trips to an :func:`_echo` until ``stop`` is set, as fast as they go."""
    sock = zmq.Context().socket(zmq.DEALER)
    sock.bind(endpoint)
    _pin(cpu)
    while not stop.is_set():
        sock.send_multipart([b"", b"x" * 200])
        sock.recv_multipart()
    sock.send_multipart([b"", b"stop"])


def env_step_cpu_us(seconds: float, ping_pong: tuple[int, int] | None) -> float:
    """This thread's CPU µs per env step of 64 CartPole envs stepped on CPU 0 (random
    actions), alone or while a raw round-trip loop runs with its echo and caller processes
    on the CPUs ``ping_pong`` names: the one-process stepper of
    ``bench/pipeline_throughput.py`` with messaging around it, and none of it its own."""
    import gymnasium as gym
    import numpy as np

    stop, peers = mp.Event(), []
    if ping_pong is not None:
        endpoint = f"ipc:///tmp/conduit-cpu-sharing-ping-{os.getpid()}.ipc"
        peers = [mp.Process(target=_ping, args=(endpoint, ping_pong[1], stop)),
                 mp.Process(target=_echo, args=(endpoint, ping_pong[0]))]
        for peer in peers:
            peer.start()
    env = gym.make_vec("CartPole-v1", num_envs=64, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP})
    try:
        env.reset(seed=0)
        rng = np.random.default_rng(0)
        _pin(0)
        for _ in range(200):  # warm, and the round trips under way
            env.step(rng.integers(0, 2, size=64))
        steps, cpu, end = 0, time.thread_time(), time.perf_counter() + seconds
        while time.perf_counter() < end:
            env.step(rng.integers(0, 2, size=64))
            steps += 64
        return (time.thread_time() - cpu) / steps * 1e6
    finally:
        env.close()
        stop.set()
        for peer in peers:
            peer.join(10)
        os.sched_setaffinity(0, range(os.cpu_count()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round-trips", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=2.0, help="per stepping case")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("cpu_sharing: needs at least 2 CPUs")
    same = round_trips(0, 0, args.round_trips)
    across = round_trips(0, 1, args.round_trips)
    print(f"raw DEALER/ROUTER round trip, 200 B, ipc: one CPU p50 {same['p50_us']} us "
          f"(caller CPU {same['cpu_us']} us); two CPUs p50 {across['p50_us']} us "
          f"(caller CPU {across['cpu_us']} us): ratio {across['p50_us'] / same['p50_us']:.2f} "
          f"(CPU {across['cpu_us'] / same['cpu_us']:.2f})")
    unix_same = unix_round_trips(0, 0, args.round_trips)
    unix_across = unix_round_trips(0, 1, args.round_trips)
    print(f"raw Unix stream socket round trip, 200 B: one CPU p50 {unix_same['p50_us']} us "
          f"(caller CPU {unix_same['cpu_us']} us); two CPUs p50 {unix_across['p50_us']} us "
          f"(caller CPU {unix_across['cpu_us']} us); against ZeroMQ across the CPUs: "
          f"{unix_across['p50_us'] / across['p50_us']:.2f} "
          f"(CPU {unix_across['cpu_us'] / across['cpu_us']:.2f})")
    cases = {"alone": None, "echo_on_its_cpu": (0, 1), "both_on_the_other_cpu": (1, 1)}
    step_us = {name: [] for name in cases}
    for _ in range(args.rounds):  # alternated, so a drift of the machine hits every case
        for name, placement in cases.items():
            step_us[name].append(env_step_cpu_us(args.seconds, placement))
    step_us = {name: round(statistics.median(v), 2) for name, v in step_us.items()}
    alone = step_us["alone"]
    print(f"64 CartPole envs stepped on CPU 0, CPU us per env step: alone {alone}; beside a "
          f"round-trip loop whose echo side shares its CPU {step_us['echo_on_its_cpu']} "
          f"(ratio {step_us['echo_on_its_cpu'] / alone:.2f}); beside one on the other CPU "
          f"{step_us['both_on_the_other_cpu']} "
          f"(ratio {step_us['both_on_the_other_cpu'] / alone:.2f})")
    print(json.dumps({"bench": "cpu_sharing", "round_trip_one_cpu": same,
                      "round_trip_two_cpus": across, "unix_round_trip_one_cpu": unix_same,
                      "unix_round_trip_two_cpus": unix_across, "env_step_cpu_us": step_us}))


if __name__ == "__main__":
    main()
