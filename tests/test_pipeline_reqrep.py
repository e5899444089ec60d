"""Request/reply over the bus with large payloads on ipc:// and tcp://, timeouts, and the plain
PAIR ping-pong with 1 MiB messages over ipc that was reported to hang on this machine.

Findings on the PAIR report (pyzmq 27.3 / libzmq 4.3.5): ping-pong of 1 MiB over ipc does not
hang, in one thread, two threads, one asyncio or uvloop loop, or two processes (the tests below
cover those). What does "hang" is a peer that closes its socket with ``linger=0`` right after
sending its last large message: the message is still being written into the unix socket (whose
buffer is far smaller than 1 MiB), linger 0 discards the rest, and the other side waits forever
for a reply that was "sent". Small messages are usually flushed in time, so the bug only shows
with large payloads. ``pipeline.sockets`` closes every socket with linger 0, so a node that
replies and then closes (a state reply at shutdown, say) can lose that reply;
``test_reply_survives_the_server_closing_right_after`` pins that down.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import zmq
import zmq.asyncio

from pipeline.bus import Bus
from pipeline.messages import Record
from pipeline.sockets import SocketFactory

MiB = 1 << 20

# Each test gets its own context and terminates it at the end: ``term`` blocks while any socket
# is open, so a leaked socket turns into a timeout instead of passing silently.


def endpoint(transport: str, tmp_path, name: str = "svc") -> str:
    return f"ipc://{tmp_path}/{name}" if transport == "ipc" else "tcp://127.0.0.1:*"


def buses(ctx, bind: str, service: str = "sample") -> tuple[Bus, Bus]:
    server_bus = Bus("replay.0~0", "replay", {}, {service: bind}, {},
                     sockets=SocketFactory(ctx))
    client_bus = Bus("learner.0~0", "learner", {}, {}, {}, sockets=SocketFactory(ctx))
    return server_bus, client_bus


async def echo_server(server, replies: int | None = None) -> int:
    """Answer each request with its own payload (a view of the received frame: no copy)."""
    handled = 0
    async for request in server:
        msg = request.message
        await request.reply(Record(origin=msg.origin, data=msg.data))
        handled += 1
        if replies is not None and handled >= replies:
            break
    return handled


def run(coro, timeout: float = 45.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


# --- round trips ---------------------------------------------------------------------------------


async def _round_trips(transport: str, size: int, tmp_path, count: int) -> None:
    ctx = zmq.asyncio.Context()
    server_bus, client_bus = buses(ctx, endpoint(transport, tmp_path))
    server_task = None
    try:
        server = server_bus.server("sample")
        # On one machine a service is a plain Unix socket (pipeline.stream), over tcp ZeroMQ.
        assert server.endpoint.startswith("unix://" if transport == "ipc" else "tcp://")
        server_task = asyncio.ensure_future(echo_server(server))
        client_bus.set_peers({}, {"sample": [server.endpoint]})
        client = client_bus.client("sample")
        rng = np.random.default_rng(size)
        for i in range(count):
            payload = rng.integers(0, 255, size, dtype=np.uint8)
            started = time.perf_counter()
            reply = await client.request(Record(origin=i, data={"blob": payload}), timeout=20)
            elapsed = time.perf_counter() - started
            assert reply.kind == "record" and reply.sender == "replay.0~0"
            assert reply.message.origin == i
            got = reply.message.data["blob"]
            assert got.dtype == np.uint8 and got.shape == (size,)
            assert np.array_equal(got, payload), f"round trip {i} corrupted the payload"
            assert elapsed < 10, f"round trip {i} of {size} bytes took {elapsed:.1f}s"
        assert client.stats.sent == count and server.stats.received == count
        assert client.stats.malformed == 0 and server.stats.malformed == 0
    finally:
        if server_task is not None:
            server_task.cancel()
            await asyncio.gather(server_task, return_exceptions=True)
        client_bus.close()
        server_bus.close()
        ctx.term()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [MiB, 16 * MiB], ids=["1MiB", "16MiB"])
@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_request_reply_round_trips(transport, size, tmp_path):
    run(_round_trips(transport, size, tmp_path, count=8 if size == MiB else 4))


async def _concurrent_requests(transport: str, tmp_path) -> None:
    """Several requests in flight at once over one DEALER; replies matched by id."""
    ctx = zmq.asyncio.Context()
    server_bus, client_bus = buses(ctx, endpoint(transport, tmp_path))
    server_task = None
    try:
        server = server_bus.server("sample")
        server_task = asyncio.ensure_future(echo_server(server))
        client_bus.set_peers({}, {"sample": [server.endpoint]})
        client = client_bus.client("sample")
        payloads = [np.full(MiB // 8, i, dtype=np.int64) for i in range(6)]
        replies = await asyncio.gather(*(client.request(Record(i, p), timeout=20)
                                         for i, p in enumerate(payloads)))
        for i, reply in enumerate(replies):
            assert reply.message.origin == i
            assert np.array_equal(reply.message.data, payloads[i])
    finally:
        if server_task is not None:
            server_task.cancel()
            await asyncio.gather(server_task, return_exceptions=True)
        client_bus.close()
        server_bus.close()
        ctx.term()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_concurrent_requests_are_matched_to_their_replies(transport, tmp_path):
    run(_concurrent_requests(transport, tmp_path))


async def _two_servers(tmp_path) -> None:
    ctx = zmq.asyncio.Context()
    bus_a, client_bus = buses(ctx, endpoint("ipc", tmp_path, "a"))
    bus_b = Bus("replay.1~0", "replay", {}, {"sample": endpoint("ipc", tmp_path, "b")}, {},
                sockets=SocketFactory(ctx))
    tasks = []
    try:
        servers = [bus_a.server("sample"), bus_b.server("sample")]
        tasks = [asyncio.ensure_future(echo_server(s)) for s in servers]
        client_bus.set_peers({}, {"sample": [s.endpoint for s in servers]})
        client = client_bus.client("sample")
        senders = [(await client.request(Record(i, np.zeros(MiB, np.uint8)), timeout=20)).sender
                   for i in range(4)]
        assert sorted(senders) == ["replay.0~0", "replay.0~0", "replay.1~0", "replay.1~0"]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        client_bus.close()
        bus_b.close()
        bus_a.close()
        ctx.term()


@pytest.mark.timeout(60)
def test_requests_rotate_over_every_server(tmp_path):
    run(_two_servers(tmp_path))


# --- timeouts ------------------------------------------------------------------------------------


async def _timeouts(tmp_path) -> None:
    ctx = zmq.asyncio.Context()
    client_bus = Bus("learner.0~0", "learner", {}, {}, {}, sockets=SocketFactory(ctx))
    try:
        # No server known at all.
        client = client_bus.client("sample")
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="no server for service 'sample' within"):
            await client.request(Record(0, None), timeout=0.2)
        assert time.monotonic() - started < 2

        # A server endpoint nobody listens on: the request waits for it to accept.
        client_bus.set_peers({}, {"sample": [f"unix://{tmp_path}/nobody-home"]})
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="no server for service 'sample' within"):
            await client.request(Record(1, np.zeros(MiB, np.uint8)), timeout=0.2)
        assert time.monotonic() - started < 2
        assert not client._pending  # the timed-out request is forgotten
    finally:
        client_bus.close()
        ctx.term()


@pytest.mark.timeout(60)
def test_request_without_a_server_times_out_quickly(tmp_path):
    run(_timeouts(tmp_path))


async def _late_reply(tmp_path) -> None:
    """A server that answers after the client gave up: the late reply is dropped, and the next
    request gets its own reply, not the stale one."""
    ctx = zmq.asyncio.Context()
    server_bus, client_bus = buses(ctx, endpoint("ipc", tmp_path))
    try:
        server = server_bus.server("sample")
        client_bus.set_peers({}, {"sample": [server.endpoint]})
        client = client_bus.client("sample")
        slow = asyncio.ensure_future(client.request(Record(1, None), timeout=0.2))
        request = await server.recv()  # received, but not answered in time
        with pytest.raises(TimeoutError):
            await slow
        await request.reply(Record(1, "stale"))
        second = asyncio.ensure_future(client.request(Record(2, None), timeout=10))
        request = await server.recv()
        await request.reply(Record(2, "fresh"))
        reply = await second
        assert (reply.message.origin, reply.message.data) == (2, "fresh")
    finally:
        client_bus.close()
        server_bus.close()
        ctx.term()


@pytest.mark.timeout(60)
def test_late_reply_is_ignored(tmp_path):
    run(_late_reply(tmp_path))


# --- the reply that closes behind it -------------------------------------------------------------


async def _reply_then_close(tmp_path, size: int) -> None:
    ctx = zmq.asyncio.Context()
    server_bus, client_bus = buses(ctx, endpoint("ipc", tmp_path))
    try:
        server = server_bus.server("sample")
        client_bus.set_peers({}, {"sample": [server.endpoint]})
        client = client_bus.client("sample")
        pending = asyncio.ensure_future(client.request(Record(1, None), timeout=2))
        request = await server.recv()
        await request.reply(Record(1, np.ones(size, np.uint8)))
        server_bus.close()  # e.g. a node answering a final state request, then exiting
        reply = await pending
        assert reply.message.data.nbytes == size
    finally:
        client_bus.close()
        server_bus.close()
        ctx.term()


@pytest.mark.timeout(60)
def test_small_reply_survives_the_server_closing_right_after(tmp_path):
    run(_reply_then_close(tmp_path, 64))


@pytest.mark.timeout(60)
def test_reply_survives_the_server_closing_right_after(tmp_path):
    run(_reply_then_close(tmp_path, 16 * MiB))


# --- plain PAIR ping-pong, 1 MiB over ipc ---------------------------------------------------------


async def _pair_ping_pong(tmp_path, rounds: int) -> None:
    ctx = zmq.asyncio.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        a.bind(f"ipc://{tmp_path}/pair")
        b.connect(f"ipc://{tmp_path}/pair")
        payload = os.urandom(MiB)

        async def echo():
            for _ in range(rounds):
                await b.send(await b.recv(copy=False), copy=False)

        echo_task = asyncio.ensure_future(echo())
        for _ in range(rounds):
            await a.send(payload, copy=False)
            assert await a.recv() == payload
        await echo_task
    finally:
        a.close(linger=0)
        b.close(linger=0)
        ctx.term()


@pytest.mark.timeout(60)
def test_pair_ping_pong_1mib_over_ipc_in_one_loop(tmp_path):
    run(_pair_ping_pong(tmp_path, rounds=200), timeout=30)


PAIR_PEER = textwrap.dedent("""
    import sys, zmq
    endpoint, rounds = sys.argv[1], int(sys.argv[2])
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.connect(endpoint)
    for _ in range(rounds):
        sock.send(sock.recv(copy=False), copy=False)
    sock.recv()  # "bye": close only once the peer has our last reply (see module docstring)
    sock.close(linger=0)
    ctx.term()
""")


@pytest.mark.timeout(60)
def test_pair_ping_pong_1mib_over_ipc_between_processes(tmp_path):
    rounds = 100
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.rcvtimeo = sock.sndtimeo = 10_000  # a hang becomes zmq.Again, not a stuck test
    peer = None
    try:
        sock.bind(f"ipc://{tmp_path}/pair")
        peer = subprocess.Popen([sys.executable, "-c", PAIR_PEER, f"ipc://{tmp_path}/pair",
                                 str(rounds)])
        payload = os.urandom(MiB)
        for _ in range(rounds):
            sock.send(payload, copy=False)
            assert sock.recv() == payload
        sock.send(b"bye")
        assert peer.wait(timeout=20) == 0
    finally:
        if peer is not None and peer.poll() is None:
            peer.kill()
            peer.wait()
        sock.close(linger=0)
        ctx.term()
