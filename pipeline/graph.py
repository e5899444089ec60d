"""The graph spec: YAML in, a validated frozen :class:`Graph` out.

Every mistake becomes one :class:`GraphError` line naming file, line and key, e.g.::

    graphs/bad.yaml:12: nodes.sink.kind: unknown node kind 'snk' (known: demo_sink, ...)

Node kinds are registered with :mod:`pipeline.kinds` (the ``nodes`` package registers its modules);
a kind may also be ``package.module:function`` for user code.
"""

from __future__ import annotations

import copy
import dataclasses
import tempfile

import yaml

import typedconfig as configlib
from pipeline import graphyaml, kinds, ports
from pipeline.graphnodes import (  # noqa: F401 - known_kinds, resolve_kind: part of the API
    default_ports,
    known_kinds,
    resolve_kind,
    validate_node,
    validate_sections,
)
from pipeline.graphspec import (  # noqa: F401 - the graph's types are imported from here
    NAME_RE,
    Graph,
    NodeSpec,
    RestartPolicy,
    RunSpec,
    TopicDecl,
    check_keys,
    check_name,
    key_path,
    names_list,
    require_mapping,
    typed,
)
from pipeline.graphyaml import GraphError, Lines
from pipeline.topics import DELIVERY_CLASSES, HWM_BYTES, RELIABLE

TOP_KEYS = {"name", "description", "imports", "topics", "services", "nodes", "run"}
TOPIC_KEYS = {"delivery", "hwm", "hwm_bytes", "partitioned", "coalesce"}
IPC_PATH_MAX = 107  # bytes in a unix socket path (sun_path, with its NUL)
# Room an ipc endpoint needs besides the node and topic names: the socket directory (the temp
# directory plus a short per-run name), ".<replica>~<generation up to 6 digits>.", ".tap".
IPC_DIR_ROOM = 25
IPC_NAME_ROOM = len(".00~000000..tap")
RUN_KEYS = {"directory", "duration_s", "stop_when", "heartbeat_s", "heartbeat_timeout_s",
            "membership_timeout_s", "stall_timeout_s", "grace_s", "transport", "ready_timeout_s", "interface", "insecure", "launcher",
            "ray_address", "on_duration"}
ON_DURATION = ("fail", "stop")
LOOPBACK = ("127.0.0.1", "localhost", "lo", "::1")


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


def _validate(data: dict, lines: Lines) -> Graph:
    # ``x-...`` keys hold YAML anchors shared by several nodes (docker-compose's convention).
    data = {k: v for k, v in data.items() if not str(k).startswith("x-")}
    imports = _import_modules(data.get("imports"), lines)  # first: they may register kinds
    check_keys(data, TOP_KEYS | set(kinds.sections()), (), lines)
    sections = validate_sections(data, lines)
    name = data.get("name")
    if name is None:
        raise lines.error(("name",), "required key is missing")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise lines.error(("name",), "must be a name of letters, digits, '_' or '-'")

    topics = {}
    for tname, tspec in require_mapping(data.get("topics"), ("topics",), lines).items():
        path = ("topics", tname)
        check_name(tname, path, lines)
        tspec = require_mapping(tspec, path, lines)
        check_keys(tspec, TOPIC_KEYS, path, lines)
        delivery = tspec.get("delivery")
        if delivery not in DELIVERY_CLASSES:
            raise lines.error((*path, "delivery"),
                              f"must be one of {', '.join(DELIVERY_CLASSES)}, got {delivery!r}")
        hwm = typed(tspec.get("hwm", 1000), int, (*path, "hwm"), lines, minimum=1)
        if "hwm_bytes" in tspec and delivery != RELIABLE:
            raise lines.error((*path, "hwm_bytes"), f"only reliable topics queue messages; a "
                              f"{delivery} topic drops or replaces them")
        hwm_bytes = typed(tspec.get("hwm_bytes", HWM_BYTES), int, (*path, "hwm_bytes"), lines,
                           minimum=1)
        partitioned = typed(tspec.get("partitioned", False), bool, (*path, "partitioned"), lines)
        if partitioned and delivery != RELIABLE:
            raise lines.error((*path, "partitioned"), f"only reliable topics have consumer "
                              f"groups to partition; a {delivery} topic goes to every subscriber")
        coalesce = typed(tspec.get("coalesce", False), bool, (*path, "coalesce"), lines)
        if coalesce and delivery != RELIABLE:
            raise lines.error((*path, "coalesce"), f"only reliable topics batch what they "
                              f"send; a {delivery} topic sends each message as it comes")
        topics[tname] = TopicDecl(tname, delivery, hwm, hwm_bytes, partitioned, coalesce)

    raw_nodes = require_mapping(data.get("nodes"), ("nodes",), lines)
    if not raw_nodes:
        raise lines.error(("nodes",), "a graph needs at least one node")
    nodes, configs, declared, stated = {}, {}, {}, {}
    for nname, nspec in raw_nodes.items():
        nodes[nname], configs[nname], declared[nname] = validate_node(
            str(nname), nspec, topics, sections, lines)
        stated[nname] = {key for key in ports.SECTIONS if key in nspec}
    default_ports(nodes, declared, stated, topics)

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

    run = _validate_run(require_mapping(data.get("run"), ("run",), lines), nodes, lines)
    _check_critical(nodes, topics, run, lines)
    graph = Graph(name=name, source=lines.source, topics=topics, nodes=nodes, run=run,
                  services=tuple(sorted(served)), raw=copy.deepcopy(data), configs=configs,
                  ports=declared, imports=imports)
    for check in kinds.graph_checks():
        try:
            check(graph)
        except configlib.ConfigError as exc:
            raise lines.error(key_path(exc.key), exc.message) from None
    return graph


