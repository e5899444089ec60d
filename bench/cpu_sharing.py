"""What two processes on two CPUs cost each other on this machine: the floor under the graph.

    python bench/cpu_sharing.py [--round-trips 5000]

Why: every node of a graph is a process, and on a 2-vCPU machine the nodes of one round trip
(an env runner and the unroller) often sit on different CPUs, where each wake-up of the other
side (its ZeroMQ I/O thread, then its main thread) crosses the CPUs. This bench measures what
that costs on the machine it runs on, with nothing of Conduit in the way: a raw pyzmq
DEALER/ROUTER round trip (200 B, ipc) between two processes, both pinned to one CPU against
pinned to different CPUs, in the same run. Printed: the p50 round trip and the caller's CPU
time per round trip (its I/O thread included), and the ratios two CPUs / one CPU.

Tried and not kept here: a DQN update beside a busy process on the other CPU. On this VM it
measured anywhere from 0.8x to 1.3x of the update alone from one hour to the next (the host's
other tenants), so it could not show a property of the code.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round-trips", type=int, default=5000)
    args = parser.parse_args()
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("cpu_sharing: needs at least 2 CPUs")
    same = round_trips(0, 0, args.round_trips)
    across = round_trips(0, 1, args.round_trips)
    print(f"raw DEALER/ROUTER round trip, 200 B, ipc: one CPU p50 {same['p50_us']} us "
          f"(caller CPU {same['cpu_us']} us); two CPUs p50 {across['p50_us']} us "
          f"(caller CPU {across['cpu_us']} us): ratio {across['p50_us'] / same['p50_us']:.2f} "
          f"(CPU {across['cpu_us'] / same['cpu_us']:.2f})")
    print(json.dumps({"bench": "cpu_sharing", "round_trip_one_cpu": same,
                      "round_trip_two_cpus": across}))


if __name__ == "__main__":
    main()
