"""Reading a graph file: YAML 1.2 scalars, JSON-like values only, bounded size, line numbers.

Why not ``yaml.safe_load``: PyYAML reads YAML 1.1, where ``3e-4`` and ``1e5`` are *strings*
(a learning rate that fails minutes into a run), ``yes``/``no``/``on``/``off`` are booleans and
``2024-01-01`` is a date; and it expands aliases without limit (a 1.4 KB alias bomb grew to 4.4 GB).
Here numbers follow YAML 1.2 (underscores allowed: ``1_000``), only ``true``/``false`` are
booleans, and a YAML 1.1 boolean word, a date or any other non-JSON value is a one-line error at
its line, as is a file over :data:`MAX_GRAPH_BYTES` or a document over :data:`MAX_YAML_NODES`
nodes once aliases are expanded (checked on the composed node graph, before anything is built).
"""

from __future__ import annotations

import math
import re

import yaml

MAX_GRAPH_BYTES = 1 << 20  # a graph is a page of YAML; this is a thousand times that
MAX_YAML_NODES = 100_000  # values after alias expansion (the shipped graphs have ~300)

_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_YAML11_BOOL = "tag:conduit,2026:yaml11-bool"


class GraphError(Exception):
    """A user mistake in a graph: printed as one line, exit code 2."""

    def __init__(self, source: str, line: int | None, key: str, message: str):
        self.source, self.line, self.key, self.message = source, line, key, message
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")


class _Refused(yaml.MarkedYAMLError):
    """A value YAML allows but a graph does not; the message is the user's one line."""


class _Loader(yaml.SafeLoader):
    pass


# YAML 1.2 core scalars (plus '_' digit separators, which YAML 1.1 had and people write).
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL, _INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))
_Loader.add_implicit_resolver(_YAML11_BOOL,
                              re.compile(r"^(?:yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF)$"),
                              list("yYnNoO"))
_Loader.add_implicit_resolver(
    _INT, re.compile(r"^(?:[-+]?[0-9][0-9_]*|0x[0-9a-fA-F_]+|0o[0-7_]+)$"), list("-+0123456789"))
_Loader.add_implicit_resolver(
    _FLOAT, re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)"
                       r"(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def _int(loader, node):
    text = loader.construct_scalar(node).replace("_", "")
    if text[:2] in ("0x", "0o"):
        return int(text, 0)
    return int(text, 10)


def _float(loader, node):
    text = loader.construct_scalar(node).replace("_", "").lower()
    if text.endswith(".inf"):
        return -math.inf if text.startswith("-") else math.inf
    if text == ".nan":
        return math.nan
    return float(text)


def _yaml11_bool(loader, node):
    raise _Refused(None, None, f"{node.value!r} is a boolean in YAML 1.1 and a string in YAML "
                   "1.2: write true or false, or quote it for a string", node.start_mark)


def _refuse(what: str):
    def construct(loader, node):
        raise _Refused(None, None, f"{what} is not a graph value (graphs hold JSON-like values):"
                       " quote it for a string", node.start_mark)

    return construct


_Loader.add_constructor(_INT, _int)
_Loader.add_constructor(_FLOAT, _float)
_Loader.add_constructor(_YAML11_BOOL, _yaml11_bool)
for _tag, _what in (("timestamp", "a YAML date"), ("binary", "YAML binary data"),
                    ("set", "a YAML set"), ("omap", "a YAML ordered map"),
                    ("pairs", "a YAML list of pairs")):
    _Loader.add_constructor(f"tag:yaml.org,2002:{_tag}", _refuse(_what))


def read_value(text: str):
    """One YAML value (a ``--set`` override), with the graph's scalar rules."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader


class Lines:
    """Maps key paths (tuples) to YAML line numbers, for error messages."""

    def __init__(self, source: str):
        self.source = source
        self.lines: dict[tuple, int] = {}

    def record(self, node, path=()) -> None:
        self.lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, value_node in node.value:
                key = key_node.value
                if key in seen:
                    raise GraphError(self.source, key_node.start_mark.line + 1,
                                     ".".join(map(str, (*path, key))), "duplicate key")
                seen.add(key)
                self.lines[(*path, key)] = key_node.start_mark.line + 1
                self.record(value_node, (*path, key))
                self.lines[(*path, key)] = key_node.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self.record(item, (*path, i))

    def line(self, path) -> int | None:
        path = tuple(path)
        while path not in self.lines and path:
            path = path[:-1]
        return self.lines.get(path)

    def error(self, path, message: str, key=None) -> GraphError:
        """The error at ``path``'s line; ``key`` (default: ``path``) is the key it names."""
        key = path if key is None else key
        return GraphError(self.source, self.line(path), ".".join(map(str, key)), message)


def read(text: str, source: str) -> tuple[object, Lines]:
    """``(data, lines)`` of a graph's text; every problem is one :class:`GraphError`."""
    if len(text.encode()) > MAX_GRAPH_BYTES:
        raise GraphError(source, None, "", f"graph file is larger than {MAX_GRAPH_BYTES} bytes")
    lines = Lines(source)
    loader = None
    try:
        loader = _Loader(text)  # the reader checks every character here
        root = loader.get_single_node()
        if root is None:
            return None, lines
        _check_size(root, source)
        lines.record(root)
        return loader.construct_document(root), lines
    except _Refused as exc:
        raise GraphError(source, exc.problem_mark.line + 1, "", exc.problem) from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        char = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise GraphError(source, line, "", f"invalid YAML: unacceptable character #x{char:04x}: "
                         f"{exc.reason}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = " ".join(str(exc.problem or exc.context or exc).split())
        raise GraphError(source, mark.line + 1 if mark else None, "",
                         f"invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise GraphError(source, None, "", f"invalid YAML: {' '.join(str(exc).split())}") \
            from None
    except RecursionError:
        raise GraphError(source, None, "", "invalid YAML: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def _check_size(root, source: str) -> None:
    """Count the document's values as if every alias were expanded, in time linear in the
    composed nodes (each is sized once); refuse a recursive alias or too many values."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise GraphError(source, node.start_mark.line + 1, "",
                             "a YAML alias refers to a value that contains it")
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            total += sum(size(item) for item in node.value)
        open_nodes.discard(key)
        if total > MAX_YAML_NODES:
            raise GraphError(source, node.start_mark.line + 1, "",
                             f"YAML aliases expand to more than {MAX_YAML_NODES} values")
        sizes[key] = total
        return total

    size(root)
