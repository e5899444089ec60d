"""The supervisor's control commands, one handler each (``cmd_<name>(supervisor, **args)``),
answered as data: what ``run.py status|wait_ready|checkpoint|stop|restart|swap|scale`` asks of
a running graph. Kept apart from :mod:`pipeline.supervisor` (processes, peers, heartbeats, the
run's life) as the part a user drives. As in Circus (``execute(arbiter, props)``), a handler
receives the supervisor; :data:`COMMANDS` maps each command's name to its handler and
:meth:`~pipeline.supervisor.Supervisor.answer` looks it up there. This module knows the
supervisor only as :class:`CommandHost`, so the imports run one way: supervisor -> commands ->
watcher.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Protocol

import yaml

import typedconfig as configlib
from pipeline import kinds
from pipeline.graph import Graph, resolve_kind
from pipeline.graphnodes import MAX_REPLICAS
from pipeline.graphyaml import GraphError
from pipeline.messages import ControlReply
from pipeline.watcher import RunFailed, Watcher, WatcherHost


class CommandHost(WatcherHost, Protocol):
    """What the commands use of the supervisor, besides what its watchers use."""

    watchers: dict[str, list[Watcher]]  # node -> its replicas' watchers, in replica order
    watchers_made: asyncio.Event  # every node of the graph has its watchers

    async def status(self) -> dict: ...

    async def ask_nodes(self, command: str, timeout: float) -> dict[str, ControlReply]: ...

    def end(self, why: str) -> None: ...


async def cmd_status(supervisor: CommandHost) -> dict:
    return await supervisor.status()


async def cmd_wait_ready(supervisor: CommandHost, node: str | None = None,
                         timeout: float = 300.0) -> dict:
    """Answer once every replica of ``node`` (or of every node) is running and ready."""
    names = [node] if node else list(supervisor.graph.nodes)
    for name in names:
        _watchers_of(supervisor, name)

    async def all_ready():
        # A node's watchers exist once the run began starting it; then every current
        # incarnation of the nodes asked about must say ready (swaps, restarts).
        await supervisor.watchers_made.wait()
        while True:
            watchers = [w for n in names for w in supervisor.watchers[n]]
            if not watchers:
                raise RunFailed(f"{', '.join(names)} did not start (see status)")
            waits = []
            for w in watchers:
                inc = w.current
                # An incarnation that exited while its watcher goes on (a crash, a restart
                # under way) is not ready: wait for the next one.
                if inc is not None and inc.ready.is_set() and \
                        (not inc.exited.is_set() or w.done.is_set()):
                    continue
                if w.done.is_set():
                    raise RunFailed(f"{w.instance} stopped before it was ready "
                                    f"(state {w.state}); see {supervisor.log_path(w)}")
                waits += [w.relaunched.wait(), w.done.wait()]
                if inc is not None:
                    waits += [inc.ready.wait(), inc.exited.wait()]
            if not waits:
                return
            tasks = [asyncio.ensure_future(c) for c in waits]
            try:
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in tasks:
                    t.cancel()

    await asyncio.wait_for(all_ready(), timeout)
    return {"ready": names}


async def cmd_checkpoint(supervisor: CommandHost, timeout: float = 600.0) -> dict:
    """Ask the nodes that write checkpoints (those that take the ``checkpoint`` command) for
    one now; answer with the path of what each wrote."""
    replies = await supervisor.ask_nodes("checkpoint", timeout)
    done = {name: r.result.get("path") for name, r in replies.items() if r.ok}
    errors = [f"{name}: {r.reason}" for name, r in replies.items()
              if not r.ok and r.result.get("code") != "unknown_command"]
    if errors:
        raise RunFailed("checkpoint failed: " + "; ".join(errors))
    if not done:
        raise ValueError("no running node writes checkpoints (the graph has no "
                         "checkpointer, or it is not running)")
    return {"paths": done, "path": next(iter(done.values()))}


async def cmd_stop(supervisor: CommandHost) -> dict:
    supervisor.end("stop requested")
    return {"stopping": True}


async def cmd_restart(supervisor: CommandHost, node: str) -> dict:
    watchers = _watchers_of(supervisor, node)
    for w in watchers:
        await _replace(supervisor, w, w.kind, w.config, "restarted")
    return {"restarted": [w.instance for w in watchers]}


async def cmd_swap(supervisor: CommandHost, node: str, kind: str | None = None,
                   config: dict | None = None,
                   set: list | None = None) -> dict:  # noqa: A002 - the CLI flag's name
    """Make-before-break: start the replacement, wait until ready, then stop the old one."""
    watchers = _watchers_of(supervisor, node)
    spec = supervisor.graph.nodes[node]
    new_kind = kind or watchers[0].kind or spec.kind
    new_config = dict(config if config is not None else (watchers[0].config or spec.config))
    for item in set or []:
        key, _, value = item.partition("=")
        new_config[key] = yaml.safe_load(value)
    try:
        _, config_cls = resolve_kind(new_kind)
    except GraphError as exc:  # an unknown kind is the user's mistake: one line, exit 2
        raise ValueError(f"swap of {node} refused: {exc.message}") from None
    built = new_config
    if config_cls is not None:
        try:
            built = configlib.build(config_cls, new_config)
        except configlib.ConfigError as exc:
            raise ValueError(f"nodes.{node}.config.{exc}") from None
    _check_swapped(supervisor.graph, node, new_kind, built)  # refused before anything changes
    for w in watchers:
        await _replace(supervisor, w, new_kind, new_config, "swapped")
    return {"swapped": [w.instance for w in watchers], "kind": new_kind,
            "config": new_config}


async def cmd_scale(supervisor: CommandHost, node: str, replicas: int) -> dict:
    watchers = _watchers_of(supervisor, node)
    if not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be an integer >= 1, got {replicas!r}")
    _check_scaled(supervisor.graph, node, replicas)  # refused before anything changes
    while len(watchers) < replicas:
        w = Watcher(supervisor, node, len(watchers), watchers[0].kind, watchers[0].config,
                    trial=True)
        watchers.append(w)
        try:
            await w.start()
        except RunFailed as exc:
            watchers.remove(w)
            await w.stop("could not start")
            raise RunFailed(f"scale of {node} stopped at {len(watchers)} replicas: "
                            f"{exc}") from None
    while len(watchers) > replicas:
        w = watchers.pop()
        await w.stop("scaled down")
    return {"node": node, "replicas": len(watchers)}


# Every command a client may send, by name; the handler takes the supervisor and the request's
# arguments as keywords (one it does not take is a bad request).
COMMANDS: dict[str, Callable[..., Awaitable[dict]]] = {
    "status": cmd_status,
    "wait_ready": cmd_wait_ready,
    "checkpoint": cmd_checkpoint,
    "stop": cmd_stop,
    "restart": cmd_restart,
    "swap": cmd_swap,
    "scale": cmd_scale,
}


def _watchers_of(supervisor: CommandHost, node: str) -> list[Watcher]:
    if node not in supervisor.watchers:
        raise ValueError(f"unknown node {node!r} (nodes: {', '.join(supervisor.watchers)})")
    return supervisor.watchers[node]


async def _replace(supervisor: CommandHost, old: Watcher, kind, config, event: str) -> None:
    if _exclusive(supervisor, old):
        await _replace_after_stop(supervisor, old, kind, config, event)
        return
    replacement = Watcher(supervisor, old.node, old.replica, kind, config, fresh=True,
                          trial=True)
    try:
        await replacement.start()  # ready before the old one is asked to stop
    except RunFailed as exc:
        await replacement.stop("could not start")
        raise RunFailed(f"{_verb(event)} of {old.instance} refused, it keeps running: "
                        f"{exc}") from None
    watchers = supervisor.watchers[old.node]
    watchers[watchers.index(old)] = replacement
    replacement.restarts = old.restarts
    await old.stop(event)
    supervisor.publish_event(replacement, event, replacement.current.launch.incarnation)


def _exclusive(supervisor: CommandHost, w: Watcher) -> bool:
    """Whether the running incarnation holds what its replacement needs (its kind's
    ``exclusive(config)``, e.g. a memory-mapped replay store's locked files)."""
    spec = supervisor.graph.nodes[w.node]
    kind = kinds.resolve(w.kind or spec.kind)
    if kind.exclusive is None:
        return False
    config = w.config or spec.config
    return bool(kind.exclusive(configlib.build(kind.config_cls, config)
                               if kind.config_cls else config))


async def _replace_after_stop(supervisor: CommandHost, old: Watcher, kind, config,
                              event: str) -> None:
    """Break before make: the old incarnation stops cleanly (acknowledges what it
    handled, releases its files) and the replacement takes over what it left; meanwhile
    reliable producers hold their messages and callers wait for the service. A replacement
    that cannot start is replaced in turn by the node as it was."""
    watchers = supervisor.watchers[old.node]
    index = watchers.index(old)
    await old.stop(event)
    replacement = Watcher(supervisor, old.node, old.replica, kind, config, fresh=True,
                          trial=True)
    watchers[index] = replacement
    replacement.restarts = old.restarts
    try:
        await replacement.start()
    except RunFailed as exc:
        await replacement.stop("could not start")
        again = Watcher(supervisor, old.node, old.replica, old.kind, old.config)
        watchers[index] = again
        again.restarts = old.restarts
        await again.start()
        raise RunFailed(f"{_verb(event)} of {old.instance} refused: {exc}; it was started "
                        f"again as it was") from None
    supervisor.publish_event(replacement, event, replacement.current.launch.incarnation)


def _verb(event: str) -> str:
    return {"swapped": "swap", "restarted": "restart"}.get(event, event)


def control_commands() -> set[str]:
    """Every command a client may send: one handler each in :data:`COMMANDS`."""
    return set(COMMANDS)


def _check_swapped(graph: Graph, node: str, kind: str, config) -> None:
    """A swap to a config the graph checks refuse at load (a learner's batch the replay store
    can never fill) is refused the same way, before anything changes: accepted, it would leave
    every node healthy and nothing moving."""
    swapped = dataclasses.replace(
        graph, nodes={**graph.nodes, node: dataclasses.replace(graph.nodes[node], kind=kind)},
        configs={**graph.configs, node: config})
    _run_checks(swapped, f"swap of {node}")


def _run_checks(graph: Graph, what: str) -> None:
    for check in kinds.graph_checks():
        try:
            check(graph)
        except configlib.ConfigError as exc:
            raise ValueError(f"{what} refused: {exc.key}: {exc.message}") from None


def _check_scaled(graph: Graph, node: str, replicas: int) -> None:
    """Issue 11: a scale that cannot work is refused before anything changes. The graph as it
    would be after the scale goes through the limits and every registered graph check (e.g. a
    replay store's num_environments against the env runners' env ids)."""
    if replicas > MAX_REPLICAS:
        raise ValueError(f"scale of {node} to {replicas} refused: at most {MAX_REPLICAS} "
                         f"replicas")
    for topic in graph.nodes[node].subscribes:
        if graph.topics[topic].partitioned:
            raise ValueError(f"scale of {node} to {replicas} refused: it consumes the "
                             f"partitioned topic {topic!r}, whose partitions are fixed when "
                             f"the run starts (restart the run with the new replicas)")
    scaled = dataclasses.replace(
        graph, nodes={**graph.nodes,
                      node: dataclasses.replace(graph.nodes[node], replicas=replicas)})
    _run_checks(scaled, f"scale of {node} to {replicas}")
