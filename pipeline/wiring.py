"""Wiring: which endpoint each node instance binds, and who connects to whom.

This is the system diagram in code. Placement (own process or a task in a shared loop) is a
separate decision made by :mod:`pipeline.supervisor` and :mod:`pipeline.inloop`; both build
their :class:`~pipeline.node.Launch` objects here.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os

from pipeline import stream
from pipeline.graph import Graph
from pipeline.node import Launch
from pipeline.sockets import private_socket_dir, remove_socket_dir
from pipeline.topics import partition_of


def run_socket_dir(run_dir: str) -> str:
    """A fresh private directory for one run's ipc sockets (see
    :func:`pipeline.sockets.private_socket_dir`); removed when this process exits, or earlier
    by whoever calls :func:`pipeline.sockets.remove_socket_dir`."""
    path = private_socket_dir()
    atexit.register(remove_socket_dir, path)
    return path


def tcp_endpoint(interface: str) -> str:
    """Where to bind over tcp: the configured interface (an address, an interface name, or
    ``*`` for all, advertised under the machine's address); the OS picks a port and the bound
    endpoint is reported back."""
    return f"tcp://{interface}:*"


def endpoint(graph: Graph, sock_dir: str, incarnation: str, name: str) -> str:
    """Where ``name`` binds. On one machine a topic is a ZeroMQ ``ipc://`` socket and a
    service a plain Unix socket (``unix://``, :mod:`pipeline.stream`): one spelling per
    endpoint everywhere, so a node can recognise its own among its peers."""
    if graph.run.transport == "tcp":
        return tcp_endpoint(graph.run.interface)
    scheme = "ipc://" if name in graph.topics else stream.SCHEME
    return f"{scheme}{sock_dir}/{incarnation}.{name}"


def make_launch(graph: Graph, node_name: str, replica: int, generation: int, run_dir: str,
                sock_dir: str, control: str | None, *, kind: str | None = None,
                config: dict | None = None, resume: str | None = None,
                curve: dict | None = None) -> Launch:
    node = graph.nodes[node_name]
    instance = f"{node_name}.{replica}"
    incarnation = f"{instance}~{generation}"
    bind = {name: endpoint(graph, sock_dir, incarnation, name)
            for name in (*node.publishes, *node.serves)}
    return Launch(
        instance=instance,
        incarnation=incarnation,
        node=node_name,
        replica=replica,
        kind=kind or node.kind,
        config=dict(node.config if config is None else config),
        topics={t.name: {"delivery": t.delivery, "hwm": t.hwm, "hwm_bytes": t.hwm_bytes,
                         "partitioned": t.partitioned, "coalesce": t.coalesce}
                for t in graph.topics.values()},
        bind=bind,
        consumer_groups={t: waited_for(graph, t) for t in node.publishes},
        run_dir=run_dir,
        device=node.device,
        nice=node.nice,
        control=control,
        heartbeat_s=graph.run.heartbeat_s,
        grace_s=graph.run.grace_s,
        membership_timeout_s=graph.run.membership_timeout_s,
        resume=resume,
        subscribes=list(node.subscribes),
        calls=list(node.calls),
        curve=curve,
        imports=list(graph.imports),
        # The supervisor's working directory: importable in the node's process wherever it
        # starts (a fork, a fresh interpreter, a Ray worker elsewhere), as at load.
        workdir=os.getcwd(),
    )


def waited_for(graph: Graph, topic: str) -> list[str]:
    """The consumer groups a publisher of ``topic`` holds messages for from the start: those
    of critical nodes. A ``critical: false`` subscriber's group exists once it joins (what it
    has not taken survives its restarts) and is forgotten when it stays away (it was given
    up: ``reliable.MEMBER_TIMEOUT_S``), so a node the run goes on without cannot stall it."""
    critical = {name for name, node in graph.nodes.items() if node.critical}
    return [g for g in graph.consumer_groups(topic)
            if (partition_of(g) or (g,))[0] in critical]


def peers(graph: Graph, launches: list[Launch]) -> dict:
    """Endpoints of every live publisher per topic and server per service."""
    topics: dict[str, list[str]] = {t: [] for t in graph.topics}
    services: dict[str, list[str]] = {s: [] for s in graph.services}
    for launch in launches:
        node = graph.nodes[launch.node]
        for name, ep in launch.bind.items():
            (topics if name in node.publishes else services)[name].append(ep)
    return {"topics": topics, "services": services}


MARKER = "COMPLETE"  # written last into a checkpoint: what it holds and each file's hash


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def check_checkpoint(path: str) -> str | None:
    """What is wrong with a checkpoint directory (one phrase), or None if it is complete: its
    marker is readable and every file it lists has the content hash written with it.
    (Checkpoints written before hashes were recorded list none and are trusted.)"""
    try:
        with open(os.path.join(path, MARKER)) as f:
            marker = json.load(f)
        files = dict(marker.get("files", {}))
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        return f"its {MARKER} marker is unreadable ({type(exc).__name__})"
    for name, expected in sorted(files.items()):
        try:
            if file_sha256(os.path.join(path, name)) != expected:
                return f"{name} does not match its content hash"
        except OSError as exc:
            return f"{name} cannot be read ({exc.strerror or exc})"
    return None


def latest_checkpoint(run_dir: str, report=None, checked: dict | None = None) -> str | None:
    """Newest checkpoint directory of a run that was completely written and is intact.

    A checkpoint directory is renamed into ``checkpoints/`` only after all its files were
    written and synced, and carries a ``COMPLETE`` marker with each file's content hash;
    hidden partial directories are ignored. One whose files no longer match (truncated,
    overwritten) is skipped, ``report`` is called with one line naming it, and the previous
    one is used. ``checked`` caches verdicts by path (a written checkpoint never changes).
    """
    root = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(root):
        return None
    done = sorted(d for d in os.listdir(root)
                  if not d.startswith(".") and os.path.exists(os.path.join(root, d, MARKER)))
    checked = {} if checked is None else checked
    for name in reversed(done):
        path = os.path.join(root, name)
        if path not in checked:
            checked[path] = check_checkpoint(path)
            if checked[path] is not None and report is not None:
                report(f"skipping checkpoint {path}: {checked[path]}; using an older one")
        if checked[path] is None:
            return path
    return None
