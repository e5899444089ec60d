"""Message types of the pipeline itself: control, heartbeats, failures, lifecycle events.

Every payload is a frozen dataclass registered with :func:`message`, which gives it a wire
``kind`` tag. The codec (:mod:`pipeline.codec`) is the only place that turns these into bytes;
it checks on decode that the kind is known and that the fields match this declaration.

RL payloads (time steps, experience, parameters...) are declared the same way in
``nodes/messages.py``: the pipeline knows nothing about RL, only about the registry.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

SCHEMA_VERSION = 2  # of the wire format (pipeline.codec): 2 is the fixed binary header

_REGISTRY: dict[str, type] = {}
# The same registry keyed by the kind's utf-8 bytes, as it is on the wire (for the codec).
WIRE_KINDS: dict[bytes, type] = {}


def message(kind: str):
    """Class decorator: make ``cls`` a frozen dataclass and register it under ``kind``."""

    def wrap(cls):
        cls = dataclasses.dataclass(frozen=True)(cls)
        _set_fields_directly(cls)
        if kind in _REGISTRY and _REGISTRY[kind].__qualname__ != cls.__qualname__:
            raise ValueError(f"message kind {kind!r} declared twice")
        cls.KIND = kind
        _REGISTRY[kind] = cls
        WIRE_KINDS[kind.encode()] = cls
        return cls

    return wrap


def fills_its_dict(cls) -> bool:
    """Whether building dataclass ``cls`` only sets its fields, so that filling a new
    instance's ``__dict__`` builds the same object: no ``__post_init__``, no slots, every
    field an ``__init__`` argument (the codec builds received messages that way too)."""
    return (not hasattr(cls, "__post_init__") and "__slots__" not in cls.__dict__
            and all(f.init and f.name.isidentifier() for f in dataclasses.fields(cls)))


def _set_fields_directly(cls) -> None:
    """Give a frozen dataclass an ``__init__`` that fills its ``__dict__``: the same object
    (the same signature and defaults), built in a third of the time.

    Why: a frozen dataclass's own ``__init__`` sets each field through
    ``object.__setattr__``; ``Record(origin=i, data=a)`` took 0.72 µs, filling the dict 0.35
    µs, which matters where small messages are made by the hundred thousand a second. Only
    where the two are the same: no ``__post_init__``, slots, default factories, keyword-only
    or non-init fields (anything else keeps the dataclass's ``__init__``).
    """
    fields = dataclasses.fields(cls)
    if (not fields or not fills_its_dict(cls)
            or any(f.kw_only or f.default_factory is not dataclasses.MISSING for f in fields)):
        return
    names = [f.name for f in fields]
    if {"_self_", "_state_"} & set(names):  # the generated function's own names
        return
    source = (f"def __init__(_self_, {', '.join(names)}):\n    _state_ = _self_.__dict__\n"
              + "".join(f"    _state_[{name!r}] = {name}\n" for name in names))
    namespace: dict = {}
    exec(source, namespace)  # dataclass field names are identifiers
    init, generated = namespace["__init__"], cls.__init__
    init.__defaults__ = generated.__defaults__
    init.__annotations__ = generated.__annotations__
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    cls.__init__ = init


def message_class(kind: str) -> type | None:
    """The dataclass registered under ``kind``, or None."""
    return _REGISTRY.get(kind)


def registered_kinds() -> list[str]:
    return sorted(_REGISTRY)


class Message:
    """Marker base so type hints can say 'any message'."""

    KIND: ClassVar[str] = ""


# --- many messages as one ----------------------------------------------------------------------


@message("batch")
class Batch(Message):
    """Several messages published as one (``ReliablePublisher.send_many``): one sequence number,
    one credit, one acknowledgement, redelivered whole if its consumer goes away. A reliable
    subscriber hands the items out one by one and acknowledges the batch once it is asked past
    the last. ``items``: ``[kind, *field values]`` per message (:func:`pipeline.batch_codec.wire_messages`).
    Why: small messages cost a Python encode, decode and bookkeeping each; a batch pays them
    once for all its items."""

    items: list


# --- data on demo topics -----------------------------------------------------------------------


@message("record")
class Record(Message):
    """A numbered array: the payload of the demo graph and of the bus benchmarks.

    ``origin`` is the sequence number assigned by the first producer, so a sink can check
    completeness across any number of transforming hops.
    """

    origin: int
    data: Any


# --- node <-> supervisor -----------------------------------------------------------------------


@message("hello")
class Hello(Message):
    """First message a node sends on its control channel, with the endpoints it bound."""

    instance: str
    pid: int
    endpoints: dict


@message("ready")
class Ready(Message):
    """A node's sockets are connected and its state restored: dependents may start."""

    instance: str


@message("heartbeat")
class Heartbeat(Message):
    """Periodic liveness plus the numbers an operator wants: per-topic counters and depths."""

    instance: str
    topics: dict
    extra: dict


@message("failure")
class Failure(Message):
    """A node raised: sent before the process exits non-zero, so the reason is never lost."""

    instance: str
    error: str
    traceback: str


@message("finished")
class Finished(Message):
    """A node's ``run`` returned normally; ``summary`` is whatever it chose to report and
    ``topics`` its final bus counters (messages, gaps)."""

    instance: str
    summary: dict
    topics: dict


@message("recorded")
class Recorded(Message):
    """Supervisor -> node: its ``Finished`` or ``Failure`` was recorded, so it may exit. Why a
    reply: a node's exit can reach the supervisor (the fork server reports it at once) before
    the last control message does, and then a finished node would look like a crash."""

    instance: str


@message("peers")
class Peers(Message):
    """Supervisor -> node: the current publisher/server endpoints for every topic/service,
    and the instances that exited (their unacknowledged reliable messages are redelivered)."""

    topics: dict
    services: dict
    gone: list


@message("stop")
class Stop(Message):
    """Supervisor -> node: finish cleanly (drain reliable inputs, flush outputs) and exit 0."""

    reason: str


# The reasons of a Stop that a replacement follows (``run.py swap``, ``run.py restart``): the
# stopped incarnation may leave its state for it (``NodeContext.replaced``).
REPLACED = ("swapped", "restarted")


# --- control endpoint (run.py <-> supervisor) -------------------------------------------------


@message("control.request")
class ControlRequest(Message):
    """A command for the supervisor: status, stop, restart, swap, scale, checkpoint."""

    command: str
    args: dict


@message("control.reply")
class ControlReply(Message):
    """Replies are data: ``ok`` plus either ``result`` or a one-line ``reason``."""

    ok: bool
    result: dict
    reason: str


@message("lifecycle")
class Lifecycle(Message):
    """Published by the supervisor on ``supervisor.<node>.<event>``."""

    node: str
    instance: str
    event: str
    detail: str


# --- reliable topic protocol (see pipeline.bus) ----------------------------------------------


@message("bus.join")
class Join(Message):
    """Subscriber -> publisher: I consume ``topic`` in ``group`` and grant ``credit`` messages
    and ``credit_bytes`` bytes (envelopes plus array frames) in flight."""

    topic: str
    group: str
    instance: str
    credit: int
    credit_bytes: int
    token: str = ""  # must equal the run's secret where the publisher has one
    # A member that was evicted and joins again (told so by the publisher): the messages it
    # still holds unacknowledged on this connection, which it acknowledges first, in order.
    holding: int = 0


@message("bus.credit")
class Credit(Message):
    """Subscriber -> publisher: the next ``acked`` messages were handled; grant their credit
    (one message each, and their bytes) again. ``acked`` 0 is a keepalive: a member silent for
    ``reliable.MEMBER_TIMEOUT_S`` is dropped and its messages go to the rest of its group."""

    topic: str
    acked: int


@message("bus.leave")
class Leave(Message):
    """Subscriber -> publisher: send me nothing more; reply with LeaveAck once that holds."""

    topic: str


@message("bus.leave_ack")
class LeaveAck(Message):
    """Publisher -> subscriber: nothing follows this on ``topic`` (FIFO per connection)."""

    topic: str

