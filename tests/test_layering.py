"""The import graph of the four packages: arrows only downwards, no circles.

``nodes -> pipeline, algorithms, storage``; ``algorithms -> storage``; ``pipeline``,
``storage`` and ``typedconfig`` know no package above them. Every ``import`` statement counts,
those inside functions too: a deferred import is still a dependency.
"""

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("pipeline", "nodes", "algorithms", "storage")
# What each package may import from the project (itself included).
ALLOWED = {
    "pipeline": {"pipeline", "typedconfig"},
    "storage": {"storage", "typedconfig"},
    "algorithms": {"algorithms", "storage", "typedconfig"},
    "nodes": {"nodes", "pipeline", "algorithms", "storage", "typedconfig"},
}
PROJECT = set(PACKAGES) | {"typedconfig", "run", "conduit"}  # conduit: the public API, on top


def _modules() -> dict[str, str]:
    """Dotted module name -> file, for every module of the four packages."""
    out = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(folder, f), ROOT)[:-3]
                    name = rel.replace(os.sep, ".").removesuffix(".__init__")
                    out[name] = os.path.join(folder, f)
    return out


MODULES = _modules()


def _imports(name: str, path: str) -> set[str]:
    """Project modules ``name`` imports (resolved to a module of :data:`MODULES` where one
    matches: ``from pipeline import bus`` is ``pipeline.bus``, not the package)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    is_package = path.endswith("__init__.py")
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = name.split(".")
                base = parts[:len(parts) - node.level + (1 if is_package else 0)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module
                       for a in node.names]
        else:
            continue
        found.update(t for t in targets if t.split(".")[0] in PROJECT)
    found.discard(name)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_upward_import(package):
    wrong = sorted(f"{m} imports {t}" for m, targets in GRAPH.items()
                   if m.split(".")[0] == package for t in targets
                   if t.split(".")[0] not in ALLOWED[package])
    assert not wrong, wrong


def _cycles() -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH.get(v, ())):
            if w not in MODULES:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(MODULES):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    assert not _cycles(), _cycles()


def test_the_checker_sees_a_cycle_and_an_upward_import():
    """The checks above can fail: a made-up cycle and upward import are found."""
    saved = dict(GRAPH)
    try:
        GRAPH["storage.ring"] = GRAPH["storage.ring"] | {"storage.nest"}
        GRAPH["storage.nest"] = GRAPH["storage.nest"] | {"storage.ring", "nodes.learner"}
        assert ["storage.nest", "storage.ring"] in _cycles()
        with pytest.raises(AssertionError, match="storage.nest imports nodes.learner"):
            test_no_upward_import("storage")
    finally:
        GRAPH.clear()
        GRAPH.update(saved)
