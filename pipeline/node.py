"""Node runtime: runs one node instance, as its own process or as a task in a shared loop.

A node kind is ``async def run(config, node, ready)``. The runtime builds its typed config, a
:class:`NodeContext` (``node.bus`` wired to the graph, ``node.stopping``, ``node.status``,
``node.info``), and a control channel to the supervisor; then:

* ``ready()`` is sent to the supervisor when the node calls it (sockets connected, state
  restored), so dependents start only after that;
* heartbeats carry the bus counters (messages, gaps, depths) and ``node.status``;
* on ``Stop`` (or SIGTERM) ``node.stopping`` is set and reliable subscriptions leave, so a node's
  input loop ends after draining; the runtime then waits until everything the node published
  reliably was acknowledged, and exits 0;
* if ``run`` raises, a :class:`Failure` with the exception goes to the supervisor before the
  process exits 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import traceback
from dataclasses import asdict, dataclass, field

import zmq

import typedconfig as configlib
from pipeline import codec, gcpolicy, kinds, reliable
from pipeline.bus import Bus, TopicSpec
from pipeline.diskio import QuietFileHandler
from pipeline.ledger import Ledger
from pipeline.messages import (
    REPLACED,
    ControlReply,
    ControlRequest,
    Failure,
    Finished,
    Heartbeat,
    Hello,
    Peers,
    Ready,
    Recorded,
    Stop,
)
from pipeline.sockets import SocketFactory, send_now

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED = 0, 1


@dataclass
class Launch:
    """Everything one node instance needs to start; written as JSON by the supervisor."""

    instance: str  # "<node>.<replica>", stable across restarts
    incarnation: str  # unique per start, e.g. "transformer.0~3"
    node: str
    replica: int
    kind: str
    config: dict
    topics: dict  # topic -> {"delivery", "hwm"}
    bind: dict  # topic or service -> endpoint this incarnation binds
    consumer_groups: dict  # topic -> groups that consume it
    run_dir: str
    device: str = "cpu"
    nice: int = 0  # niceness increment, applied by the process itself at start
    control: str | None = None  # supervisor endpoint; None in-loop
    peers: dict = field(default_factory=lambda: {"topics": {}, "services": {}})
    heartbeat_s: float = 1.0
    grace_s: float = 15.0
    membership_timeout_s: float = 60.0  # reliable topics: a member silent this long is dropped
    resume: str | None = None  # checkpoint directory to restore from, if resuming
    subscribes: list = field(default_factory=list)
    calls: list | None = None  # services the graph entry lists; None: not checked
    curve: dict | None = None  # tcp: public keys and key file paths (pipeline.curve)
    imports: list = field(default_factory=list)  # the graph's imports:, before the kind
    workdir: str | None = None  # the supervisor's working directory, put on sys.path

    def dump(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(asdict(self), f, indent=1)

    @classmethod
    def read(cls, path: str) -> Launch:
        with open(path) as f:
            return cls(**json.load(f))


@dataclass(frozen=True)
class NodeInfo:
    """Where a node instance runs."""

    node: str  # its name in the graph
    instance: str  # "<node>.<replica>", stable across restarts
    replica: int
    run_dir: str
    device: str
    resume: str | None  # checkpoint directory to restore from, if resuming


class NodeContext:
    """Everything a node kind gets besides its config: ``run(config, node, ready)``.

    Why an object of its own: the bus is the transport; when to stop, what to report and where
    the node runs belong to the runtime, and a node should not patch them onto the bus.
    """

    def __init__(self, bus: Bus, info: NodeInfo, stopping: asyncio.Event | None = None):
        self.bus = bus
        self.info = info
        self.stopping = stopping or asyncio.Event()  # set when the node should finish
        self.status: dict = {}  # plain values, reported in every heartbeat
        # Commands the supervisor may send this node (``run.py checkpoint``): name -> async
        # function of the command's arguments returning a dict.
        self.commands: dict = {}
        self._stopped: asyncio.Future | None = None
        self.stop_reason: str | None = None  # the supervisor's, with its Stop
        self._ledgers: list[Ledger] = []

    @property
    def replaced(self) -> bool:
        """Stopped to make room for a replacement (a swap or a restart by command), which
        may take over what this incarnation leaves."""
        return self.stop_reason in REPLACED

    def ledger(self, topic: str, role: str) -> Ledger | None:
        """This replica's ledger of ``topic`` in ``role`` (``sent`` or ``stored``; see
        :mod:`pipeline.ledger`), or None when the node runs without a run directory."""
        if not self.info.run_dir:
            return None
        ledger = Ledger(self.info.run_dir, topic, self.info.instance, role)
        self._ledgers.append(ledger)
        # A disk that refuses the ledger (full, failing) is a status warning, shown on the
        # terminal, and a consumer holds its acknowledgements until the records are written.
        ledger.on_trouble = self._ledger_trouble
        if role == "stored":
            self.bus.hold_acks(ledger)
            ledger.on_written = self.bus.on_output_acknowledged
        return ledger

    def _ledger_trouble(self, message: str | None) -> None:
        if message is not None:
            self.status["warning"] = message
        elif self.status.get("warning", "").startswith("ledger "):
            del self.status["warning"]

    def close_ledgers(self, acknowledged: bool) -> None:
        """At the end: with everything it published acknowledged, this incarnation's sent
        ledgers say so (a sender without that mark ended uncleanly: see ``reconcile``)."""
        for ledger in self._ledgers:
            if acknowledged and ledger.path.endswith(".sent"):
                ledger.close_sender(self.bus.instance)
            ledger.close()
        self._ledgers.clear()

    async def wait_or_stop(self, aw, timeout: float | None = None, cancel: bool = True):
        """The result of ``aw``, or None if the node is asked to stop first.

        On stop ``aw`` is cancelled unless ``cancel`` is false (then the caller keeps it, e.g. a
        request future it will cancel with others). After ``timeout`` seconds ``aw`` is
        cancelled and TimeoutError raised. One future watches ``stopping`` for the node's
        whole life, so this costs one ``asyncio.wait`` per call, not a task per call.
        """
        future = asyncio.ensure_future(aw)
        if self._stopped is None:
            self._stopped = asyncio.ensure_future(self.stopping.wait())
        if not future.done():
            if self.stopping.is_set():
                if cancel:
                    future.cancel()
                return None
            done, _ = await asyncio.wait((future, self._stopped), timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
            if future not in done:
                if cancel or not done:
                    future.cancel()
                if not done:
                    raise TimeoutError(f"no result within {timeout}s")
                return None
        return future.result()

    def close(self) -> None:
        if self._stopped is not None:
            self._stopped.cancel()
        self.close_ledgers(acknowledged=False)


class NodeFailed(Exception):
    pass


async def run_instance(launch: Launch, sockets: SocketFactory | None = None,
                       stop: asyncio.Event | None = None, on_ready=None) -> dict:
    """Run one node instance to completion; return its summary or raise NodeFailed.
    ``on_ready()`` runs when the node reports ready (a node process settles its garbage
    collector there: :mod:`pipeline.gcpolicy`).

    The graph's ``imports:`` come first, whichever way this process started (a fork of the
    fork server has them already; a fresh interpreter or a Ray worker imports them here):
    they may register the kind, its message types or the environment it steps. A module that
    does not import, or a kind that does not resolve, fails the node with one line."""
    sockets = sockets or SocketFactory()
    reliable.set_member_timeout(launch.membership_timeout_s)
    topics = {name: TopicSpec(**spec) for name, spec in launch.topics.items()}
    bus = Bus(launch.incarnation, launch.node, topics, launch.bind, launch.consumer_groups,
              sockets=sockets, subscriptions=tuple(launch.subscribes), replica=launch.replica,
              listed={"subscribes": list(launch.subscribes),
                      **({"calls": list(launch.calls)} if launch.calls is not None else {})})
    node = NodeContext(bus, NodeInfo(launch.node, launch.instance, launch.replica,
                                     launch.run_dir, launch.device, launch.resume), stop)
    control = _Control(launch, node, sockets)
    try:
        kinds.import_modules(launch.imports, launch.workdir)
        kind = kinds.resolve(launch.kind)
        config = (configlib.build(kind.config_cls, launch.config) if kind.config_cls
                  else dict(launch.config))
        bus.bind_all()  # eagerly, so the supervisor can tell subscribers where to connect
        await control.start()

        def ready() -> None:
            if on_ready is not None:
                on_ready()
            control.send(Ready(launch.incarnation))

        async with asyncio.TaskGroup() as tasks:
            helpers = [tasks.create_task(control.listen()),
                       tasks.create_task(control.heartbeats()),
                       tasks.create_task(_leave_on_stop(node))]
            try:
                summary = await kind.run(config, node, ready)
                # Done for good: say so to every publisher, which then stops waiting for this
                # group at its own end (a consumer that vanishes without a Leave was killed,
                # and they wait for its replacement).
                bus.leave_all()
                # Not for groups whose consumers all left (a learner that finished its
                # budget): none will come back for what this process holds, and waiting
                # would last until the supervisor's SIGKILL. What they did not take is
                # counted as lost with this publisher in the ledger.
                flushed = await bus.flush(launch.grace_s, present_only=True)
                left = bus.pending()  # held for groups whose consumers are gone
                if not flushed:
                    log.error("%s: reliable messages still unacknowledged after %.0fs",
                              launch.incarnation, launch.grace_s)
                elif left:
                    log.warning("%s: %d reliable messages left for consumers that are gone",
                                launch.incarnation, left)
                node.close_ledgers(acknowledged=flushed and not left)
            finally:
                for helper in helpers:
                    helper.cancel()
        summary = summary if isinstance(summary, dict) else {}
        await control.send_last(Finished(launch.incarnation, _plain(summary), bus.stats()))
        return summary
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # report why before dying: heartbeats only catch hangs
        error = _describe(exc)
        log.error("%s failed: %s", launch.incarnation, error, exc_info=exc)
        await control.send_last(Failure(launch.incarnation, error, traceback.format_exc()))
        raise NodeFailed(error) from exc
    finally:
        node.close()
        bus.close()
        sockets.close_all()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _describe(exc.exceptions[0])
    return f"{type(exc).__name__}: {exc}"


def _plain(value):
    """Summaries travel in msgpack maps: keep only plain data."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return str(value)


