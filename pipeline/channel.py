"""A ZeroMQ socket driven straight from the event loop, for request/reply round trips.

Why not zmq.asyncio: every awaited ``send``/``recv`` there builds a future, registers and
drops interest in the socket's events and queries ``EVENTS`` through enum-building wrappers.
For a round trip of small messages that is several times the cost of the messages themselves
(measured between two processes on 2 cores: a bare zmq.asyncio DEALER/ROUTER round trip
about 230 µs and 105 µs of CPU on the caller, the same through a :class:`Channel` under 200 µs
and ~55 µs). The env runner makes one round trip per step of its environments, so this is the
pipeline's critical path.

How: the loop watches the socket's file descriptor. zmq signals on it when the socket's state
may have changed, and a query of ``EVENTS`` both reads the state and re-arms the signal, so the
reader callback drains messages until ``EVENTS`` has no ``POLLIN`` left. A send can consume
the signal of a message that arrived meanwhile, so every send schedules one more drain before
the loop next sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import zmq
import zmq.asyncio

_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
# pyzmq's compiled methods, without the Python wrappers (enums, DRAFT-socket arguments).
_send_frame = zmq.backend.Socket.send
_get_option = zmq.backend.Socket.get


class Channel:
    """Hands every message arriving on ``sock`` to ``on_message(frames)`` (``zmq.Frame``s, no
    copies) as soon as the loop sees it, and sends without waiting.

    The channel must be the socket's only user: nothing may await the asyncio socket's own
    ``send``/``recv`` (they would compete for the same wake-ups). Meant for ROUTER/DEALER
    sockets with no high-water mark, which never block on send; a send raises ``zmq.Again``
    or ``zmq.ZMQError`` like a non-blocking send. A SUB socket may use it to receive only.
    """

    def __init__(self, sock: zmq.asyncio.Socket, on_message: Callable[[list], None]):
        self.sock = sock
        self.on_message = on_message
        self._shadow = zmq.Socket.shadow(sock.underlying)
        self._loop = asyncio.get_running_loop()
        self._fd = self._shadow.FD
        self._drain_due = False
        self._loop.add_reader(self._fd, self._drain)
        self._schedule_drain()  # messages that came before we watched

    def send(self, frames: list) -> None:
        """Send one message now. ``bytes`` frames are copied; other buffers go in place."""
        shadow = self._shadow
        for frame in frames[:-1]:
            _send_frame(shadow, frame, _SNDMORE_NOBLOCK, type(frame) is bytes)
        frame = frames[-1]
        _send_frame(shadow, frame, _NOBLOCK, type(frame) is bytes)
        self._schedule_drain()

    def _schedule_drain(self) -> None:
        if not self._drain_due:
            self._drain_due = True
            self._loop.call_soon(self._drain)

    def drain(self) -> None:
        """Hand over every whole message waiting now. Afterwards libzmq holds no message it
        has started to read: a pipe may then be disconnected safely (see
        :meth:`pipeline.broadcast.BroadcastSubscriber.set_endpoints`)."""
        self._drain()

    def _drain(self) -> None:
        self._drain_due = False
        shadow = self._shadow
        while not shadow.closed and _get_option(shadow, _EVENTS) & _POLLIN:
            self.on_message(shadow.recv_multipart(_NOBLOCK, copy=False))

    def close(self) -> None:
        """Stop watching the socket (closing it stays with whoever made it)."""
        if not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
