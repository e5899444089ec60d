"""The supervisor: one OS process per node replica, watched, restarted, swapped, stopped.

Shaped like Circus: one :class:`Watcher` task per replica with its own restart policy, no global
lock; control commands are handled one function each (:data:`pipeline.commands.COMMANDS`, each
given the supervisor) and answered with data; every lifecycle event is published on
``supervisor.<node>.<event>`` (and appended to ``events.jsonl``).

Start: every node at once. Waiting for peers is the bus's job (a reliable publisher holds
messages until each declared consumer group has joined, a client waits for a server), so start
order cannot lose anything. Processes come from the fork server (:mod:`pipeline.forkserver`),
which holds every node kind's imports already; a swapped-in node is a fresh interpreter.
Stop: :meth:`Graph.stop_order` waves, producers first, each node drained gracefully, then
SIGKILL after ``grace_s``. Nothing is left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import signal
import sys
import time

import zmq

from pipeline import codec, curve, diskio, launchers, liveness, teardown, wiring
from pipeline.commands import COMMANDS
from pipeline.forkserver import ForkServer
from pipeline.graph import Graph
from pipeline.messages import (
    ControlReply,
    ControlRequest,
    Failure,
    Finished,
    Heartbeat,
    Hello,
    Lifecycle,
    Peers,
    Ready,
    Recorded,
    Stop,
)
from pipeline.node import Launch
from pipeline.sockets import SocketFactory, bind, send_now, use_curve
from pipeline.teardown import EXIT_NODE_FAILED, EXIT_OK
from pipeline.watcher import Incarnation, RunFailed, Watcher

log = logging.getLogger(__name__)

STOP_CONDITION = "stop condition"  # a run.stop_when node finished
# A run that failed is stopped with this much grace per wave at most: nothing it would drain
# or checkpoint can make it succeed, and a crash loop should end promptly.
FAILED_GRACE_S = 2.0
# A connected node is stopped by its Stop message, which carries the reason (a store stopped
# for its replacement leaves its state on "swapped"); SIGTERM, which carries none, follows only
# if it has not exited by then. Sent at once, the signal raced the message under load, and a
# swapped store stopped as if the run ended: its replacement started empty.
SIGNAL_AFTER_S = 5.0


def _last_generation(directory: str) -> int:
    """The highest incarnation number an earlier supervisor of this run directory used."""
    numbers = [name[:-5].rpartition("~")[2] for name in os.listdir(directory)
               if name.endswith(".json")]
    return max((int(n) for n in numbers if n.isdigit()), default=0)


class Supervisor:
    """Runs a graph as processes. Use :meth:`run` (returns an exit code)."""

    def __init__(self, graph: Graph, run_dir: str, resume: str | None = None,
                 forkserver: ForkServer | None = None, checked: dict | None = None,
                 secret: str | None = None):
        self.graph, self.run_dir, self.resume = graph, run_dir, resume
        # Control requests from clients must carry it (``run.py`` reads RUN_DIR/secret);
        # None: not checked (tests that drive a Supervisor directly).
        self.secret = secret
        self.forkserver = forkserver  # see pipeline.forkserver; None: fresh interpreters
        # Where and how node processes start (pipeline.launchers): local unless run.launcher.
        self.launcher = launchers.make(graph, forkserver, run_dir)
        self.curve_publics: dict | None = None  # tcp with CURVE: the run's public keys
        self.sock_dir = wiring.run_socket_dir(run_dir)
        self.sockets = SocketFactory()
        self.watchers: dict[str, list[Watcher]] = {n: [] for n in graph.nodes}
        self.incarnations: dict[str, Incarnation] = {}
        self.generation = 0
        self.gone: list[str] = []
        self.stopping = False
        self.failure: str | None = None
        # Why the run ends: STOP_CONDITION, "stop requested", "signal ...", "failure",
        # "duration". Only the stop condition or a stop asked for is a success.
        self.ended_by: str | None = None
        self.ended_node: str | None = None  # the run.stop_when replica whose finish ended it
        self.summary: dict | None = None  # what summary.json holds, once written
        self.stop_event = asyncio.Event()
        self._started = asyncio.Event()  # every node was started (or the run stopped first)
        self.watchers_made = asyncio.Event()  # every node of the graph has its watchers
        self._request_ids = 0
        self._node_requests: dict[int, asyncio.Future] = {}  # commands sent to nodes
        self.started_at = time.monotonic()
        os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
        os.makedirs(os.path.join(run_dir, "launch"), exist_ok=True)
        # Incarnation names are unique in the run directory, across resumes: a consumer tells
        # a redelivery from a new message by (sender incarnation, seq) (pipeline.ledger).
        self.generation = _last_generation(os.path.join(run_dir, "launch"))
        self._events_failed = False
        self._checking = asyncio.Lock()
        self._checked: dict[str, str | None] = dict(checked or {})  # checkpoint -> problem
        self._events_file = open(os.path.join(run_dir, "events.jsonl"), "a")  # noqa: SIM115

    # --- endpoints --------------------------------------------------------------------------

    def _bind(self) -> None:
        teardown.remove_stale_socket_dir(os.path.join(self.run_dir, "endpoints.json"))
        transport = self.graph.run.transport
        if transport == "tcp" and not self.graph.run.insecure:
            self.curve_publics = curve.ensure_keys(self.run_dir, self.graph.nodes)
            use_curve(curve.load(curve.launch_spec(self.run_dir, self.curve_publics,
                                                   curve.SUPERVISOR_KEY)))
        tcp = wiring.tcp_endpoint(self.graph.run.interface)
        ctl = (tcp if transport == "tcp" else f"ipc://{self.sock_dir}/control")
        ev = (tcp if transport == "tcp" else f"ipc://{self.sock_dir}/events")
        self.control = self.sockets.make(zmq.ROUTER, hwm=0, router_mandatory=1)
        self.control_endpoint = bind(self.control, ctl)
        self.events = self.sockets.make(zmq.XPUB, hwm=1000)
        self.events_endpoint = bind(self.events, ev)
        info = {"control": self.control_endpoint, "events": self.events_endpoint,
                "pid": os.getpid(), "graph": self.graph.name}
        teardown.write_json(os.path.join(self.run_dir, "endpoints.json"), info)
        # Scripts and tests read this line to know they can send commands: no polling needed.
        print(f"control: {self.control_endpoint}", file=sys.stderr, flush=True)

    @staticmethod
    def _skipped_checkpoint(line: str) -> None:
        log.error("%s", line)
        print(f"\nwarning: {line}", file=sys.stderr, flush=True)

    def log_path(self, watcher: Watcher) -> str:
        return os.path.join(self.run_dir, "logs", f"{watcher.instance}.log")

    # --- launching --------------------------------------------------------------------------

    async def launch(self, watcher: Watcher) -> Incarnation:
        self.generation += 1
        # A restarted node resumes from the newest intact checkpoint of this run, if any
        # (hashing a large one takes a while: in a thread, one at a time, each verdict cached).
        async with self._checking:
            resume = await asyncio.to_thread(wiring.latest_checkpoint, self.run_dir,
                                             self._skipped_checkpoint, self._checked)
        resume = resume or self.resume
        launch = wiring.make_launch(self.graph, watcher.node, watcher.replica, self.generation,
                                    self.run_dir, self.sock_dir, self.control_endpoint,
                                    kind=watcher.kind, config=watcher.config, resume=resume,
                                    curve=self._curve_spec(watcher.node))
        path = diskio.dump_launch(launch, os.path.join(self.run_dir, "launch",
                                                       f"{launch.incarnation}.json"),
                                  self.sock_dir)
        inc = Incarnation(launch)
        self.incarnations[launch.incarnation] = inc  # before it runs: its hello must find it
        try:
            inc.process = await self.launcher.start(watcher.spec, path, self.log_path(watcher),
                                                    watcher.fresh)
        except BaseException:
            self.incarnations.pop(launch.incarnation, None)  # nothing runs: nothing to stop
            raise
        self.publish_event(watcher, "started", self.launcher.where(inc.process))
        self.guarded(self._reap(watcher, inc), f"reaping {launch.incarnation}")
        return inc

    def _curve_spec(self, node: str) -> dict | None:
        if self.curve_publics is None:
            return None
        return curve.launch_spec(self.run_dir, self.curve_publics, curve.node_key_name(node))

    async def _reap(self, watcher: Watcher, inc: Incarnation) -> None:
        inc.returncode = await inc.process.wait()
        self.gone.append(inc.launch.incarnation)
        self.incarnations.pop(inc.launch.incarnation, None)
        inc.exited.set()
        detail = f"code {inc.returncode}" + (f": {inc.failure}" if inc.failure else "")
        self.publish_event(watcher, "exited", detail)
        self.broadcast_peers()

    async def stop_incarnation(self, inc: Incarnation, reason: str) -> None:
        if inc.exited.is_set() or inc.process is None:  # None: still being placed (ray)
            return
        self._send(inc.launch.incarnation, Stop(reason))
        grace = self.graph.run.grace_s
        if self.ended_by == "failure":
            grace = min(grace, FAILED_GRACE_S)
        deadline = time.monotonic() + grace
        if inc.said_hello:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(inc.exited.wait(), min(SIGNAL_AFTER_S, grace))
        if not inc.exited.is_set():
            with contextlib.suppress(ProcessLookupError):
                inc.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(inc.exited.wait(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            log.warning("%s did not stop within %.0fs: SIGKILL", inc.launch.incarnation, grace)
            launchers.kill(inc.process)
            await inc.exited.wait()

    # --- control channel ------------------------------------------------------------------------

    def _send(self, identity: str, msg) -> None:
        with contextlib.suppress(zmq.ZMQError):
            send_now(self.control, [identity.encode(), *codec.encode(msg, "supervisor")])

    def peers(self) -> Peers:
        launches = []
        for inc in self.incarnations.values():
            launch = inc.launch
            if inc.endpoints:  # use what it really bound (tcp ports)
                launch = Launch(**{**launch.__dict__, "bind": {
                    k: v for k, v in inc.endpoints.items() if k in launch.bind}})
            elif any(ep.endswith(":*") for ep in launch.bind.values()):
                continue  # tcp: its ports are known once it said hello (peers go out again)
            launches.append(launch)
        p = wiring.peers(self.graph, launches)
        return Peers(p["topics"], p["services"], self.gone[-1000:])

    def broadcast_peers(self) -> None:
        peers = self.peers()
        for name in list(self.incarnations):
            self._send(name, peers)

    async def _serve_control(self) -> None:
        handlers = {Hello: self._on_hello, Ready: self._on_ready, Heartbeat: self._on_heartbeat,
                    Failure: self._on_failure, Finished: self._on_finished,
                    ControlReply: self._on_node_reply}
        while True:
            frames = await self.control.recv_multipart(copy=False)
            identity = frames[0].bytes
            try:
                msg = codec.decode(frames[1:]).message
            except codec.ProtocolError as exc:
                log.warning("malformed control message from %r: %s", identity, exc)
                continue
            if isinstance(msg, ControlRequest):
                asyncio.ensure_future(self._on_request(identity, msg))
                continue
            inc = self.incarnations.get(identity.decode(errors="replace"))
            handler = handlers.get(type(msg))
            if inc is not None and handler is not None:
                try:
                    handler(inc, msg)
                except Exception:  # noqa: BLE001 - one bad message must not deafen the run
                    log.exception("control message %s from %s", type(msg).__name__,
                                  inc.launch.incarnation)

    def _on_hello(self, inc: Incarnation, msg: Hello) -> None:
        inc.endpoints = msg.endpoints
        inc.said_hello = True
        inc.last_heartbeat = time.monotonic()
        self.broadcast_peers()  # others learn where it is; it learns where everyone is

    def _on_ready(self, inc: Incarnation, msg: Ready) -> None:
        inc.ready.set()
        watcher = next((w for w in self.watchers[inc.launch.node] if w.current is inc), None)
        if watcher is not None:
            self.publish_event(watcher, "ready", f"{time.monotonic() - inc.started_at:.1f}s "
                                                 "after its start")

    def _on_heartbeat(self, inc: Incarnation, msg: Heartbeat) -> None:
        inc.last_heartbeat = time.monotonic()
        previous = (inc.heartbeat.get("status") or {}).get("warning")
        inc.heartbeat = {"topics": msg.topics, "status": msg.extra}
        warning = msg.extra.get("warning") if isinstance(msg.extra, dict) else None
        if warning != previous:
            self._report_warning(inc, warning, previous)

    def _report_warning(self, inc: Incarnation, warning, previous) -> None:
        """A node's status ``warning`` (e.g. the checkpointer cannot write) is shown on the
        terminal when it appears and when it clears, and published as an event: a node that
        works on in a degraded way must not do so silently."""
        line = (f"{inc.launch.instance}: {warning}" if warning else
                f"{inc.launch.instance}: recovered ({previous})")
        log.warning("%s", line)
        print(f"\nwarning: {line}", file=sys.stderr, flush=True)
        watcher = next((w for w in self.watchers[inc.launch.node] if w.current is inc), None)
        if watcher is not None:
            self.publish_event(watcher, "warning" if warning else "recovered", str(warning or ""))

    def _on_failure(self, inc: Incarnation, msg: Failure) -> None:
        inc.failure = msg.error
        log.error("%s failed: %s", msg.instance, msg.error)
        self._send(inc.launch.incarnation, Recorded(inc.launch.incarnation))

    def _on_finished(self, inc: Incarnation, msg: Finished) -> None:
        inc.finished = True
        inc.heartbeat.setdefault("status", {}).update(msg.summary)
        inc.heartbeat["topics"] = msg.topics
        self._send(inc.launch.incarnation, Recorded(inc.launch.incarnation))

    async def _on_request(self, identity: bytes, req: ControlRequest) -> None:
        args = dict(req.args)
        given = args.pop("_secret", None)
        if self.secret is not None and not (
                isinstance(given, str) and hmac.compare_digest(given, self.secret)):
            reply = _error("unauthorized", "the request does not carry this run's secret "
                                           "(run.py reads it from RUN_DIR/secret)")
        else:
            reply = await self.answer(req.command, args)
        with contextlib.suppress(zmq.ZMQError):
            send_now(self.control, [identity, *codec.encode(reply, "supervisor")])

    async def answer(self, command: str, args: dict) -> ControlReply:
        """Run one control command and always return a reply, errors as data.

        ``args["_timeout_s"]`` is how long the client waits: the reply comes before that, with
        code ``timeout`` if the command is still going on (it is not cancelled half-way, e.g. a
        swap whose replacement is starting; ``status`` shows how it ends)."""
        budget = args.pop("_timeout_s", None)
        handler = COMMANDS.get(command)
        if handler is None:
            return _error("unknown_command", f"unknown command {command!r} (commands: "
                                             f"{', '.join(sorted(COMMANDS))})")
        try:
            work = asyncio.ensure_future(handler(self, **args))
        except TypeError as exc:  # arguments the command does not take
            return _error("bad_request", f"{command}: {exc}")
        work.add_done_callback(_retrieve)
        if budget is not None:
            # Leave the reply time to travel before the client gives up.
            await asyncio.wait({work}, timeout=max(0.1, 0.9 * float(budget) - 0.2))
        else:
            await asyncio.wait({work})
        if not work.done():
            return _error("timeout", f"{command} did not finish within {budget:.0f}s; it goes "
                                     "on in the supervisor (see status)")
        try:
            return ControlReply(True, work.result() or {}, "")
        except RunFailed as exc:
            return _error("run_failed", str(exc))
        except TimeoutError as exc:
            return _error("timeout", f"{command}: {exc or 'timed out'}")
        except (ValueError, KeyError, TypeError) as exc:
            return _error("bad_request", str(exc).strip("'\""))
        except Exception as exc:  # noqa: BLE001 - a reply is owed whatever went wrong
            log.error("control command %s failed", command, exc_info=exc)
            return _error("internal", f"{command} failed: {type(exc).__name__}: {exc}")

    async def ask_nodes(self, command: str, timeout: float) -> dict[str, ControlReply]:
        """Send ``command`` to every running incarnation; return each one's reply.

        Nodes answer through their control channel (a node kind registers the commands it
        takes in its context's ``commands``); one that does not answer within ``timeout`` is
        left out."""
        targets = [inc for inc in list(self.incarnations.values())
                   if inc.ready.is_set() and not inc.exited.is_set()]
        futures = {}
        loop = asyncio.get_running_loop()
        for inc in targets:
            self._request_ids += 1
            futures[inc.launch.instance] = self._node_requests[self._request_ids] = \
                loop.create_future()
            self._send(inc.launch.incarnation,
                       ControlRequest(command, {"id": self._request_ids}))
        try:
            if futures:
                await asyncio.wait(futures.values(), timeout=timeout)
        finally:
            for key in [k for k, f in self._node_requests.items() if f in futures.values()]:
                self._node_requests.pop(key)
        return {name: f.result() for name, f in futures.items() if f.done()}

    def _on_node_reply(self, inc: Incarnation, msg: ControlReply) -> None:
        future = self._node_requests.get(msg.result.get("id"))
        if future is not None and not future.done():
            future.set_result(msg)

    # --- state and events -------------------------------------------------------------------

    async def status(self) -> dict:
        """The run as it is now: every replica's state and last heartbeat, the topics'
        publishers and taps (the ``status`` command, the progress line, ``summary.json``)."""
        nodes = {}
        for name, watchers in self.watchers.items():
            for w in watchers:
                inc = w.current
                nodes[w.instance] = {
                    "state": w.state,
                    "kind": w.kind or self.graph.nodes[name].kind,
                    "pid": inc.process.pid if inc and inc.process else None,
                    "incarnation": inc.launch.incarnation if inc else None,
                    "restarts": w.restarts,
                    "heartbeat_age_s": round(time.monotonic() - inc.last_heartbeat, 2)
                    if inc and inc.last_heartbeat else None,
                    **(inc.heartbeat if inc else {}),
                }
        peers = self.peers()
        taps = {}
        for inc in self.incarnations.values():
            for key, ep in inc.endpoints.items():
                if key.endswith(".tap"):
                    taps.setdefault(key[:-4], []).append(ep)
        return {"graph": self.graph.name, "run_dir": self.run_dir,
                "uptime_s": round(time.monotonic() - self.started_at, 1), "nodes": nodes,
                "topics": {t: {"delivery": d.delivery, "publishers": peers.topics.get(t, []),
                               "taps": taps.get(t, [])}
                           for t, d in self.graph.topics.items()},
                "events": self.events_endpoint,
                "forkserver": {"pid": self.forkserver.pid, "alive": self.forkserver.alive}
                if self.forkserver else None}

    def publish_event(self, watcher: Watcher, event: str, detail: str = "") -> None:
        inc = watcher.current.launch.incarnation if watcher.current else watcher.instance
        msg = Lifecycle(watcher.node, inc, event, detail)
        topic = f"supervisor.{watcher.node}.{event}"
        record = {"t": time.time(), "topic": topic, "instance": inc, "detail": detail}
        try:
            self._events_file.write(json.dumps(record) + "\n")
            self._events_file.flush()
        except (OSError, ValueError) as exc:  # a full or read-only disk: say so once
            if not self._events_failed:
                self._events_failed = True
                print(f"\nwarning: cannot append to events.jsonl: {exc}", file=sys.stderr,
                      flush=True)
        with contextlib.suppress(zmq.ZMQError):
            send_now(self.events, [topic.encode(), *codec.encode(msg, "supervisor")])

    def guarded(self, coro, what: str) -> asyncio.Task:
        """A task of the supervisor's own: if it dies of an exception, the run fails with one
        line saying so (and the teardown leaves no process) instead of going on deaf."""

        def check(task: asyncio.Task) -> None:
            if task.cancelled() or task.exception() is None:
                return
            exc = task.exception()
            log.error("%s failed", what, exc_info=exc)
            self.fail(f"supervisor error in {what}: {type(exc).__name__}: {exc} (traceback in "
                      f"{os.path.join(self.run_dir, 'supervisor.log')})")

        task = asyncio.ensure_future(coro)
        task.add_done_callback(check)
        return task

    def fail(self, reason: str) -> None:
        """The run cannot succeed any more: stop it; it exits 1 with ``reason``."""
        if self.failure is None:
            self.failure = reason
        self.end("failure")

    def give_up(self, watcher: Watcher, reason: str) -> None:
        """A ``critical: false`` node failed for good (crash loop, or policy ``never``): it
        stays down, and the run goes on without it. Said on the terminal, in the log and as
        the event ``supervisor.<node>.failed``; its state in status and summary.json is
        ``failed``."""
        line = f"{reason} (critical: false: the run goes on without it)"
        log.error("%s", line)
        print(f"\nwarning: {line}", file=sys.stderr, flush=True)
        self.publish_event(watcher, "failed", reason)

    def end(self, why: str) -> None:
        """Stop the run; the first reason given is the one that counts."""
        if self.ended_by is None:
            self.ended_by = why
        self.stop_event.set()

    # --- the run --------------------------------------------------------------------------------

    async def _watch_completion(self) -> None:
        """The run ends when any ``run.stop_when`` node finishes its work (exit 0)."""
        stop_when = self.graph.run.stop_when
        if not stop_when:
            await asyncio.Event().wait()
        while not self.stopping:
            watchers = [w for n in stop_when for w in self.watchers[n]]
            finished = next((w for w in watchers if w.state == "finished"), None)
            if finished is not None:
                if self.ended_by is None:
                    self.ended_node = finished.instance
                self.end(STOP_CONDITION)
                return
            if not watchers:
                await self._started.wait()
                continue
            # Swapped watchers are replaced (their done is set too): loop and look again.
            await asyncio.wait([asyncio.ensure_future(w.done.wait()) for w in watchers],
                               return_when=asyncio.FIRST_COMPLETED)

    async def run(self, progress=None) -> int:
        """Start everything, wait for the end condition, stop everything. Returns exit code."""
        # Signal handlers first: _bind prints the "control:" line that tells scripts the run
        # takes commands, and a SIGINT sent right after it must be a clean stop, not a
        # KeyboardInterrupt in the middle of start-up (seen as a run that never exited).
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.end, f"signal {sig.name}")
        self._bind()
        helpers = [self.guarded(self._serve_control(), "the control endpoint"),
                   self.guarded(liveness.heartbeat_watchdog(self), "the heartbeat watchdog"),
                   self.guarded(liveness.progress_watchdog(self), "the progress watchdog"),
                   self.guarded(self._watch_completion(), "the stop condition")]
        if progress is not None:
            helpers.append(self.guarded(progress(self), "the progress line"))
        try:
            try:
                await self._start_all()
            except RunFailed as exc:
                self.fail(str(exc))
            finally:
                self.watchers_made.set()
                self._started.set()
            duration = self.graph.run.duration_s
            try:
                await asyncio.wait_for(self.stop_event.wait(), duration)
            except TimeoutError:
                self.end("duration")
            if self.ended_by == "duration" and self.graph.run.stop_when and \
                    self.graph.run.on_duration == "fail":
                self.failure = (f"the run reached duration_s={duration:g} before its stop "
                                f"condition ({' or '.join(self.graph.run.stop_when)} finished)")
        finally:
            self.stopping = True
            await teardown.clean_up(self, helpers)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        if self.failure:
            return EXIT_NODE_FAILED
        return EXIT_OK

    async def _start_all(self) -> None:
        starts = []
        for name, node in self.graph.nodes.items():
            for r in range(node.replicas):
                w = Watcher(self, name, r)
                self.watchers[name].append(w)
                starts.append(w.start())
        self.watchers_made.set()
        # A stop (SIGINT, an end condition) while nodes are still starting ends the wait.
        everything = asyncio.ensure_future(asyncio.gather(*starts))
        stop = asyncio.ensure_future(self.stop_event.wait())
        try:
            await asyncio.wait({everything, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if everything.done():
            everything.result()

def _error(code: str, reason: str) -> ControlReply:
    """A failed command, as data: a one-line ``reason`` and a ``code`` a client can act on
    (``unknown_command``, ``bad_request``, ``unauthorized``, ``timeout``, ``run_failed``,
    ``internal``)."""
    return ControlReply(False, {"code": code}, reason.splitlines()[0] if reason else code)


def _retrieve(task: asyncio.Future) -> None:
    """A command that outlived its reply may still fail: take its exception so asyncio does
    not report it as never retrieved (the reply already said it timed out)."""
    if not task.cancelled():
        task.exception()
