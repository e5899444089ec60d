"""The registry of node kinds: which module implements the kind a graph names.

Why a registry: ``pipeline/`` is the transport and runtime and must not depend on the node
kinds built on it. The package that holds node kinds registers them from outside
(``nodes/__init__.py`` calls :func:`register_package`), and ``run.py`` imports that package
before it reads a graph. A user kind needs no registration: ``package.module`` (a module with
``run``) or ``package.module:function``.

A kind module defines ``async def run(config, node, ready)`` (``node`` is a
:class:`pipeline.node.NodeContext`) and optionally the declarations below. For
``package.module:function`` each is looked up on the function first (``function.Config``, so
one module can hold several kinds), then on the module:

* ``Config``: a frozen dataclass, built from the graph entry's ``config`` at load;
* ``PORTS``: a :class:`pipeline.ports.Ports` (or a function of the built config returning one),
  checked against the graph entry at load and at runtime;
* ``validate(config)``: raises :class:`typedconfig.ConfigError` for a bad combination of
  values, reported at load with the key's file:line (``key`` relative to the node's config);
* ``exclusive(config)``: True when an incarnation holds something only one process may hold at
  a time (a memory-mapped replay store's files): a swap or restart by command then stops it
  before its replacement starts, instead of after.

Graph-wide checks (settings that must agree across nodes) are registered with
:func:`register_graph_check`; graph-wide *facts*, stated once at the graph's top level and
handed to every node that needs them, with :func:`register_section`.

A graph's ``imports:`` (modules that register environments, kinds or checks when imported) go
through :func:`import_modules`, in the supervisor at load and in every node process before its
kind is resolved.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
DECLARATIONS = ("Config", "PORTS", "validate", "exclusive", "PROGRESS")

_KINDS: dict[str, str] = {}  # kind name -> module path, imported on first use
_GRAPH_CHECKS: list[Callable] = []
_SECTIONS: dict[str, type] = {}  # top-level graph key -> its config dataclass
_PROGRESS: dict[str, tuple] = {}  # kind name -> status keys that grow while it gets work done


class UnknownKind(LookupError):
    """The kind cannot be resolved; the message is one line for the user."""


class ImportFailed(ImportError):
    """A module a graph names cannot be imported; the message is one line for the user."""


@dataclass(frozen=True)
class Kind:
    """A resolved node kind."""

    name: str
    run: Callable
    config_cls: type | None
    ports: Any = None  # Ports, a function of the config returning Ports, or None (unchecked)
    validate: Callable | None = None
    exclusive: Callable | None = None  # exclusive(config) -> bool; see the module docstring
    progress: tuple = ()  # status keys that grow while it works (register_progress)


def register(name: str, module: str) -> None:
    """Make ``kind: name`` in a graph mean the module ``module`` (imported on first use)."""
    if not NAME_RE.match(name):
        raise ValueError(f"kind names use letters, digits and '_': {name!r}")
    _KINDS[name] = module


def register_package(package: str, names) -> None:
    """Register every module name in ``names`` as the kind ``package.<name>`` (skipping private
    modules, whose names start with ``_``)."""
    for name in names:
        if not name.startswith("_"):
            register(name, f"{package}.{name}")


def register_graph_check(check: Callable) -> Callable:
    """Run ``check(graph)`` on every graph at load, after each node was checked on its own.

    For settings that must agree across nodes. ``graph.configs[node]`` is each node's built
    config; a mistake is ``raise typedconfig.ConfigError(key, message)`` with ``key`` the
    dotted path from the graph's root (``"nodes.learner.config.env_id"``), reported as one line
    with that key's file:line. Usable as a decorator; registering the same function twice is a
    no-op."""
    if check not in _GRAPH_CHECKS:
        _GRAPH_CHECKS.append(check)
    return check


def register_section(name: str, config_cls: type) -> None:
    """Make ``name:`` a top-level section of every graph, built into ``config_cls`` once at
    load. A node kind whose ``Config`` has a field ``name`` gets the built section there;
    its graph entry may not state the field itself (one fact, one place), nor any key of
    ``config_cls`` at the top of its config (the error names the key to move)."""
    if not NAME_RE.match(name):
        raise ValueError(f"section names use letters, digits and '_': {name!r}")
    _SECTIONS[name] = config_cls


def register_progress(kind: str, keys) -> None:
    """Declare what progress means for ``kind``: numeric status keys that grow while it gets
    work done (a learner's version, a runner's env steps). The supervisor's progress watchdog
    (:mod:`pipeline.liveness`) adds them to the messages a node moves on reliable topics; the
    pipeline does not know what they mean. A kind module may declare ``PROGRESS`` instead."""
    _PROGRESS[kind] = tuple(keys)


def progress_of(kind: str) -> tuple:
    """The status keys ``kind`` declared as progress (registered, or its ``PROGRESS``)."""
    if kind in _PROGRESS:
        return _PROGRESS[kind]
    return resolve(kind).progress


def sections() -> dict[str, type]:
    return dict(_SECTIONS)


def graph_checks() -> tuple:
    return tuple(_GRAPH_CHECKS)


def known() -> list[str]:
    return sorted(_KINDS)


def resolve(kind: str) -> Kind:
    """Import a node kind; raise :class:`UnknownKind` with a one-line reason.

    ``kind`` is a registered name, a module (its ``run``), or ``module:function``."""
    if ":" in kind:
        module_name, _, func_name = kind.partition(":")
        module = _import(module_name)
        run = getattr(module, func_name, None)
        if run is None or not callable(run):
            raise UnknownKind(f"{module_name!r} has no function {func_name!r}")
        # The function's own declarations first (run.Config, ...): a module may hold several
        # kinds; what the function does not carry, the module declares for all of them.
        sources = (run, module)
    else:
        if kind in _KINDS:
            module_name = _KINDS[kind]
        elif MODULE_RE.match(kind) and ("." in kind or importlib.util.find_spec(kind)):
            module_name = kind  # a module of the user's: its run()
        else:
            raise UnknownKind(f"unknown node kind {kind!r} (known: {', '.join(known())})")
        module = _import(module_name)
        run = getattr(module, "run", None)
        if run is None or not callable(run):
            raise UnknownKind(f"{module_name} has no run(config, node, ready) function")
        sources = (module,)
    found = {}
    for name in DECLARATIONS:
        found[name] = next((getattr(source, name) for source in sources
                            if getattr(source, name, None) is not None), None)
    return Kind(name=kind, run=run, config_cls=found["Config"], ports=found["PORTS"],
                validate=found["validate"], exclusive=found["exclusive"],
                progress=tuple(found["PROGRESS"] or ()))


def import_modules(names, directory: str | None = None) -> None:
    """Import a graph's ``imports:`` (each may register environments, node kinds, checks),
    with ``directory`` (default: the working directory) on ``sys.path``, so modules next to
    where a run is started import in the supervisor and in every node process alike.

    The directory goes at the end of the path: a user's ``algorithms/`` or ``storage/``
    folder must not shadow Conduit's packages. Raises :class:`ImportFailed` naming the first
    module that does not import, with why, in one line."""
    directory = os.path.abspath(directory or os.getcwd())
    if directory not in {os.path.abspath(p or os.curdir) for p in sys.path}:
        sys.path.append(directory)
    for name in names:
        if not isinstance(name, str) or not MODULE_RE.match(name):
            raise ImportFailed(f"expected a module name such as mypackage.envs, got {name!r}")
        _import(name, ImportFailed, "module ")


def _import(module_name: str, error: type[Exception] = UnknownKind, what: str = ""):
    try:
        return importlib.import_module(module_name)
    except Exception as exc:  # user code: a SyntaxError or a raise at import is a mistake too
        reason = " ".join(str(exc).split())
        if not isinstance(exc, ImportError):
            reason = f"{type(exc).__name__}: {reason}"
        raise error(f"cannot import {what}{module_name!r}: {reason}") from None