def _import_modules(value, lines: Lines) -> tuple:
    """The graph's ``imports:``: module names imported here, at load, before any kind or
    section is resolved (they register environments, node kinds, graph checks), and again by
    every node process (:class:`pipeline.node.Launch`). The working directory is importable
    (:func:`pipeline.kinds.import_modules`), also when the list is empty: ``module:function``
    kinds and ``module:EnvId`` ids name modules too."""
    names = names_list(value, ("imports",), lines)
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


def _validate_run(spec: dict, nodes: dict, lines: Lines) -> RunSpec:
    check_keys(spec, RUN_KEYS, ("run",), lines)
    duration = typed(spec.get("duration_s"), float | None, ("run", "duration_s"), lines)
    if duration is not None and duration <= 0:
        raise lines.error(("run", "duration_s"), f"must be > 0, got {duration}")
    stop_when = names_list(spec.get("stop_when"), ("run", "stop_when"), lines)
    if "stall_timeout_s" in spec:
        stall = typed(spec["stall_timeout_s"], float | None, ("run", "stall_timeout_s"), lines,
                      minimum=0.001)
        extra = {"stall_timeout_s": stall}
    else:
        extra = {}
    for i, n in enumerate(stop_when):
        if n not in nodes:
            raise lines.error(("run", "stop_when", i), f"unknown node {n!r}")
    transport = spec.get("transport", "ipc")
    if transport not in ("ipc", "tcp"):
        raise lines.error(("run", "transport"), f"must be ipc or tcp, got {transport!r}")
    directory = typed(spec.get("directory", "runs"), str, ("run", "directory"), lines)
    numbers = {k: typed(spec[k], float, ("run", k), lines, minimum=0.001)
               for k in ("heartbeat_s", "heartbeat_timeout_s", "membership_timeout_s", "grace_s",
                         "ready_timeout_s")
               if k in spec}
    interface = typed(spec.get("interface", "127.0.0.1"), str, ("run", "interface"), lines)
    insecure = typed(spec.get("insecure", False), bool, ("run", "insecure"), lines)
    if insecure and (transport != "tcp" or interface not in LOOPBACK):
        raise lines.error(("run", "insecure"), "tcp without CURVE is allowed only with "
                          "run.transport: tcp on loopback (run.interface: 127.0.0.1)")
    launcher = spec.get("launcher", "local")
    if launcher not in ("local", "ray"):
        raise lines.error(("run", "launcher"), f"must be local or ray, got {launcher!r}")
    if launcher == "ray" and transport != "tcp":
        raise lines.error(("run", "launcher"), "run.launcher: ray needs run.transport: tcp")
    ray_address = typed(spec.get("ray_address", "auto"), str, ("run", "ray_address"), lines)
    on_duration = spec.get("on_duration", "fail")
    if on_duration not in ON_DURATION:
        raise lines.error(("run", "on_duration"), f"must be fail or stop, got {on_duration!r}")
    run = RunSpec(directory=directory, duration_s=duration, stop_when=stop_when,
                  transport=transport, interface=interface, insecure=insecure,
                  launcher=launcher, ray_address=ray_address, on_duration=on_duration,
                  **numbers, **extra)
    if run.heartbeat_timeout_s < 2 * run.heartbeat_s:
        # One late heartbeat must not get a healthy node killed (in a loop, every timeout).
        at = "heartbeat_timeout_s" if "heartbeat_timeout_s" in spec else "heartbeat_s"
        raise lines.error(("run", at), f"heartbeat_timeout_s ({run.heartbeat_timeout_s:g}) "
                          f"must be at least twice heartbeat_s ({run.heartbeat_s:g})")
    if "membership_timeout_s" not in spec and \
            run.heartbeat_timeout_s >= run.membership_timeout_s:
        # Only the heartbeat timeout was raised (a slow environment, a debugger): the
        # membership timeout follows it, so the order below holds.
        run = dataclasses.replace(run, membership_timeout_s=2 * run.heartbeat_timeout_s)
    if run.heartbeat_timeout_s >= run.membership_timeout_s:
        # A stopped or hung node must be killed and restarted before its publishers evict
        # it: otherwise they hand its messages to others while it may still wake and act.
        at = "heartbeat_timeout_s" if "heartbeat_timeout_s" in spec else "membership_timeout_s"
        raise lines.error(("run", at), f"heartbeat_timeout_s ({run.heartbeat_timeout_s:g}) "
                          f"must be below membership_timeout_s ({run.membership_timeout_s:g})")
    if run.transport == "ipc":
        _check_ipc_paths(nodes, lines)
    return run


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


# --- run.py check ----------------------------------------------------------------------------


def check_command(argv: list[str]) -> int:
    """``run.py check GRAPH [--set key.path=value ...]``: validate a graph as ``run`` would
    (kinds, ports, configs, ``validate`` hooks, graph checks) and start nothing. Prints ``ok``,
    or the one-line error and exits 2. A file the graph names that is still to be made (a
    dataset, :func:`typedconfig.absent_input`) is a note on stderr, not an error: the graph
    is valid, and ``run`` refuses it until the file exists."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="run.py check", description=check_command.__doc__)
    parser.add_argument("graph")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        with configlib.noting_absent_inputs() as absent:
            load(args.graph, args.set)
    except GraphError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for note in absent:
        print(f"note: {args.graph}: {note}: run refuses the graph until it exists",
              file=sys.stderr)
    print("ok")
    return 0
