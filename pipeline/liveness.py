"""Liveness of a whole run: a graph in which nothing moves is noticed, and a run that was
frozen (a paused container, a suspended laptop) is not taken for a dead one.

Heartbeats say that each process runs; they do not say that the graph gets anywhere. A run
whose nodes all wait on one another (an evicted consumer that never rejoined, a learner's
batch the replay store can never fill) stays "healthy" for hours. :class:`ProgressWatch` adds
up what the nodes report in their heartbeats: messages published and consumed on reliable
topics (the pipeline knows those), and the status values a kind declares as progress
(:func:`pipeline.kinds.register_progress`: a learner's version, a runner's env steps; the
pipeline does not know what they mean). When the sum stays still for ``run.stall_timeout_s``
of the supervisor's own awake time, the run has stalled: it names the nodes that wait and on
what, restarts them (a fresh process joins, connects and asks again), and after
``STALLS_BEFORE_FAILING`` stalls in a row stops the run with exit 1 and that line.

:class:`Ticker` measures how long a periodic loop was not running beyond its period: the
supervisor judges heartbeats and progress against its own wake-up, so a run stopped as a
whole and resumed restarts nothing.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time

from pipeline import kinds, launchers
from pipeline.topics import RELIABLE

log = logging.getLogger("pipeline.supervisor")

STALLS_BEFORE_FAILING = 2  # a stall right after the waiting nodes were restarted ends the run


class Ticker:
    """For a loop that wakes every ``period`` seconds: :meth:`tick` returns how long the
    process was not running since the last tick beyond one period (0 normally). A loop that
    wakes more than a period late was stopped (SIGSTOP, a frozen cgroup, a suspended machine)
    or blocked: what it measures of others must not count that time."""

    def __init__(self, period: float):
        self.period = period
        self.last = time.monotonic()

    def tick(self) -> float:
        now = time.monotonic()
        elapsed, self.last = now - self.last, now
        late = elapsed - self.period
        return late if late > self.period else 0.0


def _counters(heartbeat: dict, reliable: set, keys: tuple) -> tuple[int, dict]:
    """(progress of one incarnation, its inputs: "topic 'x'" / "service 'y'" -> count).
    Service replies are not progress: a checkpointer's state calls are answered by nodes
    that are otherwise stuck."""
    total, inputs = 0, {}
    for part, stats in (heartbeat.get("topics") or {}).items():
        role, _, name = part.partition(":")
        if role == "pub" and name in reliable:
            total += int(stats.get("sent", 0))
        elif role == "sub" and name in reliable:
            total += int(stats.get("received", 0))
            inputs[f"topic {name!r}"] = stats.get("received", 0)
        elif role == "cli":
            inputs[f"service {name!r}"] = stats.get("received", 0)
    status = heartbeat.get("status") or {}
    for key in keys:
        value = status.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            total += int(value)
    return total, inputs


def progress_keys(kind: str, cache: dict) -> tuple:
    if kind not in cache:
        try:
            cache[kind] = kinds.progress_of(kind)
        except Exception:  # noqa: BLE001 - a kind that does not resolve here declares nothing
            cache[kind] = ()
    return cache[kind]


class ProgressWatch:
    """Tells, once per period, whether the graph moved; see the module docstring."""

    def __init__(self, graph, stall_timeout_s: float):
        self.graph, self.timeout = graph, stall_timeout_s
        self.reliable = {name for name, t in graph.topics.items() if t.delivery == RELIABLE}
        # incarnation -> its progress when last seen. A new one's first figure is its
        # baseline, not movement: a restarted node reports what it restored, and a restart
        # alone must not pass for the graph moving again.
        self.seen: dict[str, int] = {}
        self.keys: dict[str, tuple] = {}  # kind -> its progress keys
        self.still_s = 0.0  # awake time since the graph last moved
        self.stalls = 0  # stalls in a row (without progress in between)

    def observe(self, watchers, awake_s: float) -> list | None:
        """Called every period with the supervisor's watchers and the awake time since the
        last call. Returns None, or on a stall the (watcher, waits) of the nodes that wait
        on an input (reliable topic or service)."""
        moved, waiting, seen = False, [], {}
        for watcher in watchers:
            inc = watcher.current
            if inc is None or inc.exited.is_set() or not inc.ready.is_set() or inc.finished \
                    or not inc.heartbeat:
                continue
            name = inc.launch.incarnation
            keys = progress_keys(watcher.kind or self.graph.nodes[watcher.node].kind, self.keys)
            seen[name], inputs = _counters(inc.heartbeat, self.reliable, keys)
            if seen[name] > self.seen.get(name, seen[name]):
                moved = True
            if inputs:
                waiting.append((watcher, [self._peer(label) for label in sorted(inputs)]))
        self.seen = seen
        if moved:
            self.still_s, self.stalls = 0.0, 0
            return None
        self.still_s += awake_s
        if self.still_s < self.timeout:
            return None
        self.still_s = 0.0
        self.stalls += 1
        return waiting

    def _peer(self, label: str) -> str:
        """``topic 'x'`` -> ``topic 'x' from <its publishers>``; a service, ``of <servers>``."""
        kind, _, quoted = label.partition(" ")
        name = quoted.strip("'")
        section, word = ("publishes", "from") if kind == "topic" else ("serves", "of")
        peers = [n for n, spec in self.graph.nodes.items() if name in getattr(spec, section)]
        return f"{label} {word} {', '.join(peers)}" if peers else label

    def describe(self, waiting: list) -> str:
        if not waiting:
            return "no node waits on an input"
        return "; ".join(f"{w.instance} waits on {', '.join(what)}" for w, what in waiting)


async def heartbeat_watchdog(sup) -> None:
    """SIGKILL for an incarnation silent past ``run.heartbeat_timeout_s`` (its watcher
    restarts it). Silence counts only while the supervisor ran: after a freeze of the whole
    run, every node's last heartbeat is moved on by the time the supervisor was stopped, and
    the beats they send on waking arrive before anybody is judged again."""
    run = sup.graph.run
    ticker = Ticker(run.heartbeat_s)
    while True:
        await asyncio.sleep(run.heartbeat_s)  # a period, not a synchronization
        asleep = ticker.tick()
        now = time.monotonic()
        for inc in list(sup.incarnations.values()):
            if asleep and inc.last_heartbeat:
                inc.last_heartbeat = min(now, inc.last_heartbeat + asleep)
            silent = now - inc.last_heartbeat
            if inc.last_heartbeat and silent > run.heartbeat_timeout_s and \
                    not inc.exited.is_set():
                log.error("%s sent no heartbeat for %.0fs: killing it",
                          inc.launch.incarnation, silent)
                inc.failure = f"no heartbeat for {silent:.0f}s"
                launchers.kill(inc.process)


async def progress_watchdog(sup) -> None:
    """Reports and acts on a graph that stopped moving (see the module docstring): first the
    waiting nodes are restarted (SIGKILL; their watchers restart them per their policy, and
    what they held is redelivered), then a stall in a row fails the run with the line."""
    timeout = sup.graph.run.stall_timeout_s
    if timeout is None:
        return
    period = min(sup.graph.run.heartbeat_s, timeout / 4)
    ticker, watch = Ticker(period), ProgressWatch(sup.graph, timeout)
    last = time.monotonic()
    while not sup.stopping:
        await asyncio.sleep(period)  # a period, not a synchronization
        asleep = ticker.tick()
        now = time.monotonic()
        awake, last = max(0.0, now - last - asleep), now
        if sup.stopping:
            return
        waiting = watch.observe([w for ws in sup.watchers.values() for w in ws], awake)
        if waiting is None:
            continue
        line = (f"nothing moved for {timeout:g}s (run.stall_timeout_s): "
                f"{watch.describe(waiting)}")
        if watch.stalls >= STALLS_BEFORE_FAILING or not waiting:
            sup.fail(f"the graph stalled{' again' if watch.stalls > 1 else ''}: {line}")
            return
        log.error("%s; restarting the waiting nodes", line)
        print(f"\nwarning: {line}; restarting the waiting nodes", file=sys.stderr, flush=True)
        for watcher, what in waiting:
            inc = watcher.current
            sup.publish_event(watcher, "stalled", f"waits on {', '.join(what)}")
            if inc is not None and not inc.exited.is_set():
                inc.failure = f"stalled: waited {timeout:g}s on {', '.join(what)}"
                launchers.kill(inc.process)
