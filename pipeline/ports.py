"""Declared ports: what a node kind publishes, subscribes, serves and calls, with message types.

A kind module exports ``PORTS`` (a user kind ``package.module:function`` sets ``function.PORTS``)::

    PORTS = Ports(publishes={"experience": Port(ExperienceBatch)},
                  subscribes={"params": Port(Params, required=False)},
                  serves={"policy": Service(TimeStepBatch, ActionBatch)},
                  calls={"sample": Service(SampleRequest, SampleBatch)})

or a function of the built config that returns one, when the ports depend on it (on-policy vs
off-policy, configurable topic names)::

    def PORTS(config): return Ports(publishes={config.output: Port(Record)})

The port's name is the topic or service name in the graph. Why declare: the graph is the truth
of the wiring only if it can be checked against what the code uses. At load
(:func:`check_node`, :func:`check_types`) a graph entry that lists a port the kind does not
declare, or misses a required one, and the two ends of a topic or service that disagree on the
message type, are one-line errors before any process starts. At runtime the bus refuses a port the
graph entry does not list (:class:`PortNotListed`). Kinds without ``PORTS`` are not checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SECTIONS = ("publishes", "subscribes", "serves", "calls")


class PortNotListed(LookupError):
    """A node asked the bus for a topic or service its graph entry does not list."""


@dataclass(frozen=True)
class Port:
    """One topic end. ``message``: the message class, or a tuple of them (any of those)."""

    message: type | tuple
    required: bool = True
    doc: str = ""

    def types(self) -> tuple:
        return self.message if isinstance(self.message, tuple) else (self.message,)


@dataclass(frozen=True)
class Service:
    """One service end: the request and reply message classes."""

    request: type
    reply: type
    required: bool = True
    doc: str = ""


@dataclass(frozen=True)
class Ports:
    publishes: dict = field(default_factory=dict)  # topic -> Port
    subscribes: dict = field(default_factory=dict)  # topic -> Port
    serves: dict = field(default_factory=dict)  # service -> Service
    calls: dict = field(default_factory=dict)  # service -> Service

    def section(self, name: str) -> dict:
        return getattr(self, name)


def of(declaration, config) -> Ports | None:
    """The kind's ports for this config: ``PORTS`` itself, or ``PORTS(config)``."""
    if declaration is None or isinstance(declaration, Ports):
        return declaration
    ports = declaration(config)
    if not isinstance(ports, Ports):
        raise TypeError(f"PORTS(config) returned {type(ports).__name__}, not Ports")
    return ports


def check_node(kind: str, ports: Ports, listed: dict) -> tuple[str, int | None, str] | None:
    """The first mismatch between a kind's ports and its graph entry, as ``(section, index or
    None, message)``; ``listed`` maps each section to the names the graph entry lists."""
    for section in SECTIONS:
        declared = ports.section(section)
        names = listed.get(section, ())
        for i, name in enumerate(names):
            if name not in declared:
                known = ", ".join(declared) or "nothing"
                return section, i, (f"kind {kind!r} does not {_verb(section)} {name!r} "
                                    f"(it declares {section}: {known})")
        for name, port in declared.items():
            if port.required and name not in names:
                return section, None, (f"kind {kind!r} must {_verb(section)} {name!r}: "
                                       f"add it to {section}")
    return None


def check_types(nodes: dict, graph_nodes: dict):
    """The first topic or service whose ends disagree on the message type, as ``(node,
    section, index, message)``; ``nodes`` maps node name -> Ports (declared ones only)."""
    for name, ports in nodes.items():
        spec = graph_nodes[name]
        for i, topic in enumerate(spec.subscribes):
            wanted = ports.subscribes.get(topic)
            if wanted is None:
                continue
            for other, other_ports in nodes.items():
                sent = other_ports.publishes.get(topic)
                if other == name or sent is None or topic not in graph_nodes[other].publishes:
                    continue
                missing = [t for t in sent.types() if t not in wanted.types()]
                if missing:
                    return name, "subscribes", i, (
                        f"topic {topic!r} carries {_names(sent.types())} from node {other!r}, "
                        f"but this node expects {_names(wanted.types())}")
        for i, service in enumerate(spec.calls):
            wanted = ports.calls.get(service)
            if wanted is None:
                continue
            for other, other_ports in nodes.items():
                served = other_ports.serves.get(service)
                if other == name or served is None or service not in graph_nodes[other].serves:
                    continue
                if (served.request, served.reply) != (wanted.request, wanted.reply):
                    return name, "calls", i, (
                        f"service {service!r} of node {other!r} takes {served.request.__name__} "
                        f"and replies {served.reply.__name__}, but this node sends "
                        f"{wanted.request.__name__} and expects {wanted.reply.__name__}")
    return None


_VERBS = {"publishes": "publish", "subscribes": "subscribe to", "serves": "serve",
          "calls": "call"}


def _verb(section: str) -> str:
    return _VERBS[section]


def _names(types: tuple) -> str:
    return " or ".join(t.__name__ for t in types)
