"""A node replica's watcher: starts its incarnations, restarts them per the node's restart
policy with exponential backoff, and ends the run on a crash loop, or, for a ``critical: false``
node, gives that node up and lets the run go on (Circus's watcher, one task per replica, no
global lock). The :class:`~pipeline.supervisor.Supervisor` owns the watchers; a
watcher knows it only as a :class:`WatcherHost`, so this module imports nothing above it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Protocol

from pipeline.graph import Graph
from pipeline.node import Launch

log = logging.getLogger("pipeline.supervisor")  # one log for the supervisor and its watchers


class RunFailed(Exception):
    """The run cannot go on (e.g. a node in a crash loop); the message names node and log."""


@dataclass
class Incarnation:
    """One started process of a replica."""

    launch: Launch
    process: asyncio.subprocess.Process | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    finished: bool = False  # its run() returned normally
    failure: str = ""
    last_heartbeat: float = 0.0
    heartbeat: dict = field(default_factory=dict)
    endpoints: dict = field(default_factory=dict)
    said_hello: bool = False  # connected to the control channel: it hears a Stop message
    returncode: int | None = None
    started_at: float = field(default_factory=time.monotonic)


class WatcherHost(Protocol):
    """What a watcher uses of the supervisor that owns it."""

    graph: Graph
    stopping: bool  # the run is ending: nothing is restarted
    failure: str | None  # why the run failed, if it did

    async def launch(self, watcher: Watcher) -> Incarnation: ...

    async def stop_incarnation(self, inc: Incarnation, reason: str) -> None: ...

    def guarded(self, coro, what: str) -> asyncio.Task: ...

    def fail(self, reason: str) -> None: ...

    def give_up(self, watcher: Watcher, reason: str) -> None: ...

    def publish_event(self, watcher: Watcher, event: str, detail: str = "") -> None: ...

    def log_path(self, watcher: Watcher) -> str: ...


def recent_failures(failures: list[float], now: float, window_s: float) -> list[float]:
    """The failure times within ``window_s`` of ``now``, ``now`` included: a crash loop is
    ``max_failures`` of them. Older failures are forgotten, so a long run with rare failures
    never adds up to a crash loop."""
    return [t for t in failures if now - t <= window_s] + [now]


class Watcher:
    """Keeps one replica (``<node>.<replica>``) running according to its restart policy."""

    def __init__(self, sup: WatcherHost, node: str, replica: int, kind: str | None = None,
                 config: dict | None = None, fresh: bool = False, trial: bool = False):
        self.sup, self.node, self.replica = sup, node, replica
        # A trial (a swap's replacement, a replica added by scale) that fails before it was
        # ever ready is refused: the command that started it answers with why, and the run
        # goes on as it was. Once ready it is watched like any other replica.
        self.trial = trial
        self.trial_failure: str | None = None
        # A fresh interpreter per start instead of a fork of the supervisor's fork server:
        # a swapped-in node must run the code on disk now, not what the server imported.
        self.fresh = fresh
        self.instance = f"{node}.{replica}"
        self.kind, self.config = kind, config
        self.current: Incarnation | None = None
        self.failures: list[float] = []
        self.state = "pending"
        self.restarts = 0
        self.given_up = False  # a critical: false node that failed for good; the run goes on
        self.stopping = False
        self.task: asyncio.Task | None = None
        self.done = asyncio.Event()  # the watcher stopped watching (finished, gave up, stopped)
        self.became_ready = asyncio.Event()  # some incarnation said ready
        self.relaunched = asyncio.Event()  # set (and replaced) at each new incarnation

    @property
    def spec(self):
        return self.sup.graph.nodes[self.node]

    async def start(self) -> Incarnation:
        """Launch the replica and wait until an incarnation is ready.

        A node that fails while starting is restarted by its policy like any other failure;
        this returns once one incarnation said ready, and raises RunFailed if the watcher gave
        up (crash loop, policy ``never``) or nothing was ready within ``ready_timeout_s``."""
        try:
            self._set_current(await self.sup.launch(self))
        except Exception as exc:  # noqa: BLE001 - e.g. the run directory, fork, exec
            self.state = "failed"
            self._set_done()
            raise RunFailed(f"node {self.instance} could not start: {type(exc).__name__}: "
                            f"{exc}") from None
        self.state = "starting"
        self.task = self.sup.guarded(self._watch(self.current), f"the watcher of {self.instance}")
        ready = asyncio.ensure_future(self.became_ready.wait())
        gave_up = asyncio.ensure_future(self.done.wait())
        try:
            await asyncio.wait({ready, gave_up}, timeout=self.sup.graph.run.ready_timeout_s,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
            gave_up.cancel()
        if self.became_ready.is_set() or self.state == "finished" or self.given_up:
            return self.current
        if self.done.is_set():
            raise RunFailed(self.trial_failure or self.sup.failure or
                            f"node {self.instance} could not start; see "
                            f"{self.sup.log_path(self)}")
        raise RunFailed(f"node {self.instance} was not ready after "
                        f"{self.sup.graph.run.ready_timeout_s:.0f}s; see "
                        f"{self.sup.log_path(self)}")

    async def _watch(self, inc: Incarnation) -> None:
        policy = self.spec.restart
        while True:
            waits = {asyncio.ensure_future(inc.ready.wait()),
                     asyncio.ensure_future(inc.exited.wait())}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
            if inc.ready.is_set() and not inc.exited.is_set():
                self.state = "running"
                self.became_ready.set()
                await inc.exited.wait()
            if self.stopping or self.sup.stopping:
                break
            failed = not inc.finished or inc.returncode != 0
            if not failed:
                self.state = "finished"
                break
            if self.trial and not self.became_ready.is_set():
                self.state = "failed"
                self.trial_failure = (
                    f"node {self.instance} exited with code {inc.returncode} before it was "
                    f"ready{': ' + inc.failure if inc.failure else ''}; see "
                    f"{self.sup.log_path(self)}")
                break
            if policy.policy == "never":
                self._end_failed("failed", f"node {self.instance} exited with code "
                                 f"{inc.returncode}{': ' + inc.failure if inc.failure else ''} "
                                 f"and its restart policy is 'never'; see "
                                 f"{self.sup.log_path(self)}")
                break
            self.failures = recent_failures(self.failures, time.monotonic(), policy.window_s)
            if len(self.failures) >= policy.max_failures:
                self._end_failed(
                    "crash-loop",
                    f"node {self.instance} failed {len(self.failures)} times within "
                    f"{policy.window_s:.0f}s (last: {inc.failure or f'exit code {inc.returncode}'}"
                    f"); see {self.sup.log_path(self)}")
                break
            delay = min(policy.backoff_max_s, policy.backoff_s * 2 ** (len(self.failures) - 1))
            self.state = "backoff"
            await asyncio.sleep(delay)  # exponential backoff, not a synchronization
            if self.stopping or self.sup.stopping:
                break
            self.restarts += 1
            try:
                inc = await self.sup.launch(self)
            except Exception as exc:  # noqa: BLE001 - a restart that cannot start is reported
                self.state = "failed"
                self.sup.fail(f"node {self.instance} could not be restarted: "
                              f"{type(exc).__name__}: {exc}; see {self.sup.log_path(self)}")
                break
            self._set_current(inc)
            self.state = "starting"
            self.sup.publish_event(self, "restarted", f"attempt {self.restarts}")
        self._set_done()

    def _end_failed(self, state: str, reason: str) -> None:
        """No more restarts: a critical node fails the run; a ``critical: false`` one is
        given up (state ``failed``), reported, and the run goes on without it."""
        if self.spec.critical:
            self.state = state
            self.sup.fail(reason)
        else:
            self.state = "failed"
            self.given_up = True
            self.sup.give_up(self, reason)

    def _set_current(self, inc: Incarnation) -> None:
        self.current = inc
        self.relaunched.set()
        self.relaunched = asyncio.Event()

    def _set_done(self) -> None:
        self.done.set()
        self.relaunched.set()  # no next incarnation will come: wake whoever waits for one

    async def stop(self, reason: str) -> None:
        """Graceful stop of the current incarnation; SIGKILL after the grace period."""
        self.stopping = True
        if self.current is not None:
            await self.sup.stop_incarnation(self.current, reason)
        if self.task is not None:
            self.task.cancel()
        if self.state not in ("finished", "failed", "crash-loop"):
            self.state = "stopped"
        self._set_done()
