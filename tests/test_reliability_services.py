"""Callers of a service whose server is restarting wait for it, bounded by their timeout
(issue 11, item 4): the learner died with ``no server for service 'sample'`` when the replay
store was killed. Real sockets, no mocks: the server goes away and a new one (a new endpoint,
as a restarted incarnation gets) comes up while requests are waiting."""

from __future__ import annotations

import asyncio
import select

import numpy as np
import pytest
import zmq
import zmq.asyncio

from pipeline import codec, stream
from pipeline.bus import Bus
from pipeline.messages import Record
from pipeline.sockets import SocketFactory


async def _echo(server) -> None:
    async for request in server:
        msg = request.message
        await request.reply(Record(origin=msg.origin, data=msg.data))


def _server_bus(ctx, endpoint: str, incarnation: int) -> Bus:
    return Bus(f"replay.0~{incarnation}", "replay", {}, {"sample": endpoint}, {},
               sockets=SocketFactory(ctx))


async def _restart(tmp_path) -> None:
    ctx = zmq.asyncio.Context()
    client_bus = Bus("learner.0~0", "learner", {}, {}, {}, sockets=SocketFactory(ctx))
    first = _server_bus(ctx, f"ipc://{tmp_path}/a", 0)
    second = None
    tasks = []
    try:
        server = first.server("sample")
        tasks.append(asyncio.ensure_future(_echo(server)))
        client_bus.set_peers({}, {"sample": [server.endpoint]})
        client = client_bus.client("sample")
        reply = await client.request(Record(1, np.arange(4)), timeout=10)
        assert reply.message.origin == 1
        # The server is killed: the supervisor's Peers says there is none for a while.
        tasks.pop().cancel()
        first.close()
        client_bus.set_peers({}, {"sample": []})
        waiting = [client.submit(Record(i, np.arange(4)), timeout=20) for i in (2, 3)]
        later = asyncio.ensure_future(client.request(Record(4, np.arange(4)), timeout=20))
        await asyncio.sleep(0)  # a scheduling point, not a synchronisation: nothing can arrive
        assert not any(f.done() for f in waiting) and not later.done()
        # Its restart binds a new endpoint and is announced.
        second = _server_bus(ctx, f"ipc://{tmp_path}/b", 1)
        server = second.server("sample")
        tasks.append(asyncio.ensure_future(_echo(server)))
        client_bus.set_peers({}, {"sample": [server.endpoint]})
        replies = await asyncio.gather(*waiting, later)
        assert [r.message.origin for r in replies] == [2, 3, 4]
        assert all(r.sender == "replay.0~1" for r in replies)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        client_bus.close()
        for bus in (first, second):
            if bus is not None:
                bus.close()
        ctx.term()


async def _never(tmp_path) -> None:
    ctx = zmq.asyncio.Context()
    client_bus = Bus("learner.0~0", "learner", {}, {}, {}, sockets=SocketFactory(ctx))
    try:
        client = client_bus.client("sample")
        with pytest.raises(TimeoutError, match="no server for service 'sample' within"):
            await client.submit(Record(1, np.arange(4)), timeout=0.2)
        cancelled = client.submit(Record(2, np.arange(4)), timeout=5)
        cancelled.cancel()
        client_bus.close()  # a parked request never outlives its client
    finally:
        client_bus.close()
        ctx.term()


@pytest.mark.timeout(60)
def test_requests_wait_for_a_restarting_server(tmp_path):
    asyncio.run(_restart(tmp_path))


@pytest.mark.timeout(60)
def test_a_request_with_no_server_fails_only_at_its_timeout(tmp_path):
    asyncio.run(_never(tmp_path))


async def _drain(tmp_path) -> None:
    """Over tcp: a plain ZeroMQ ROUTER driven by hand."""
    ctx = zmq.asyncio.Context()
    client_bus = Bus("learner.0~0", "learner", {}, {}, {}, sockets=SocketFactory(ctx))
    server = zmq.Context.instance().socket(zmq.ROUTER)  # a plain server, driven by hand
    server.setsockopt(zmq.LINGER, 0)
    server.bind("tcp://127.0.0.1:*")
    endpoint = server.getsockopt_string(zmq.LAST_ENDPOINT)
    try:
        client_bus.set_peers({}, {"sample": [endpoint]})
        client = client_bus.client("sample")
        future = client.submit(Record(1, np.arange(4)), timeout=10)
        assert server.poll(10_000), "the request never reached the server"
        routing_id, request_id, *_ = server.recv_multipart()
        server.send_multipart([routing_id, request_id,
                               *codec.encode(Record(1, np.arange(4)), "replay.0~0")])
        # The reply is on the client's socket; the event loop has not run since.
        assert zmq.Socket.shadow(client.connections[endpoint].underlying).poll(10_000)
        assert not future.done()
        client.drain()
        assert future.done() and future.result().message.origin == 1
    finally:
        server.close()
        client_bus.close()
        ctx.term()


async def _drain_unix(tmp_path) -> None:
    """On one machine: a plain Unix socket driven by hand (pipeline.stream's framing)."""
    ctx = zmq.asyncio.Context()
    client_bus = Bus("learner.0~0", "learner", {}, {}, {}, sockets=SocketFactory(ctx))
    path = f"{tmp_path}/s"
    listener = stream.listen(path)
    listener.setblocking(True)
    endpoint = f"unix://{path}"
    conn = None
    try:
        client_bus.set_peers({}, {"sample": [endpoint]})
        client = client_bus.client("sample")
        future = client.submit(Record(1, np.arange(4)), timeout=10)
        conn, _ = listener.accept()
        conn.settimeout(10)
        request_id, *_ = stream.read_message(conn)
        reply = [bytes(request_id), *codec.encode(Record(1, np.arange(4)), "replay.0~0")]
        conn.sendall(b"".join([stream.frame_header(reply)[0], *reply]))
        # The reply is on the client's socket; the event loop has not run since.
        poller = select.poll()
        poller.register(client.connections[endpoint].fileno(), select.POLLIN)
        assert poller.poll(10_000)
        assert not future.done()
        client.drain()
        assert future.done() and future.result().message.origin == 1
    finally:
        if conn is not None:
            conn.close()
        listener.close()
        client_bus.close()
        ctx.term()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_drain_completes_a_reply_that_is_waiting_without_the_event_loop(tmp_path, transport):
    asyncio.run(_drain(tmp_path) if transport == "tcp" else _drain_unix(tmp_path))
