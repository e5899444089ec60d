"""The graph's types (:class:`Graph`, :class:`NodeSpec`, :class:`TopicDecl`, :class:`RunSpec`,
:class:`RestartPolicy`) and the checks of single values that every part of loading uses, each
mistake one ``file:line: key: message`` (:mod:`pipeline.graphyaml`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import typedconfig as configlib
from pipeline.graphyaml import Lines
from pipeline.topics import HWM_BYTES, RELIABLE, partition_group

NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


@dataclass(frozen=True)
class RestartPolicy:
    policy: str = "on-failure"
    max_failures: int = 5
    window_s: float = 60.0
    backoff_s: float = 0.5
    backoff_max_s: float = 10.0


@dataclass(frozen=True)
class NodeSpec:
    name: str
    kind: str
    replicas: int = 1
    config: dict = field(default_factory=dict)
    publishes: tuple = ()
    subscribes: tuple = ()
    serves: tuple = ()
    calls: tuple = ()
    restart: RestartPolicy = RestartPolicy()
    device: str = "cpu"
    nice: int = 0  # added to the process's niceness: background nodes yield the CPU
    stop_after: tuple = ()  # extra stop-order edges: stop this node only after these stopped
    placement: dict = field(default_factory=dict)  # run.launcher ray: where replicas may run
    # False: when its restarts are exhausted the node ends, is reported, and the run goes on
    # without it (publishers neither wait for it nor keep messages for it: pipeline.wiring).
    critical: bool = True


@dataclass(frozen=True)
class TopicDecl:
    name: str
    delivery: str
    hwm: int
    hwm_bytes: int = HWM_BYTES
    # Each replica of a consumer node is a consumer group of its own ("node/r") and a keyed
    # message goes to replica ``key % replicas`` only (sharded replay: an environment's steps
    # always land in one shard). Consumers with one replica, and other nodes, get everything.
    partitioned: bool = False
    # Small unkeyed messages a node sends in one turn of its loop go as one batch (fewer
    # encodes, counters and acknowledgements: many small messages at the rate of a few).
    coalesce: bool = False


@dataclass(frozen=True)
class RunSpec:
    directory: str = "runs"
    duration_s: float | None = None
    stop_when: tuple = ()
    heartbeat_s: float = 1.0
    heartbeat_timeout_s: float = 30.0
    # Reliable topics drop a member silent this long (its messages go to the rest of its
    # group); above heartbeat_timeout_s, so a stopped node is restarted before it is evicted.
    membership_timeout_s: float = 60.0
    # Nothing moved in the whole graph for this long (pipeline.liveness): the waiting nodes
    # are restarted, and a second stall in a row fails the run. None: not watched.
    stall_timeout_s: float | None = 300.0
    grace_s: float = 15.0
    transport: str = "ipc"
    ready_timeout_s: float = 120.0
    interface: str = "127.0.0.1"  # tcp: where nodes bind (address, interface name or "*")
    insecure: bool = False  # tcp without CURVE (loopback only)
    launcher: str = "local"  # or "ray" (pipeline.launchers)
    ray_address: str = "auto"
    # What reaching duration_s means for a graph with stop_when: "fail" (exit 1: the stop
    # condition was not met in time) or "stop" (a time budget: the run ends, exit 0).
    on_duration: str = "fail"


@dataclass(frozen=True)
class Graph:
    name: str
    source: str
    topics: dict  # name -> TopicDecl
    nodes: dict  # name -> NodeSpec (declaration order)
    run: RunSpec
    services: tuple
    raw: dict  # the resolved YAML data, written to the run directory
    imports: tuple = ()  # modules every process imports first (they register envs, kinds)
    configs: dict = field(default_factory=dict)  # node -> its built config (dataclass or dict)
    ports: dict = field(default_factory=dict)  # node -> its kind's Ports, or None (undeclared)

    def consumer_groups(self, topic: str) -> list[str]:
        """The groups a publisher of ``topic`` delivers to: one per consuming node, or on a
        partitioned topic one per replica (``node/r``), which ``send(msg, key)`` chooses."""
        consumers = [n for n in self.nodes.values() if topic in n.subscribes]
        if not self.topics[topic].partitioned:
            return [n.name for n in consumers]
        return [partition_group(n.name, r) for n in consumers for r in range(n.replicas)]

    def stop_order(self) -> list[list[str]]:
        """Waves of nodes to stop: producers and callers first, so nothing is left in flight.

        A node's ``stop_after`` overrides that: a checkpointer that calls a node it lists
        stops after it (it then carries that node's state over into the final checkpoint)."""
        upstream: dict[str, set[str]] = {name: set() for name in self.nodes}
        for node in self.nodes.values():
            for other in self.nodes.values():
                if other.name == node.name or other.name in node.stop_after:
                    continue
                feeds = any(t in other.subscribes and self.topics[t].delivery == RELIABLE
                            for t in node.publishes)
                calls = any(s in other.serves for s in node.calls)
                if feeds or calls:
                    upstream[other.name].add(node.name)
            upstream[node.name].update(node.stop_after)
        waves, done = [], set()
        while len(done) < len(self.nodes):
            wave = [n for n in self.nodes if n not in done and upstream[n] <= done]
            if not wave:  # a cycle: take the first remaining node in declaration order
                wave = [next(n for n in self.nodes if n not in done)]
            waves.append(wave)
            done.update(wave)
        return waves


def require_mapping(value, path, lines: Lines, allow_none=True) -> dict:
    if value is None and allow_none:
        return {}
    if not isinstance(value, dict):
        raise lines.error(path, f"expected a mapping, got {type(value).__name__}")
    return value


def check_keys(mapping: dict, allowed: set, path, lines: Lines) -> None:
    for key in mapping:
        if key not in allowed:
            raise lines.error((*path, key), f"unknown key (allowed: {', '.join(sorted(allowed))})")


def names_list(value, path, lines: Lines) -> tuple:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise lines.error(path, "expected a list of names")
    if len(set(value)) != len(value):
        raise lines.error(path, "a name is listed twice")
    return tuple(value)


def typed(value, kind, path, lines: Lines, minimum=None):
    try:
        value = configlib.check(kind, value, ".".join(map(str, path)))
    except configlib.ConfigError as exc:
        raise lines.error(path, exc.message) from None
    if minimum is not None and value is not None and value < minimum:
        raise lines.error(path, f"must be >= {minimum}, got {value}")
    return value


def check_name(name, path, lines: Lines) -> None:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise lines.error(path, "names use letters, digits, '_' and '-' and start with a letter")


def key_path(key: str) -> tuple:
    """A dotted key as a path into the YAML (list indices as ints)."""
    return tuple(int(part) if part.isdigit() else part for part in key.split(".") if part)