async def _leave_on_stop(node: NodeContext) -> None:
    await node.stopping.wait()
    node.bus.leave_all()


class _Control:
    """The node's DEALER to the supervisor (absent in-loop, where peers are given up front)."""

    def __init__(self, launch: Launch, node: NodeContext, sockets: SocketFactory):
        self.launch, self.node, self.bus = launch, node, node.bus
        self.sock = None
        if launch.control:
            self.sock = sockets.make(zmq.DEALER, hwm=0,
                                     routing_id=launch.incarnation.encode())
            self.sock.connect(launch.control)

    def send(self, msg) -> None:
        if self.sock is not None and not self.sock.closed:
            send_now(self.sock, codec.encode(msg, self.launch.incarnation))

    async def send_last(self, msg, timeout_s: float = 5.0) -> None:
        """Send the node's last word (``Finished``/``Failure``) and wait until the supervisor
        recorded it; a supervisor that is gone costs at most ``timeout_s``."""
        if self.sock is None or self.sock.closed:
            return
        self.send(msg)
        with contextlib.suppress(TimeoutError, zmq.ZMQError, codec.ProtocolError):
            async with asyncio.timeout(timeout_s):
                while not isinstance(reply := await self._recv(), Recorded):
                    self._handle(reply)

    async def start(self) -> None:
        if self.sock is None:
            self.bus.set_peers(**self.launch.peers)
            return
        self.send(Hello(self.launch.incarnation, os.getpid(), self.bus.bound_endpoints()))
        # The supervisor answers Hello with the current peers; nothing can be wired before.
        while True:
            msg = await self._recv()
            if isinstance(msg, Peers):
                self.bus.set_peers(msg.topics, msg.services, msg.gone)
                return
            self._handle(msg)

    async def _recv(self):
        frames = await self.sock.recv_multipart(copy=False)
        return codec.decode(frames).message

    async def listen(self) -> None:
        if self.sock is None:
            await asyncio.Event().wait()
        while True:
            try:
                msg = await self._recv()
            except codec.ProtocolError as exc:
                log.warning("%s: malformed control message: %s", self.launch.incarnation, exc)
                continue
            self._handle(msg)

    def _handle(self, msg) -> None:
        if isinstance(msg, Peers):
            self.bus.set_peers(msg.topics, msg.services, msg.gone)
        elif isinstance(msg, Stop):
            log.info("%s: stop requested (%s)", self.launch.incarnation, msg.reason)
            self.node.stop_reason = msg.reason
            self.node.stopping.set()
        elif isinstance(msg, ControlRequest):
            asyncio.ensure_future(self._command(msg))

    async def _command(self, req: ControlRequest) -> None:
        args = dict(req.args)
        result = {"id": args.pop("id", None)}
        handler = self.node.commands.get(req.command)
        try:
            if handler is None:
                result["code"] = "unknown_command"
                raise LookupError(f"no command {req.command!r}")
            result.update(await handler(**args) or {})
            self.send(ControlReply(True, result, ""))
        except Exception as exc:  # noqa: BLE001 - the supervisor is owed a reply
            result.setdefault("code", "internal")
            self.send(ControlReply(False, result, f"{self.launch.instance}: {_describe(exc)}"))

    async def heartbeats(self) -> None:
        if self.sock is None:
            await asyncio.Event().wait()
        while True:
            self.send(Heartbeat(self.launch.incarnation, self.bus.stats(),
                                _plain(self.node.status)))
            await asyncio.sleep(self.launch.heartbeat_s)  # a period, not a synchronization


