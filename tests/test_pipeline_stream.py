"""Same-machine request/reply over plain Unix sockets (pipeline.stream): framing, order under
partial writes, a peer that goes away, reconnection, and bytes that are not our protocol.
Real sockets, both ends on one event loop or in two processes."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import socket

import numpy as np
import pytest
import zmq.asyncio

from pipeline import graph as graphlib
from pipeline import stream, wiring
from pipeline.bus import Bus, ServerGone
from pipeline.messages import Record
from pipeline.sockets import SocketFactory
from tests.pipeline_harness import ROOT

MiB = 1 << 20


def run(coro, timeout: float = 45.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def _pair(tmp_path, on_message_a, on_message_b):
    """Two channels joined by a real connection through a listener."""
    listener = stream.Listener(f"{tmp_path}/pair")
    accepted = asyncio.get_running_loop().create_future()
    listener.start(accepted.set_result)
    a = stream.StreamChannel(stream.connect(f"{tmp_path}/pair"), on_message_a)
    b = stream.StreamChannel(await accepted, on_message_b)
    listener.close()
    return a, b


async def _order_and_sizes(tmp_path) -> None:
    got = []
    done = asyncio.get_running_loop().create_future()
    sizes = [0, 1, 5, 64 << 10, 3, 9 * MiB, 17, 200 << 10, 2]

    def on_message(frames):
        got.append([bytes(f) for f in frames])
        if len(got) == len(sizes) and not done.done():
            done.set_result(None)

    a, b = await _pair(tmp_path, lambda frames: None, on_message)
    rng = np.random.default_rng(0)
    sent = []
    for i, size in enumerate(sizes):
        payload = rng.integers(0, 255, size, dtype=np.uint8)
        frames = [f"m{i}".encode(), payload, b"tail"]  # an array frame goes in place
        sent.append([f"m{i}".encode(), payload.tobytes(), b"tail"])
        a.send(frames)
    # 9 MiB cannot be written at once: what follows it queues behind it, in order.
    await done
    assert got == sent
    a.close()
    b.close()


@pytest.mark.timeout(60)
def test_messages_arrive_whole_and_in_order_across_partial_writes(tmp_path):
    run(_order_and_sizes(tmp_path))


async def _many_frames(tmp_path) -> None:
    got = []
    done = asyncio.get_running_loop().create_future()

    def on_message(frames):
        got.append([bytes(f) for f in frames])
        if len(got) == 2 and not done.done():
            done.set_result(None)

    a, b = await _pair(tmp_path, lambda frames: None, on_message)
    many = [i.to_bytes(2, "little") for i in range(2500)]  # over one sendmsg's buffers
    a.send(many)
    a.send([b"after"])
    await done
    assert got == [many, [b"after"]]
    a.close()
    b.close()


@pytest.mark.timeout(60)
def test_a_message_of_more_frames_than_one_write_takes_keeps_its_frames(tmp_path):
    run(_many_frames(tmp_path))


async def _frames_are_writable_and_owned(tmp_path) -> None:
    got = []
    arrived = asyncio.Event()

    def on_message(frames):
        got.append(frames)
        arrived.set()

    a, b = await _pair(tmp_path, lambda frames: None, on_message)
    a.send([b"x" * 10, b"y" * 100])
    await arrived.wait()
    arrived.clear()
    a.send([b"z" * 10, b"w" * 100])
    await arrived.wait()
    first, second = got
    # Each message owns its bytes (a later read does not overwrite them) and they are
    # writable, as a zmq.Frame received without copying is.
    assert bytes(first[0]) == b"x" * 10 and bytes(first[1]) == b"y" * 100
    assert bytes(second[0]) == b"z" * 10
    assert not first[1].readonly
    a.close()
    b.close()


def test_received_frames_are_owned_by_their_message(tmp_path):
    run(_frames_are_writable_and_owned(tmp_path))


async def _garbage(tmp_path) -> None:
    closed = asyncio.Event()
    listener = stream.Listener(f"{tmp_path}/g")
    accepted = asyncio.get_running_loop().create_future()
    listener.start(accepted.set_result)
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.connect(f"{tmp_path}/g")
    delivered = []
    channel = stream.StreamChannel(await accepted, delivered.append, closed.set)
    # A length prefix that frames a message whose frame table does not add up.
    raw.sendall(stream._LENGTH.pack(6) + stream._COUNT.pack(1) + stream._U32.pack(99))
    await closed.wait()
    assert channel.closed and delivered == []
    raw.close()
    listener.close()


@pytest.mark.timeout(30)
def test_bytes_that_are_not_the_protocol_close_the_connection(tmp_path):
    run(_garbage(tmp_path))


# --- through the bus -----------------------------------------------------------------------------


def _echo_process(path: str, ready) -> None:
    """A server in its own process that answers each request with its payload."""
    import uvloop

    async def main():
        bus = Bus("replay.0~0", "replay", {}, {"sample": f"ipc://{path}"}, {})
        server = bus.server("sample")
        ready.set()
        async for request in server:
            if request.message.origin < 0:  # die without a word: the client sees EOF
                import os
                os._exit(0)
            await request.reply(Record(request.message.origin, request.message.data))

    uvloop.run(main())


async def _server_process_dies(tmp_path) -> None:
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    path = f"{tmp_path}/srv"
    proc = ctx.Process(target=_echo_process, args=(path, ready))
    proc.start()
    zctx = zmq.asyncio.Context()
    bus = Bus("learner.0~0", "learner", {}, {}, {}, sockets=SocketFactory(zctx))
    try:
        assert await asyncio.to_thread(ready.wait, 30)
        bus.set_peers({}, {"sample": [f"unix://{path}"]})
        client = bus.client("sample")
        for i in range(20):
            reply = await client.request(Record(i, np.full(1000, i)), timeout=10)
            assert reply.message.origin == i and (reply.message.data == i).all()
        answered = client.submit(Record(7, None), timeout=60)  # answered before the exit
        with pytest.raises(ServerGone):  # well before its 60 s: the connection ended
            await client.request(Record(-1, None), timeout=60)
        assert (await answered).message.origin == 7
        assert not client.connections  # still listed, but nothing to send to
        parked = client.submit(Record(8, None), timeout=0.3)
        with pytest.raises(TimeoutError, match="no server for service 'sample'"):
            await parked
    finally:
        bus.close()
        zctx.term()
        proc.join(10)


@pytest.mark.timeout(60)
def test_requests_fail_at_once_when_the_server_process_dies(tmp_path):
    run(_server_process_dies(tmp_path))


async def _reconnects(tmp_path) -> None:
    """A listed server that is not listening yet is tried again; the request made meanwhile
    waits for it (the supervisor lists a server only once it listens, but a test harness or
    a slow restart may not)."""
    zctx = zmq.asyncio.Context()
    client_bus = Bus("learner.0~0", "learner", {}, {}, {}, sockets=SocketFactory(zctx))
    server_bus = None
    task = None
    try:
        endpoint = f"unix://{tmp_path}/late"
        client_bus.set_peers({}, {"sample": [endpoint]})
        client = client_bus.client("sample")
        pending = client.submit(Record(5, np.arange(3)), timeout=20)
        # Nobody listens there: no connection, and the request waits instead of failing.
        assert not client.connections and not pending.done()
        server_bus = Bus("replay.0~0", "replay", {}, {"sample": f"ipc://{tmp_path}/late"}, {},
                         sockets=SocketFactory(zctx))
        server = server_bus.server("sample")

        async def echo():
            async for request in server:
                await request.reply(Record(request.message.origin, request.message.data))

        task = asyncio.ensure_future(echo())
        reply = await pending
        assert reply.message.origin == 5 and list(reply.message.data) == [0, 1, 2]
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        client_bus.close()
        if server_bus is not None:
            server_bus.close()
        zctx.term()


@pytest.mark.timeout(60)
def test_a_server_that_starts_listening_late_is_reached(tmp_path):
    run(_reconnects(tmp_path))


def test_a_service_is_spelled_one_way_from_launch_to_peers(tmp_path):
    """The supervisor's first peers come from the launches, later ones from what each node
    says it bound: both must name a service the same way. When they did not (``ipc://`` in
    the launch, ``unix://`` bound), a resumed learner did not recognise its own state server,
    asked itself for a handover and stopped training; runners reconnected at the next peers
    and asked for the same step twice."""
    import nodes  # noqa: F401 - registers the node kinds the graph names

    graph = graphlib.load(os.path.join(ROOT, "graphs", "dqn_cartpole.yaml"))
    launch = wiring.make_launch(graph, "learner", 0, 0, str(tmp_path), str(tmp_path), None)
    bus = Bus(launch.incarnation, launch.node, {}, launch.bind, {})
    try:
        bound = bus.server("learner_state").endpoint
        assert bound == launch.bind["learner_state"] and bound.startswith("unix://")
        assert wiring.peers(graph, [launch])["services"]["learner_state"] == [bound]
        assert launch.bind["params"].startswith("ipc://")  # topics stay on ZeroMQ
    finally:
        bus.close()
