"""The graph spec: YAML in, a validated frozen :class:`Graph` out.

Every mistake becomes one :class:`GraphError` line naming file, line and key, e.g.::

    graphs/bad.yaml:12: nodes.sink.kind: unknown node kind 'snk' (known: demo_sink, ...)

Node kinds are registered with :mod:`pipeline.kinds` (the ``nodes`` package registers its modules);
a kind may also be ``package.module:function`` for user code.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import tempfile
from dataclasses import dataclass, field

import yaml

import typedconfig as configlib
from pipeline import graphyaml, kinds, ports
from pipeline.graphyaml import GraphError, Lines
from pipeline.topics import DELIVERY_CLASSES, HWM_BYTES, RELIABLE, partition_group

NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
RESTART_POLICIES = ("always", "on-failure", "never")

TOP_KEYS = {"name", "description", "imports", "topics", "services", "nodes", "run"}
TOPIC_KEYS = {"delivery", "hwm", "hwm_bytes", "partitioned", "coalesce"}
MAX_REPLICAS = 64  # per node: each replica is a process on this machine
IPC_PATH_MAX = 107  # bytes in a unix socket path (sun_path, with its NUL)
# Room an ipc endpoint needs besides the node and topic names: the socket directory (the temp
# directory plus a short per-run name), ".<replica>~<generation up to 6 digits>.", ".tap".
IPC_DIR_ROOM = 25
IPC_NAME_ROOM = len(".00~000000..tap")
NODE_KEYS = {"kind", "replicas", "config", "publishes", "subscribes", "serves", "calls",
             "restart", "device", "nice", "description", "stop_after", "placement",
             "critical"}
RESTART_KEYS = {"policy", "max_failures", "window_s", "backoff_s", "backoff_max_s"}
RUN_KEYS = {"directory", "duration_s", "stop_when", "heartbeat_s", "heartbeat_timeout_s",
            "grace_s", "transport", "ready_timeout_s", "interface", "insecure", "launcher",
            "ray_address", "on_duration"}
ON_DURATION = ("fail", "stop")
PLACEMENT_KEYS = {"num_cpus", "num_gpus", "memory", "resources", "labels"}
LOOPBACK = ("127.0.0.1", "localhost", "lo", "::1")


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


def load(path: str, overrides: list[str] | tuple = (), seed_offset: int = 0) -> Graph:
    """Read, override (``key.path=value``), and validate a graph file; ``seed_offset`` as
    :func:`parse`."""
    try:
        with open(path, "rb") as f:
            raw = f.read(graphyaml.MAX_GRAPH_BYTES + 1)  # never more: the file may be huge
    except OSError as exc:
        raise GraphError(path, None, "", f"cannot read graph: {exc.strerror}") from None
    if len(raw) > graphyaml.MAX_GRAPH_BYTES:
        raise GraphError(path, None, "", f"graph file is larger than "
                         f"{graphyaml.MAX_GRAPH_BYTES} bytes")
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise GraphError(path, None, "", f"not UTF-8 text (byte {exc.start})") from None
    return parse(text, path, overrides, seed_offset)


def parse(text: str, source: str = "<graph>", overrides: list[str] | tuple = (),
          seed_offset: int = 0) -> Graph:
    """``seed_offset`` is added to every node's ``seed`` (:func:`_offset_seeds`)."""
    data, lines = graphyaml.read(text, source)
    if not isinstance(data, dict):
        raise GraphError(source, 1, "", "a graph must be a mapping with name, topics, nodes")
    for override in overrides:
        _apply_override(data, override, lines)
    graph = _validate(data, lines)
    if seed_offset:
        _offset_seeds(data, graph.configs, seed_offset)
        graph = _validate(data, lines)
    return graph