def configure_logging(log_path: str | None, instance: str) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_path:
        handlers = [QuietFileHandler(log_path)]
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True,
                        format=f"%(asctime)s {instance} %(levelname)s %(name)s: %(message)s")


def process_main(launch_path: str, log_path: str | None = None) -> int:
    """Entry point of a node process (``run.py node LAUNCH_JSON``)."""
    import uvloop

    gcpolicy.configure()
    launch = Launch.read(launch_path)
    if launch.nice:
        os.nice(launch.nice)
    configure_logging(log_path, launch.incarnation)
    if launch.curve:
        from pipeline import curve, sockets

        sockets.use_curve(curve.load(launch.curve))
    log.info("starting %s (kind %s, pid %d)", launch.incarnation, launch.kind, os.getpid())

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        # Signal handlers only set the stop event; the node drains and exits on its own.
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await run_instance(launch, stop=stop, on_ready=gcpolicy.settle)
        except NodeFailed:
            return EXIT_FAILED
        return EXIT_OK

    profile_dir = os.environ.get("CONDUIT_PROFILE_DIR")
    if profile_dir:  # opt-in: one cProfile dump per incarnation, for finding hot spots
        import cProfile
        import time

        profiler = cProfile.Profile(time.thread_time)  # CPU of this thread, not waiting
        code = profiler.runcall(uvloop.run, main())
        os.makedirs(profile_dir, exist_ok=True)
        profiler.dump_stats(os.path.join(profile_dir, f"{launch.incarnation}.prof"))
    else:
        code = uvloop.run(main())
    log.info("%s exiting with code %d", launch.incarnation, code)
    with contextlib.suppress(Exception):
        logging.shutdown()
    return code
