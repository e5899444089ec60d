"""One node entry of a graph: its kind, its config (with the graph-level sections its kind
takes, such as the agent), its ports (defaulting to what the kind declares), its restart policy
and placement. :mod:`pipeline.graph` validates the whole graph with these."""

from __future__ import annotations

import copy
import dataclasses
import re

import typedconfig as configlib
from pipeline import kinds, ports
from pipeline.graphspec import (
    NodeSpec,
    RestartPolicy,
    check_keys,
    check_name,
    key_path,
    names_list,
    require_mapping,
    typed,
)
from pipeline.graphyaml import GraphError, Lines

RESTART_POLICIES = ("always", "on-failure", "never")
MAX_REPLICAS = 64  # per node: each replica is a process on this machine
NODE_KEYS = {"kind", "replicas", "config", "publishes", "subscribes", "serves", "calls",
             "restart", "device", "nice", "description", "stop_after", "placement",
             "critical"}
RESTART_KEYS = {"policy", "max_failures", "window_s", "backoff_s", "backoff_max_s"}
PLACEMENT_KEYS = {"num_cpus", "num_gpus", "memory", "resources", "labels"}


def default_ports(nodes: dict, declared: dict, stated: dict, topics: dict) -> None:
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


def validate_sections(data: dict, lines: Lines) -> dict[str, tuple[object, dict]]:
    """Each top-level section the node kinds registered (:func:`pipeline.kinds.
    register_section`) that the graph states: ``name -> (built config, raw mapping)``, built
    once here for every node that takes it."""
    out = {}
    for name, cls in kinds.sections().items():
        if name not in data:
            continue
        raw = require_mapping(data[name], (name,), lines, allow_none=False)
        try:
            out[name] = (configlib.build(cls, raw, name), raw)
        except configlib.ConfigError as exc:
            raise lines.error(key_path(exc.key), exc.message) from None
    return out


def with_sections(name: str, kind: str, config_cls: type | None, raw_config: dict,
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


def validate_node(name: str, spec, topics: dict, sections: dict, lines: Lines) -> NodeSpec:
    path = ("nodes", name)
    check_name(name, path, lines)
    spec = require_mapping(spec, path, lines, allow_none=False)
    check_keys(spec, NODE_KEYS, path, lines)
    kind = spec.get("kind")
    if not isinstance(kind, str) or not kind:
        raise lines.error((*path, "kind"), "required: the node kind (a registered kind or "
                          "package.module:function)")
    resolved = resolve(kind, lines, (*path, "kind"))
    replicas = typed(spec.get("replicas", 1), int, (*path, "replicas"), lines, minimum=1)
    if replicas > MAX_REPLICAS:
        raise lines.error((*path, "replicas"), f"must be <= {MAX_REPLICAS}, got {replicas}")
    raw_config, to_build = with_sections(
        name, kind, resolved.config_cls,
        require_mapping(spec.get("config"), (*path, "config"), lines), sections, lines)
    try:
        config = (configlib.build(resolved.config_cls, to_build) if resolved.config_cls
                  else dict(raw_config))
        if resolved.validate is not None:
            resolved.validate(config)
    except configlib.ConfigError as exc:
        raise lines.error((*path, "config", *key_path(exc.key)), exc.message) from None
    lists = {}
    for key in ports.SECTIONS:
        lists[key] = names_list(spec.get(key), (*path, key), lines)
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
        check_name(s, (*path, "serves", i), lines)
    restart_raw = require_mapping(spec.get("restart"), (*path, "restart"), lines)
    check_keys(restart_raw, RESTART_KEYS, (*path, "restart"), lines)
    policy = restart_raw.get("policy", "on-failure")
    if policy not in RESTART_POLICIES:
        raise lines.error((*path, "restart", "policy"),
                          f"must be one of {', '.join(RESTART_POLICIES)}, got {policy!r}")
    restart = RestartPolicy(
        policy=policy,
        max_failures=typed(restart_raw.get("max_failures", 5), int,
                            (*path, "restart", "max_failures"), lines, minimum=1),
        window_s=typed(restart_raw.get("window_s", 60.0), float,
                        (*path, "restart", "window_s"), lines, minimum=0.0),
        backoff_s=typed(restart_raw.get("backoff_s", 0.5), float,
                         (*path, "restart", "backoff_s"), lines, minimum=0.0),
        backoff_max_s=typed(restart_raw.get("backoff_max_s", 10.0), float,
                             (*path, "restart", "backoff_max_s"), lines, minimum=0.0),
    )
    device = spec.get("device", "cpu")
    if not isinstance(device, str) or not re.match(r"^(cpu|cuda(:\d+)?|auto)$", device):
        raise lines.error((*path, "device"), f"must be cpu, cuda, cuda:N or auto, got {device!r}")
    nice = typed(spec.get("nice", 0), int, (*path, "nice"), lines, minimum=0)
    if nice > 19:
        raise lines.error((*path, "nice"), f"must be 0 to 19, got {nice}")
    stop_after = names_list(spec.get("stop_after"), (*path, "stop_after"), lines)
    placement = validate_placement(spec.get("placement"), (*path, "placement"), lines)
    critical = typed(spec.get("critical", True), bool, (*path, "critical"), lines)
    node = NodeSpec(name=name, kind=kind, replicas=replicas, config=raw_config,
                    restart=restart, device=device, nice=nice, stop_after=stop_after,
                    placement=placement, critical=critical, **lists)
    return node, config, declared


def validate_placement(spec, path: tuple, lines: Lines) -> dict:
    """Ray placement: ``num_cpus``, ``num_gpus``, ``memory`` (bytes), ``resources`` (custom
    Ray resources, name -> amount) and ``labels`` (Ray node labels, name -> value)."""
    spec = require_mapping(spec, path, lines)
    check_keys(spec, PLACEMENT_KEYS, path, lines)
    out: dict = {}
    for key in ("num_cpus", "num_gpus", "memory"):
        if key in spec:
            out[key] = typed(spec[key], float, (*path, key), lines, minimum=0.0)
    for key, kind in (("resources", float), ("labels", str)):
        if key in spec:
            mapping = require_mapping(spec[key], (*path, key), lines)
            out[key] = {str(k): typed(v, kind, (*path, key, k), lines) for k, v in
                        mapping.items()}
    return out


def known_kinds() -> list[str]:
    return kinds.known()


def resolve_kind(kind: str, lines: Lines | None = None, path=("kind",)):
    """Import a node kind; return ``(run function, Config class or None)``."""
    resolved = resolve(kind, lines, path)
    return resolved.run, resolved.config_cls


def resolve(kind: str, lines: Lines | None, path) -> kinds.Kind:
    try:
        return kinds.resolve(kind)
    except kinds.UnknownKind as exc:
        if lines is None:
            raise GraphError("<graph>", None, ".".join(path), str(exc)) from None
        raise lines.error(path, str(exc)) from None