def _offset_seeds(data: dict, configs: dict, offset: int) -> None:
    """Add ``offset`` to the integer ``seed`` of every node config that has one, written in
    the graph or defaulted by its kind: ``run.py run GRAPH --seed N`` is another run of the
    same graph and ``--seed 0`` the graph as written. The seeds land in the resolved data, so
    the run directory's ``graph.yaml`` records them and a resume keeps them."""
    for name, config in configs.items():
        seed = config.get("seed") if isinstance(config, dict) else getattr(config, "seed", None)
        if isinstance(seed, int) and not isinstance(seed, bool):
            spec = data["nodes"][name]
            if not isinstance(spec.get("config"), dict):
                spec["config"] = {}
            spec["config"]["seed"] = seed + offset


def _apply_override(data: dict, override: str, lines: Lines) -> None:
    if "=" not in override:
        raise GraphError(lines.source, None, override, "--set expects key.path=value")
    key, _, raw = override.partition("=")
    path = key.strip().split(".")
    try:
        value = graphyaml.read_value(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    target = data
    for i, part in enumerate(path[:-1]):
        if not isinstance(target, dict) or part not in target:
            known = ", ".join(map(str, target)) if isinstance(target, dict) else ""
            raise GraphError(lines.source, None, ".".join(path[: i + 1]),
                             f"--set: no such key (known: {known})")
        if target[part] is None:
            target[part] = {}
        target = target[part]
    if not isinstance(target, dict):
        raise GraphError(lines.source, None, key, "--set: parent is not a mapping")
    target[path[-1]] = value


def _require_mapping(value, path, lines: Lines, allow_none=True) -> dict:
    if value is None and allow_none:
        return {}
    if not isinstance(value, dict):
        raise lines.error(path, f"expected a mapping, got {type(value).__name__}")
    return value


def _check_keys(mapping: dict, allowed: set, path, lines: Lines) -> None:
    for key in mapping:
        if key not in allowed:
            raise lines.error((*path, key), f"unknown key (allowed: {', '.join(sorted(allowed))})")


def _names(value, path, lines: Lines) -> tuple:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise lines.error(path, "expected a list of names")
    if len(set(value)) != len(value):
        raise lines.error(path, "a name is listed twice")
    return tuple(value)


def _typed(value, kind, path, lines: Lines, minimum=None):
    try:
        value = configlib.check(kind, value, ".".join(map(str, path)))
    except configlib.ConfigError as exc:
        raise lines.error(path, exc.message) from None
    if minimum is not None and value is not None and value < minimum:
        raise lines.error(path, f"must be >= {minimum}, got {value}")
    return value


def _validate(data: dict, lines: Lines) -> Graph:
    # ``x-...`` keys hold YAML anchors shared by several nodes (docker-compose's convention).
    data = {k: v for k, v in data.items() if not str(k).startswith("x-")}
    imports = _import_modules(data.get("imports"), lines)  # first: they may register kinds
    _check_keys(data, TOP_KEYS | set(kinds.sections()), (), lines)
    sections = _validate_sections(data, lines)
    name = data.get("name")
    if name is None:
        raise lines.error(("name",), "required key is missing")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise lines.error(("name",), "must be a name of letters, digits, '_' or '-'")

    topics = {}
    for tname, tspec in _require_mapping(data.get("topics"), ("topics",), lines).items():
        path = ("topics", tname)
        _check_name(tname, path, lines)
        tspec = _require_mapping(tspec, path, lines)
        _check_keys(tspec, TOPIC_KEYS, path, lines)
        delivery = tspec.get("delivery")
        if delivery not in DELIVERY_CLASSES:
            raise lines.error((*path, "delivery"),
                              f"must be one of {', '.join(DELIVERY_CLASSES)}, got {delivery!r}")
        hwm = _typed(tspec.get("hwm", 1000), int, (*path, "hwm"), lines, minimum=1)
        if "hwm_bytes" in tspec and delivery != RELIABLE:
            raise lines.error((*path, "hwm_bytes"), f"only reliable topics queue messages; a "
                              f"{delivery} topic drops or replaces them")
        hwm_bytes = _typed(tspec.get("hwm_bytes", HWM_BYTES), int, (*path, "hwm_bytes"), lines,
                           minimum=1)
        partitioned = _typed(tspec.get("partitioned", False), bool, (*path, "partitioned"), lines)
        if partitioned and delivery != RELIABLE:
            raise lines.error((*path, "partitioned"), f"only reliable topics have consumer "
                              f"groups to partition; a {delivery} topic goes to every subscriber")
        coalesce = _typed(tspec.get("coalesce", False), bool, (*path, "coalesce"), lines)
        if coalesce and delivery != RELIABLE:
            raise lines.error((*path, "coalesce"), f"only reliable topics batch what they "
                              f"send; a {delivery} topic sends each message as it comes")
        topics[tname] = TopicDecl(tname, delivery, hwm, hwm_bytes, partitioned, coalesce)

    raw_nodes = _require_mapping(data.get("nodes"), ("nodes",), lines)
    if not raw_nodes:
        raise lines.error(("nodes",), "a graph needs at least one node")
    nodes, configs, declared, stated = {}, {}, {}, {}
    for nname, nspec in raw_nodes.items():
        nodes[nname], configs[nname], declared[nname] = _validate_node(
            str(nname), nspec, topics, sections, lines)
        stated[nname] = {key for key in ports.SECTIONS if key in nspec}
    _default_ports(nodes, declared, stated, topics)

    published = {t for n in nodes.values() for t in n.publishes}
    served = {s for n in nodes.values() for s in n.serves}
    for n in nodes.values():
        for i, t in enumerate(n.subscribes):
            if t not in published:
                raise lines.error(("nodes", n.name, "subscribes", i),
                                  f"topic {t!r} is subscribed but no node publishes it")
        for i, s in enumerate(n.calls):
            if s not in served:
                raise lines.error(("nodes", n.name, "calls", i),
                                  f"service {s!r} is called but no node serves it")
        for i, s in enumerate(n.serves):
            if s in topics:
                raise lines.error(("nodes", n.name, "serves", i),
                                  f"{s!r} is already a topic; services need their own names")
    for n in nodes.values():
        for i, other in enumerate(n.stop_after):
            if other not in nodes or other == n.name:
                raise lines.error(("nodes", n.name, "stop_after", i),
                                  f"unknown node {other!r}" if other != n.name else
                                  "a node cannot stop after itself")
    for tname in topics:
        if tname not in published:
            raise lines.error(("topics", tname), "topic is declared but no node publishes it")
    _check_stop_after_cycles(nodes, lines)

    for n in nodes.values():  # after the structure: the kinds' declared ports
        if declared[n.name] is None:
            continue
        mismatch = ports.check_node(n.kind, declared[n.name],
                                    {key: getattr(n, key) for key in ports.SECTIONS})
        if mismatch is not None:
            section, index, message = mismatch
            path = ("nodes", n.name, section)
            raise lines.error(path if index is None else (*path, index), message, key=path)
    mismatch = ports.check_types({n: p for n, p in declared.items() if p is not None}, nodes)
    if mismatch is not None:
        node, section, index, message = mismatch
        raise lines.error(("nodes", node, section, index), message,
                          key=("nodes", node, section))

    run = _validate_run(_require_mapping(data.get("run"), ("run",), lines), nodes, lines)
    _check_critical(nodes, topics, run, lines)
    graph = Graph(name=name, source=lines.source, topics=topics, nodes=nodes, run=run,
                  services=tuple(sorted(served)), raw=copy.deepcopy(data), configs=configs,
                  ports=declared, imports=imports)
    for check in kinds.graph_checks():
        try:
            check(graph)
        except configlib.ConfigError as exc:
            raise lines.error(_key_path(exc.key), exc.message) from None
    return graph


def _import_modules(value, lines: Lines) -> tuple:
    """The graph's ``imports:``: module names imported here, at load, before any kind or
    section is resolved (they register environments, node kinds, graph checks), and again by
    every node process (:class:`pipeline.node.Launch`). The working directory is importable
    (:func:`pipeline.kinds.import_modules`), also when the list is empty: ``module:function``
    kinds and ``module:EnvId`` ids name modules too."""
    names = _names(value, ("imports",), lines)
    kinds.import_modules(())
    for i, name in enumerate(names):
        try:
            kinds.import_modules([name])
        except kinds.ImportFailed as exc:
            raise lines.error(("imports", i), str(exc)) from None
    return names


def _check_critical(nodes: dict, topics: dict, run: RunSpec, lines: Lines) -> None:
    """A ``critical: false`` node may end for good while the run goes on: the run cannot wait
    for it to finish, and it cannot hold a partition of a topic (its share would be lost)."""
    for i, name in enumerate(run.stop_when):
        if not nodes[name].critical:
            raise lines.error(("run", "stop_when", i), f"node {name!r} is critical: false "
                              f"(the run goes on without it), so it cannot end the run")
    for node in nodes.values():
        for topic in node.subscribes if not node.critical else ():
            if topics[topic].partitioned:
                raise lines.error(("nodes", node.name, "critical"), f"a critical: false node "
                                  f"cannot consume the partitioned topic {topic!r} (the "
                                  f"partition it holds would be lost with it)")


def _default_ports(nodes: dict, declared: dict, stated: dict, topics: dict) -> None:
    """A kind's declared ports are its defaults: a section a node entry leaves out is every
    port of that section the kind declares that the graph can wire (a declared topic; a topic
    some other node publishes; a service some node serves). So a graph states bindings only
    where they differ from the kinds' declarations and reads as the system diagram; an
    explicit list, ``[]`` included, is taken as written."""
    def fill(section: str, wired) -> None:
        for name, node in nodes.items():
            if section in stated[name] or declared[name] is None:
                continue
            names = tuple(p for p in declared[name].section(section) if wired(name, p))
            nodes[name] = dataclasses.replace(node, **{section: names})

    fill("serves", lambda node, service: service not in topics)
    fill("publishes", lambda node, topic: topic in topics)
    published = {t for n in nodes.values() for t in n.publishes}
    served = {s for n in nodes.values() for s in n.serves}
    fill("subscribes", lambda node, topic: topic in published and
         topic not in nodes[node].publishes)
    fill("calls", lambda node, service: service in served)


def _check_name(name, path, lines: Lines) -> None:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise lines.error(path, "names use letters, digits, '_' and '-' and start with a letter")


def _validate_sections(data: dict, lines: Lines) -> dict[str, tuple[object, dict]]:
    """Each top-level section the node kinds registered (:func:`pipeline.kinds.
    register_section`) that the graph states: ``name -> (built config, raw mapping)``, built
    once here for every node that takes it."""
    out = {}
    for name, cls in kinds.sections().items():
        if name not in data:
            continue
        raw = _require_mapping(data[name], (name,), lines, allow_none=False)
        try:
            out[name] = (configlib.build(cls, raw, name), raw)
        except configlib.ConfigError as exc:
            raise lines.error(_key_path(exc.key), exc.message) from None
    return out


def _with_sections(name: str, kind: str, config_cls: type | None, raw_config: dict,
                   sections: dict, lines: Lines) -> tuple[dict, dict]:
    """The node's config with the graph's sections its kind takes: ``(raw, to build)``. The
    raw one (plain data) is what the node's process gets and builds again; the other holds the
    section already built here. A node may not state a section, or a section's keys, itself:
    the error names the key to move."""
    path = ("nodes", name, "config")
    takes = [f.name for f in dataclasses.fields(config_cls) if f.name in kinds.sections()] \
        if config_cls is not None and dataclasses.is_dataclass(config_cls) else []
    if not takes:
        return raw_config, raw_config
    own = {f.name for f in dataclasses.fields(config_cls)}
    for section in takes:
        if section in raw_config:
            raise lines.error((*path, section), f"the {section} is stated once for the whole "
                              f"graph: move it to the top-level {section}: section")
        section_keys = {f.name for f in dataclasses.fields(kinds.sections()[section])}
        for key in raw_config:
            if key in section_keys and key not in own:
                raise lines.error((*path, key), f"belongs to the graph's top-level {section}: "
                                  f"section ({section}.{key}), stated once for every node")
    raw, built = dict(raw_config), dict(raw_config)
    for section in takes:
        if section in sections:
            built[section], raw[section] = sections[section][0], copy.deepcopy(sections[section][1])
        elif config_cls.__dataclass_fields__[section].default is dataclasses.MISSING and \
                config_cls.__dataclass_fields__[section].default_factory is dataclasses.MISSING:
            raise lines.error(("nodes", name, "kind"), f"kind {kind!r} needs the graph's "
                              f"top-level {section}: section")
    return raw, built


def _validate_node(name: str, spec, topics: dict, sections: dict, lines: Lines) -> NodeSpec:
    path = ("nodes", name)
    _check_name(name, path, lines)
    spec = _require_mapping(spec, path, lines, allow_none=False)
    _check_keys(spec, NODE_KEYS, path, lines)
    kind = spec.get("kind")
    if not isinstance(kind, str) or not kind:
        raise lines.error((*path, "kind"), "required: the node kind (a registered kind or "
                          "package.module:function)")
    resolved = _resolve(kind, lines, (*path, "kind"))
    replicas = _typed(spec.get("replicas", 1), int, (*path, "replicas"), lines, minimum=1)
    if replicas > MAX_REPLICAS:
        raise lines.error((*path, "replicas"), f"must be <= {MAX_REPLICAS}, got {replicas}")
    raw_config, with_sections = _with_sections(
        name, kind, resolved.config_cls,
        _require_mapping(spec.get("config"), (*path, "config"), lines), sections, lines)
    try:
        config = (configlib.build(resolved.config_cls, with_sections) if resolved.config_cls
                  else dict(raw_config))
        if resolved.validate is not None:
            resolved.validate(config)
    except configlib.ConfigError as exc:
        raise lines.error((*path, "config", *_key_path(exc.key)), exc.message) from None
    lists = {}
    for key in ports.SECTIONS:
        lists[key] = _names(spec.get(key), (*path, key), lines)
    try:
        declared = ports.of(resolved.ports, config)
    except Exception as exc:  # user code computing its ports: a mistake there is one line too
        raise lines.error((*path, "kind"), f"PORTS(config) failed: {type(exc).__name__}: "
                          f"{exc}") from None
    for key in ("publishes", "subscribes"):
        for i, t in enumerate(lists[key]):
            if t not in topics:
                raise lines.error((*path, key, i), f"topic {t!r} is not declared under topics")
    for i, t in enumerate(lists["subscribes"]):
        if t in lists["publishes"]:
            raise lines.error((*path, "subscribes", i),
                              f"node both publishes and subscribes {t!r}")
    for i, s in enumerate(lists["serves"]):
        _check_name(s, (*path, "serves", i), lines)
    restart_raw = _require_mapping(spec.get("restart"), (*path, "restart"), lines)
    _check_keys(restart_raw, RESTART_KEYS, (*path, "restart"), lines)
    policy = restart_raw.get("policy", "on-failure")
    if policy not in RESTART_POLICIES:
        raise lines.error((*path, "restart", "policy"),
                          f"must be one of {', '.join(RESTART_POLICIES)}, got {policy!r}")
    restart = RestartPolicy(
        policy=policy,
        max_failures=_typed(restart_raw.get("max_failures", 5), int,
                            (*path, "restart", "max_failures"), lines, minimum=1),
        window_s=_typed(restart_raw.get("window_s", 60.0), float,
                        (*path, "restart", "window_s"), lines, minimum=0.0),
        backoff_s=_typed(restart_raw.get("backoff_s", 0.5), float,
                         (*path, "restart", "backoff_s"), lines, minimum=0.0),
        backoff_max_s=_typed(restart_raw.get("backoff_max_s", 10.0), float,
                             (*path, "restart", "backoff_max_s"), lines, minimum=0.0),
    )
    device = spec.get("device", "cpu")
    if not isinstance(device, str) or not re.match(r"^(cpu|cuda(:\d+)?|auto)$", device):
        raise lines.error((*path, "device"), f"must be cpu, cuda, cuda:N or auto, got {device!r}")
    nice = _typed(spec.get("nice", 0), int, (*path, "nice"), lines, minimum=0)
    if nice > 19:
        raise lines.error((*path, "nice"), f"must be 0 to 19, got {nice}")
    stop_after = _names(spec.get("stop_after"), (*path, "stop_after"), lines)
    placement = _validate_placement(spec.get("placement"), (*path, "placement"), lines)
    critical = _typed(spec.get("critical", True), bool, (*path, "critical"), lines)
    node = NodeSpec(name=name, kind=kind, replicas=replicas, config=raw_config,
                    restart=restart, device=device, nice=nice, stop_after=stop_after,
                    placement=placement, critical=critical, **lists)
    return node, config, declared


def _key_path(key: str) -> tuple:
    """A dotted key as a path into the YAML (list indices as ints)."""
    return tuple(int(part) if part.isdigit() else part for part in key.split(".") if part)


def _validate_run(spec: dict, nodes: dict, lines: Lines) -> RunSpec:
    _check_keys(spec, RUN_KEYS, ("run",), lines)
    duration = _typed(spec.get("duration_s"), float | None, ("run", "duration_s"), lines)
    if duration is not None and duration <= 0:
        raise lines.error(("run", "duration_s"), f"must be > 0, got {duration}")
    stop_when = _names(spec.get("stop_when"), ("run", "stop_when"), lines)
    for i, n in enumerate(stop_when):
        if n not in nodes:
            raise lines.error(("run", "stop_when", i), f"unknown node {n!r}")
    transport = spec.get("transport", "ipc")
    if transport not in ("ipc", "tcp"):
        raise lines.error(("run", "transport"), f"must be ipc or tcp, got {transport!r}")
    directory = _typed(spec.get("directory", "runs"), str, ("run", "directory"), lines)
    numbers = {k: _typed(spec[k], float, ("run", k), lines, minimum=0.001)
               for k in ("heartbeat_s", "heartbeat_timeout_s", "grace_s", "ready_timeout_s")
               if k in spec}
    interface = _typed(spec.get("interface", "127.0.0.1"), str, ("run", "interface"), lines)
    insecure = _typed(spec.get("insecure", False), bool, ("run", "insecure"), lines)
    if insecure and (transport != "tcp" or interface not in LOOPBACK):
        raise lines.error(("run", "insecure"), "tcp without CURVE is allowed only with "
                          "run.transport: tcp on loopback (run.interface: 127.0.0.1)")
    launcher = spec.get("launcher", "local")
    if launcher not in ("local", "ray"):
        raise lines.error(("run", "launcher"), f"must be local or ray, got {launcher!r}")
    if launcher == "ray" and transport != "tcp":
        raise lines.error(("run", "launcher"), "run.launcher: ray needs run.transport: tcp")
    ray_address = _typed(spec.get("ray_address", "auto"), str, ("run", "ray_address"), lines)
    on_duration = spec.get("on_duration", "fail")
    if on_duration not in ON_DURATION:
        raise lines.error(("run", "on_duration"), f"must be fail or stop, got {on_duration!r}")
    run = RunSpec(directory=directory, duration_s=duration, stop_when=stop_when,
                  transport=transport, interface=interface, insecure=insecure,
                  launcher=launcher, ray_address=ray_address, on_duration=on_duration,
                  **numbers)
    if run.heartbeat_timeout_s < 2 * run.heartbeat_s:
        # One late heartbeat must not get a healthy node killed (in a loop, every timeout).
        at = "heartbeat_timeout_s" if "heartbeat_timeout_s" in spec else "heartbeat_s"
        raise lines.error(("run", at), f"heartbeat_timeout_s ({run.heartbeat_timeout_s:g}) "
                          f"must be at least twice heartbeat_s ({run.heartbeat_s:g})")
    if run.transport == "ipc":
        _check_ipc_paths(nodes, lines)
    return run


def _validate_placement(spec, path: tuple, lines: Lines) -> dict:
    """Ray placement: ``num_cpus``, ``num_gpus``, ``memory`` (bytes), ``resources`` (custom
    Ray resources, name -> amount) and ``labels`` (Ray node labels, name -> value)."""
    spec = _require_mapping(spec, path, lines)
    _check_keys(spec, PLACEMENT_KEYS, path, lines)
    out: dict = {}
    for key in ("num_cpus", "num_gpus", "memory"):
        if key in spec:
            out[key] = _typed(spec[key], float, (*path, key), lines, minimum=0.0)
    for key, kind in (("resources", float), ("labels", str)):
        if key in spec:
            mapping = _require_mapping(spec[key], (*path, key), lines)
            out[key] = {str(k): _typed(v, kind, (*path, key, k), lines) for k, v in
                        mapping.items()}
    return out


def _check_stop_after_cycles(nodes: dict, lines: Lines) -> None:
    """``stop_after`` edges must not loop: the supervisor would wait on itself to stop."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, trail: list) -> None:
        state[name] = 1
        for i, other in enumerate(nodes[name].stop_after):
            if state.get(other) == 1:
                cycle = [*trail[trail.index(other):], name, other] if other in trail \
                    else [name, other]
                raise lines.error(("nodes", name, "stop_after", i),
                                  f"stop_after cycle: {' -> '.join(cycle)}",
                                  key=("nodes", name, "stop_after"))
            if other not in state:
                visit(other, [*trail, name])
        state[name] = 2

    for name in nodes:
        if name not in state:
            visit(name, [])


def _check_ipc_paths(nodes: dict, lines: Lines) -> None:
    """Refuse names that would not fit in a unix socket path, before any process binds."""
    room = IPC_PATH_MAX - len(tempfile.gettempdir()) - IPC_DIR_ROOM - IPC_NAME_ROOM
    for node in nodes.values():
        for name in (*node.publishes, *node.serves):
            if len(node.name.encode()) + len(name.encode()) > room:
                raise lines.error(("nodes", node.name), (
                    f"node name and {name!r} are too long for an ipc socket path "
                    f"({len(node.name.encode()) + len(name.encode())} bytes together, at most "
                    f"{room} here): shorten them or use run.transport: tcp"))


# --- node kinds -----------------------------------------------------------------------------------


def known_kinds() -> list[str]:
    return kinds.known()


def resolve_kind(kind: str, lines: Lines | None = None, path=("kind",)):
    """Import a node kind; return ``(run function, Config class or None)``."""
    resolved = _resolve(kind, lines, path)
    return resolved.run, resolved.config_cls


def _resolve(kind: str, lines: Lines | None, path) -> kinds.Kind:
    try:
        return kinds.resolve(kind)
    except kinds.UnknownKind as exc:
        if lines is None:
            raise GraphError("<graph>", None, ".".join(path), str(exc)) from None
        raise lines.error(path, str(exc)) from None


# --- run.py check ----------------------------------------------------------------------------


def check_command(argv: list[str]) -> int:
    """``run.py check GRAPH [--set key.path=value ...]``: validate a graph as ``run`` would
    (kinds, ports, configs, ``validate`` hooks, graph checks) and start nothing. Prints ``ok``,
    or the one-line error and exits 2."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="run.py check", description=check_command.__doc__)
    parser.add_argument("graph")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        load(args.graph, args.set)
    except GraphError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("ok")
    return 0
