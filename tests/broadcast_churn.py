"""Peer churn on a ``latest`` topic, as the unroller sees it when its learner is killed -9 and
restarted under a new endpoint (issue 11, the ``fq.cpp:80`` abort).

``python -m tests.broadcast_churn publish ENDPOINT`` publishes large multi-frame ``Params``
until killed; ``python -m tests.broadcast_churn subscribe DIR ROUNDS`` runs ROUNDS publishers
in turn, each killed with SIGKILL while messages flow and replaced by one on a new endpoint, the
way the supervisor's ``Peers`` replace an incarnation. Between the kill and the switch a poll
of the socket finds the dead publisher's last message waiting (as the event loop's readiness
check does): libzmq then holds that message's first frame, and a subscriber that disconnected
the dead peer's pipe there aborted the whole process. Exits 0 after every round delivered the
new publisher's parameters. Run as a process of its own: the failure is an abort.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import numpy as np
import zmq

from nodes.messages import Params
from pipeline.bus import Bus, TopicSpec
from pipeline.forkserver import die_with_parent

TOPICS = {"params": TopicSpec("latest", 4)}
ARRAYS = 6  # frames per message besides the topic and the envelope
ARRAY_BYTES = 256 << 10
MAX_ROUNDS = 48


async def publish(endpoint: str, epoch: int) -> None:
    bus = Bus(f"learner.0~{epoch}", "learner", TOPICS, {"params": endpoint}, {})
    pub = bus.publisher("params")
    params = {f"w{i}": np.full(ARRAY_BYTES // 4, i, np.float32) for i in range(ARRAYS)}
    version = 0
    print("bound", flush=True)
    while True:
        version += 1
        pub.send_nowait(Params(version, 0, params, epoch=epoch))
        await asyncio.sleep(0.002)  # a learner's update rate, not a synchronization


def _start(endpoint: str, epoch: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "tests.broadcast_churn", "publish", endpoint,
                             str(epoch), str(os.getpid())], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "bound"
    return proc


async def subscribe(directory: str, rounds: int) -> None:
    """At least ``rounds`` rounds, and more (up to ``MAX_ROUNDS``) until one of them had a
    message waiting at the switch: whether a poll finds one depends on timing."""
    bus = Bus("unroller.0~0", "unroller", TOPICS, {}, {}, subscriptions=("params",))
    sub = bus.subscriber("params")
    procs = []
    waiting = 0
    epoch = 0
    try:
        while epoch < rounds or (not waiting and epoch < MAX_ROUNDS):
            epoch += 1
            endpoint = f"ipc://{directory}/learner.0~{epoch}.params"
            procs.append(_start(endpoint, epoch))
            sub.set_endpoints([endpoint])  # the old, killed publisher's pipe goes away here
            while True:  # the new publisher's parameters arrive
                envelope = await asyncio.wait_for(sub.recv(), 20)
                if envelope.message.epoch == epoch:
                    break
            assert len(envelope.message.params) == ARRAYS
            await asyncio.wait_for(sub.recv(), 20)  # and keep coming
            # A poll of the socket (as the event loop's readiness check makes) finds the next
            # message waiting; then the publisher dies before it is read.
            for _ in range(1000):
                if sub.sock.get(zmq.EVENTS) & zmq.POLLIN:
                    waiting += 1
                    break
                await asyncio.sleep(0.001)  # bounded: polls for the next message
            procs[-1].send_signal(signal.SIGKILL)
            procs[-1].wait()
        print(f"ok {epoch} rounds, {waiting} with a message waiting at the switch", flush=True)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        bus.close()


def main(argv: list[str]) -> int:
    import uvloop

    if argv[0] == "publish":
        die_with_parent(int(argv[3]))  # a subscriber that aborted leaves no publisher behind
        uvloop.run(publish(argv[1], int(argv[2])))
    else:
        os.makedirs(argv[1], exist_ok=True)
        uvloop.run(subscribe(argv[1], int(argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
