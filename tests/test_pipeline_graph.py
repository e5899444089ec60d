"""Graph spec: every mistake is one line naming file, line and key, exit code 2, no traceback.

Each malformed graph is checked twice: in-process through :func:`pipeline.graph.load` (exact
message) and through the real command line, ``python run.py GRAPH``, exactly as a user types
it. The command-line runs go through a small pool of subprocesses so the file stays fast.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

import typedconfig
from pipeline import graph as graphlib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "graphs", "demo_counter.yaml")
KNOWN = ", ".join(graphlib.known_kinds())

# A small valid graph; the cases below edit it. Line numbers, for reading the expectations:
BASE = """\
name: demo
topics:
  numbers: {delivery: reliable, hwm: 100}
nodes:
  source:
    kind: demo_source
    config: {count: 10}
    publishes: [numbers]
  sink:
    kind: demo_sink
    config: {expected: 10, input: numbers}
    subscribes: [numbers]
run:
  stop_when: [sink]
"""
# 1 name / 3 topics.numbers / 5 nodes.source / 6 kind / 7 config / 8 publishes
# 9 nodes.sink / 10 kind / 11 config / 12 subscribes / 13 run / 14 stop_when

# User node modules for the module:function cases (put on PYTHONPATH).
USER_MODULES = {
    "conduit_test_boom.py": "raise RuntimeError('boom at import')\n",
    "conduit_test_syntax.py": "def run(:\n",
    "conduit_test_fine.py": "async def run(config, node, ready):\n    ready()\n",
    # Kinds with declared ports that disagree with the demo kinds on message types.
    "conduit_test_ports.py": (
        "from pipeline.messages import Lifecycle, Record\n"
        "from pipeline.ports import Port, Ports, Service\n"
        "async def wants_lifecycle(config, node, ready):\n    ready()\n"
        "wants_lifecycle.PORTS = Ports(subscribes={'numbers': Port(Lifecycle)})\n"
        "async def serves_sample(config, node, ready):\n    ready()\n"
        "serves_sample.PORTS = Ports(subscribes={'numbers': Port(Record)},\n"
        "                           serves={'sample': Service(Record, Record)})\n"
        "async def calls_sample(config, node, ready):\n    ready()\n"
        "calls_sample.PORTS = Ports(calls={'sample': Service(Record, Lifecycle)})\n"),
}


def edit(old: str, new: str, text: str = BASE) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def sink_extra(lines: str) -> str:
    """BASE with ``lines`` added to the sink node, after line 12."""
    return edit("    subscribes: [numbers]\n", "    subscribes: [numbers]\n" + lines)


# (id, yaml text, --set overrides, expected line or None, expected key, message fragment)
CASES = [
    ("invalid-yaml", "name: x\nnodes: [a\n  b: c\n", (), 3, "", "invalid YAML"),
    ("yaml-tab", "name: x\nnodes:\n  a:\n\tkind: demo_sink\n", (), 4, "", "invalid YAML"),
    ("yaml-python-tag", "name: !!python/object:os.system x\n", (), 1, "",
     "could not determine a constructor"),
    ("yaml-two-documents", "name: x\n---\nname: y\n", (), 2, "", "invalid YAML"),
    ("not-utf8", b"name: \xff\xfe\n", (), None, "", "not UTF-8"),
    ("empty-file", "", (), 1, "", "a graph must be a mapping"),
    ("top-level-list", "- name: x\n- nodes: {}\n", (), 1, "", "a graph must be a mapping"),
    ("unknown-top-key", BASE + "extras: 1\n", (), 15, "extras", "unknown key (allowed:"),
    ("missing-name", edit("name: demo\n", ""), (), 1, "name", "required key is missing"),
    ("bad-name", edit("name: demo", "name: 'my demo'"), (), 1, "name", "must be a name"),
    ("name-not-string", edit("name: demo", "name: 42"), (), 1, "name", "must be a name"),
    ("bad-topic-name", edit("topics:\n", "topics:\n  'my topic': {delivery: lossy}\n"), (),
     3, "topics.my topic", "names use letters"),
    ("unknown-topic-key", edit("hwm: 100}", "hwm: 100, color: red}"), (), 3,
     "topics.numbers.color",
     "unknown key (allowed: coalesce, delivery, hwm, hwm_bytes, partitioned)"),
    ("coalesce-not-bool", edit("hwm: 100}", "hwm: 100, coalesce: 3}"), (), 3,
     "topics.numbers.coalesce", "expected"),
    ("coalesce-lossy", edit("delivery: reliable, hwm: 100}", "delivery: lossy, coalesce: true}"),
     (), 3, "topics.numbers.coalesce", "only reliable topics batch what they send"),
    ("bad-delivery", edit("reliable", "sometimes"), (), 3, "topics.numbers.delivery",
     "must be one of reliable, latest, lossy, got 'sometimes'"),
    ("missing-delivery", edit("delivery: reliable, ", ""), (), 3, "topics.numbers.delivery",
     "got None"),
    ("hwm-zero", edit("hwm: 100", "hwm: 0"), (), 3, "topics.numbers.hwm", "must be >= 1, got 0"),
    ("hwm-string", edit("hwm: 100", "hwm: '100'"), (), 3, "topics.numbers.hwm",
     "expected an integer, got str '100'"),
    ("no-nodes", "name: demo\nnodes: {}\n", (), 2, "nodes", "at least one node"),
    ("nodes-missing", "name: demo\n", (), 1, "nodes", "at least one node"),
    ("nodes-a-list", "name: demo\nnodes:\n  - kind: demo_sink\n", (), 2, "nodes",
     "expected a mapping, got list"),
    ("node-not-a-mapping", edit("run:\n", "  extra: demo_source\nrun:\n"), (), 13,
     "nodes.extra", "expected a mapping, got str"),
    ("unknown-node-key", edit("    publishes: [numbers]\n",
                              "    publishes: [numbers]\n    colour: red\n"), (), 9,
     "nodes.source.colour", "unknown key (allowed: calls, config,"),
    ("missing-kind", edit("    kind: demo_source\n", ""), (), 5, "nodes.source.kind",
     "required: the node kind"),
    ("unknown-kind", edit("kind: demo_sink", "kind: snk"), (), 10, "nodes.sink.kind",
     f"unknown node kind 'snk' (known: {KNOWN})"),
    ("kind-path-traversal", edit("kind: demo_sink", "kind: ../demo_sink"), (), 10,
     "nodes.sink.kind", "unknown node kind '../demo_sink'"),
    ("module-does-not-import", edit("kind: demo_sink", "kind: no_such_pkg.nodes:run"), (), 10,
     "nodes.sink.kind", "cannot import 'no_such_pkg.nodes': No module named 'no_such_pkg'"),
    ("module-raises-on-import", edit("kind: demo_sink", "kind: conduit_test_boom:run"), (), 10,
     "nodes.sink.kind", "cannot import 'conduit_test_boom': RuntimeError: boom at import"),
    ("module-syntax-error", edit("kind: demo_sink", "kind: conduit_test_syntax:run"), (), 10,
     "nodes.sink.kind", "cannot import 'conduit_test_syntax': SyntaxError"),
    ("module-lacks-function", edit("kind: demo_sink", "kind: conduit_test_fine:nope"), (), 10,
     "nodes.sink.kind", "'conduit_test_fine' has no function 'nope'"),
    ("replicas-zero", sink_extra("    replicas: 0\n"), (), 13, "nodes.sink.replicas",
     "must be >= 1, got 0"),
    ("replicas-string", sink_extra("    replicas: two\n"), (), 13, "nodes.sink.replicas",
     "expected an integer, got str 'two'"),
    ("replicas-bool", sink_extra("    replicas: true\n"), (), 13, "nodes.sink.replicas",
     "expected an integer, got bool True"),
    ("replicas-float", sink_extra("    replicas: 1.5\n"), (), 13, "nodes.sink.replicas",
     "expected an integer"),
    ("unknown-config-key", edit("    config: {count: 10}\n",
                                "    config:\n      count: 10\n      cuont: 5\n"), (), 9,
     "nodes.source.config.cuont", "unknown key (known: count, size, output)"),
    ("bad-config-type", edit("config: {count: 10}", "config: {count: many}"), (), 7,
     "nodes.source.config.count", "expected an integer, got str 'many'"),
    ("config-below-minimum", edit("config: {count: 10}", "config: {count: -3}"), (), 7,
     "nodes.source.config.count", "must be >= 0, got -3"),
    ("config-not-a-mapping", edit("config: {count: 10}", "config: [10]"), (), 7,
     "nodes.source.config", "expected a mapping, got list"),
    ("publishes-undeclared-topic", edit("publishes: [numbers]", "publishes: [numbers, other]"),
     (), 8, "nodes.source.publishes.1", "topic 'other' is not declared under topics"),
    ("publishes-not-names", edit("publishes: [numbers]", "publishes: {numbers: 1}"), (), 8,
     "nodes.source.publishes", "expected a list of names"),
    ("subscribed-never-published",
     edit("subscribes: [numbers]", "subscribes: [numbers, other]",
          edit("topics:\n", "topics:\n  other: {delivery: lossy}\n")), (), 13,
     "nodes.sink.subscribes.1", "topic 'other' is subscribed but no node publishes it"),
    ("declared-never-published", edit("topics:\n", "topics:\n  unused: {delivery: latest}\n"),
     (), 3, "topics.unused", "topic is declared but no node publishes it"),
    ("publishes-and-subscribes", edit("publishes: [numbers]",
                                      "publishes: [numbers]\n    subscribes: [numbers]"), (), 9,
     "nodes.source.subscribes.0", "node both publishes and subscribes 'numbers'"),
    ("duplicate-node", edit("run:\n", "  source:\n    kind: demo_source\nrun:\n"), (), 13,
     "nodes.source", "duplicate key"),
    ("duplicate-topic-in-list", edit("subscribes: [numbers]", "subscribes: [numbers, numbers]"),
     (), 12, "nodes.sink.subscribes", "a name is listed twice"),
    ("calls-unserved-service", sink_extra("    calls: [sample]\n"), (), 13,
     "nodes.sink.calls.0", "service 'sample' is called but no node serves it"),
    ("service-named-like-topic", sink_extra("    serves: [numbers]\n"), (), 13,
     "nodes.sink.serves.0", "already a topic"),
    ("restart-bad-policy", sink_extra("    restart: {policy: sometimes}\n"), (), 13,
     "nodes.sink.restart.policy", "must be one of always, on-failure, never, got 'sometimes'"),
    ("restart-unknown-key", sink_extra("    restart:\n      policy: always\n      retries: 3\n"),
     (), 15, "nodes.sink.restart.retries", "unknown key (allowed: backoff_max_s,"),
    ("restart-max-failures-zero", sink_extra("    restart: {max_failures: 0}\n"), (), 13,
     "nodes.sink.restart.max_failures", "must be >= 1, got 0"),
    ("bad-device", sink_extra("    device: tpu\n"), (), 13, "nodes.sink.device",
     "must be cpu, cuda, cuda:N or auto, got 'tpu'"),
    ("nice-too-high", sink_extra("    nice: 20\n"), (), 13, "nodes.sink.nice",
     "must be 0 to 19, got 20"),
    ("nice-negative", sink_extra("    nice: -1\n"), (), 13, "nodes.sink.nice", "must be >= 0, got -1"),
    ("run-unknown-key", BASE + "  steps: 100\n", (), 15, "run.steps", "unknown key (allowed:"),
    ("run-not-a-mapping", edit("run:\n  stop_when: [sink]\n", "run: fast\n"), (), 13, "run",
     "expected a mapping, got str"),
    ("negative-duration", BASE + "  duration_s: -5\n", (), 15, "run.duration_s",
     "must be > 0, got -5.0"),
    ("duration-string", BASE + "  duration_s: soon\n", (), 15, "run.duration_s",
     "expected float | None, got str 'soon'"),
    ("stop-when-unknown-node", edit("stop_when: [sink]", "stop_when: [sink, snk]"), (), 14,
     "run.stop_when.1", "unknown node 'snk'"),
    ("bad-transport", BASE + "  transport: udp\n", (), 15, "run.transport",
     "must be ipc or tcp, got 'udp'"),
    ("set-unknown-path", BASE, ("nodes.nosuch.config.count=1",), None, "nodes.nosuch",
     "--set: no such key (known: source, sink)"),
    ("set-without-equals", BASE, ("nodes.source.config.count",), None,
     "nodes.source.config.count", "--set expects key.path=value"),
    ("set-below-a-scalar", BASE, ("name.first=1",), None, "name.first",
     "--set: parent is not a mapping"),
    ("set-bad-type", BASE, ("nodes.source.config.count=abc",), 7, "nodes.source.config.count",
     "expected an integer, got str 'abc'"),
    ("set-unknown-config-key", BASE, ("nodes.source.config.cuont=3",), 7,
     "nodes.source.config.cuont", "unknown key (known: count, size, output)"),
    # declared ports (pipeline/ports.py): the graph entry against the kind, both ends' types
    ("port-not-declared", edit("publishes: [numbers]", "publishes: [numbers, other]",
                               edit("topics:\n", "topics:\n  other: {delivery: lossy}\n")),
     (), 9, "nodes.source.publishes",
     "kind 'demo_source' does not publish 'other' (it declares publishes: numbers)"),
    ("required-port-missing", edit("subscribes: [numbers]", "subscribes: []"), (), 12,
     "nodes.sink.subscribes", "kind 'demo_sink' must subscribe to 'numbers': add it to "
     "subscribes"),
    ("topic-type-mismatch", edit("kind: demo_sink", "kind: conduit_test_ports:wants_lifecycle"),
     (), 12, "nodes.sink.subscribes", "topic 'numbers' carries Record from node 'source', "
     "but this node expects Lifecycle"),
    ("service-type-mismatch",
     edit("kind: demo_sink", "kind: conduit_test_ports:serves_sample",
          sink_extra("    serves: [sample]\n  caller:\n"
                     "    kind: conduit_test_ports:calls_sample\n    calls: [sample]\n")),
     (), 16, "nodes.caller.calls", "service 'sample' of node 'sink' takes Record and replies "
     "Record, but this node sends Record and expects Lifecycle"),
    ("validate-hook", edit("kind: demo_sink\n    config: {expected: 10, input: numbers}",
                           "kind: demo_transformer\n    config: {input: numbers, output: "
                           "numbers}"),
     (), 11, "nodes.sink.config.output", "must differ from input ('numbers')"),
    ("sink-expected-negative", edit("expected: 10", "expected: -1"), (), 11,
     "nodes.sink.config.expected", "must be >= 0, got -1"),
]
assert len(CASES) >= 25 and len({c[0] for c in CASES}) == len(CASES)

# Every case runs in-process; these also run through ``python run.py`` (about half a second
# of imports each): one per kind of mistake, so the command line's one-line contract is held.
CLI_CASES = ["invalid-yaml", "not-utf8", "top-level-list", "unknown-top-key", "hwm-string",
             "unknown-kind", "module-raises-on-import", "module-syntax-error", "replicas-bool",
             "unknown-config-key", "subscribed-never-published", "duplicate-node",
             "negative-duration", "set-unknown-path", "set-bad-type", "topic-type-mismatch",
             "required-port-missing"]
assert set(CLI_CASES) <= {c[0] for c in CASES}


def expected_error(path: str, line, key: str) -> str:
    where = f"{path}:{line}" if line else path
    return f"{where}: {key}: " if key else f"{where}: "


@pytest.fixture(scope="module")
def case_files(tmp_path_factory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("graphs")
    paths = {}
    for case_id, text, *_ in CASES:
        path = directory / f"{case_id}.yaml"
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)
        paths[case_id] = str(path)
    (directory / "alias-bomb.yaml").write_text(BOMB)
    paths["alias-bomb"] = str(directory / "alias-bomb.yaml")
    paths["missing-file"] = str(directory / "no-such-graph.yaml")
    paths["a-directory"] = str(directory)
    return paths


@pytest.fixture(scope="module")
def user_modules(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("usermods")
    for name, text in USER_MODULES.items():
        (directory / name).write_text(text)
    return str(directory)


@pytest.fixture(scope="module")
def cli_results(case_files, user_modules) -> dict[str, subprocess.CompletedProcess]:
    """Every malformed graph through ``python run.py``, a few processes at a time."""
    env = {**os.environ, "PYTHONPATH": user_modules}
    jobs = {case_id: [case_files[case_id], *(a for o in overrides for a in ("--set", o))]
            for case_id, _, overrides, *_ in CASES if case_id in CLI_CASES}
    jobs["alias-bomb"] = ["check", case_files["alias-bomb"]]
    jobs["missing-file"] = [case_files["missing-file"]]
    jobs["a-directory"] = [case_files["a-directory"]]

    def run(args):
        return subprocess.run([sys.executable, "run.py", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)

    with ThreadPoolExecutor(max_workers=max(2, min(6, os.cpu_count() or 2))) as pool:
        return dict(zip(jobs, pool.map(run, jobs.values()), strict=True))


@pytest.mark.parametrize("case_id,text,overrides,line,key,fragment", CASES,
                         ids=[c[0] for c in CASES])
def test_malformed_graph_is_one_precise_error(case_files, user_modules, monkeypatch,
                                              case_id, text, overrides, line, key, fragment):
    import time

    monkeypatch.syspath_prepend(user_modules)
    path = case_files[case_id]
    started = time.monotonic()
    with pytest.raises(graphlib.GraphError) as info:
        graphlib.load(path, overrides)
    assert time.monotonic() - started < 2.0, case_id
    message = str(info.value)
    assert message.startswith(expected_error(path, line, key)), message
    assert fragment in message, message
    assert "\n" not in message
    assert (info.value.line, info.value.key) == (line, key)


@pytest.mark.parametrize("case_id,text,overrides,line,key,fragment",
                         [c for c in CASES if c[0] in CLI_CASES],
                         ids=[c[0] for c in CASES if c[0] in CLI_CASES])
def test_malformed_graph_through_the_cli(cli_results, case_files, case_id, text, overrides,
                                         line, key, fragment):
    result = cli_results[case_id]
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: " + expected_error(case_files[case_id], line, key)), lines
    assert fragment in lines[0]


@pytest.mark.parametrize("case_id,fragment", [("missing-file", "No such file or directory"),
                                              ("a-directory", "Is a directory")])
def test_unreadable_graph_file(cli_results, case_files, case_id, fragment):
    result = cli_results[case_id]
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr == f"error: {case_files[case_id]}: cannot read graph: {fragment}\n"


# --- valid graphs --------------------------------------------------------------------------------


def test_demo_graph_loads():
    graph = graphlib.load(DEMO)
    assert graph.name == "demo_counter" and graph.source == DEMO
    assert list(graph.nodes) == ["source", "transformer", "sink"]
    assert {t.name: (t.delivery, t.hwm) for t in graph.topics.values()} == {
        "numbers": ("reliable", 1000), "doubled": ("reliable", 1000)}
    transformer = graph.nodes["transformer"]
    assert transformer.kind == "demo_transformer" and transformer.replicas == 1
    assert transformer.subscribes == ("numbers",) and transformer.publishes == ("doubled",)
    assert transformer.restart.policy == "always" and transformer.restart.window_s == 60.0
    assert graph.nodes["source"].restart == graphlib.RestartPolicy()  # defaults
    assert graph.consumer_groups("numbers") == ["transformer"]
    assert graph.consumer_groups("doubled") == ["sink"]
    assert graph.run.stop_when == ("sink",) and graph.run.duration_s == 600.0
    assert graph.run.transport == "ipc" and graph.services == ()


def test_set_overrides():
    graph = graphlib.load(DEMO, [
        "nodes.source.config.count=5",
        "nodes.transformer.replicas=3",
        "topics.numbers.hwm=10",
        "run.duration_s=2.5",
        "run.transport=tcp",
        "nodes.sink.device=cuda:1",
        "nodes.transformer.restart.policy=never",
    ])
    assert graph.nodes["source"].config == {"count": 5, "size": 16}
    assert graph.nodes["transformer"].replicas == 3
    assert graph.nodes["transformer"].restart.policy == "never"
    assert graph.topics["numbers"].hwm == 10
    assert graph.run.duration_s == 2.5 and graph.run.transport == "tcp"
    assert graph.nodes["sink"].device == "cuda:1"
    # The resolved graph (written to the run directory) carries the overrides.
    assert graph.raw["nodes"]["source"]["config"]["count"] == 5
    assert graph.raw["nodes"]["transformer"]["replicas"] == 3
    # The file itself is untouched.
    assert graphlib.load(DEMO).nodes["source"].config["count"] == 100000


def test_set_values_are_yaml():
    graph = graphlib.parse(BASE, "base.yaml", ["nodes.sink.config.input=numbers",
                                               "run.stop_when=[sink, source]",
                                               "nodes.source.config={count: 3, size: 2}"])
    assert graph.run.stop_when == ("sink", "source")
    assert graph.nodes["source"].config == {"count": 3, "size": 2}


def test_stop_order_of_the_demo_graph():
    graph = graphlib.load(DEMO)
    # Producers stop first, so their consumers drain everything they sent.
    assert graph.stop_order() == [["source"], ["transformer"], ["sink"]]


# The stop-order tests wire kinds freely: they use a kind without declared ports.
def test_order_follows_reliable_topics_and_services_only():
    text = """\
name: fan
topics:
  experience: {delivery: reliable}
  params: {delivery: latest}
  metrics: {delivery: lossy}
nodes:
  actor_a:
    kind: "tests.crashing_node:run"
    publishes: [experience, metrics]
    subscribes: [params]
  actor_b:
    kind: "tests.crashing_node:run"
    publishes: [experience]
  replay:
    kind: "tests.crashing_node:run"
    subscribes: [experience]
    serves: [sample]
  learner:
    kind: "tests.crashing_node:run"
    calls: [sample]
    publishes: [params]
    subscribes: [metrics]
"""
    graph = graphlib.parse(text, "fan.yaml")
    assert graph.services == ("sample",)
    # replay is fed by both actors and called by the learner; params (latest) and metrics
    # (lossy) never hold anybody back.
    assert graph.stop_order() == [["actor_a", "actor_b", "learner"], ["replay"]]


def test_reliable_cycle_is_broken_in_declaration_order():
    text = """\
name: ring
topics:
  a: {delivery: reliable}
  b: {delivery: reliable}
nodes:
  first: {kind: "tests.crashing_node:run", subscribes: [b], publishes: [a]}
  second: {kind: "tests.crashing_node:run", subscribes: [a], publishes: [b]}
"""
    graph = graphlib.parse(text, "ring.yaml")
    assert graph.stop_order() == [["first"], ["second"]]


def test_stop_after_overrides_the_order_a_call_implies():
    """A caller stops before what it calls, unless it lists it in ``stop_after``: a
    checkpointer that calls an actor's state service and waits for the actor to stop (not
    a cycle broken in declaration order, which would stop the saver first here)."""
    text = """\
name: saver
topics:
  data: {delivery: reliable}
nodes:
  saver: {kind: "tests.crashing_node:run", calls: [state]%s}
  producer: {kind: "tests.crashing_node:run", publishes: [data], serves: [state]}
  store: {kind: "tests.crashing_node:run", subscribes: [data]}
"""
    assert graphlib.parse(text % "", "s.yaml").stop_order() == [["saver"], ["producer"],
                                                                ["store"]]
    after = graphlib.parse(text % ", stop_after: [producer]", "s.yaml")
    assert after.stop_order() == [["producer"], ["saver", "store"]]


def test_user_module_kind_is_accepted(user_modules, monkeypatch):
    monkeypatch.syspath_prepend(user_modules)
    graph = graphlib.parse(edit("kind: demo_sink", "kind: conduit_test_fine:run"), "user.yaml")
    assert graph.nodes["sink"].kind == "conduit_test_fine:run"


# --- YAML 1.2 numbers, non-JSON values, limits (issue 9 item 2, issue 11 item 9) ----------------

BOMB = "".join(f"{a}: &{a} [{', '.join([f'*{b}'] * 9) if b else ', '.join(['lol'] * 9)}]\n"
               for a, b in zip("abcdefghi", ["", *"abcdefgh"], strict=True))  # 9**9 values
LONG = "n" * 60

# (id, yaml text, --set overrides, the exact message after "<file>:")
EXACT_CASES = [
    ("yaml-date", edit("config: {count: 10}", "config: {count: 2024-01-01}"), (),
     "7: a YAML date is not a graph value (graphs hold JSON-like values): quote it for a string"),
    ("yaml-set", edit("config: {count: 10}", "config: {count: !!set {a}}"), (),
     "7: a YAML set is not a graph value (graphs hold JSON-like values): quote it for a string"),
    ("yaml11-bool-value", edit("expected: 10", "expected: yes"), (),
     "11: 'yes' is a boolean in YAML 1.1 and a string in YAML 1.2: write true or false, or "
     "quote it for a string"),
    ("yaml11-bool-name", edit("  sink:\n", "  off:\n"), (),
     "9: 'off' is a boolean in YAML 1.1 and a string in YAML 1.2: write true or false, or "
     "quote it for a string"),
    ("yaml-control-char", edit("stop_when: [sink]", "stop_when: [si\x07nk]"), (),
     "14: invalid YAML: unacceptable character #x0007: special characters are not allowed"),
    ("yaml-unclosed-quote", edit("stop_when: [sink]", "stop_when: ['sink]"), (),
     "15: invalid YAML: found unexpected end of stream"),
    ("yaml-alias-bomb", BOMB, (), "6: YAML aliases expand to more than 100000 values"),
    ("yaml-recursive-alias", "name: x\nnodes: &n\n  a: *n\n", (),
     "2: a YAML alias refers to a value that contains it"),
    ("float-for-integer", edit("config: {count: 10}", "config: {count: 2.5e0}"), (),
     "7: nodes.source.config.count: expected an integer, got float 2.5"),
    ("replicas-too-many", sink_extra("    replicas: 100000\n"), (),
     "13: nodes.sink.replicas: must be <= 64, got 100000"),
    ("heartbeat-timeout-below-period", BASE + "  heartbeat_s: 2\n  heartbeat_timeout_s: 1.5\n",
     (), "16: run.heartbeat_timeout_s: heartbeat_timeout_s (1.5) must be at least twice "
     "heartbeat_s (2)"),
    ("heartbeat-period-above-default-timeout", BASE + "  heartbeat_s: 20\n", (),
     "15: run.heartbeat_s: heartbeat_timeout_s (30) must be at least twice heartbeat_s (20)"),
    ("stop-after-cycle", edit("    publishes: [numbers]\n",
                              "    publishes: [numbers]\n    stop_after: [sink]\n",
                              sink_extra("    stop_after: [source]\n")), (),
     "14: nodes.sink.stop_after: stop_after cycle: source -> sink -> source"),
    ("stop-after-unknown", sink_extra("    stop_after: [snk]\n"), (),
     "13: nodes.sink.stop_after.0: unknown node 'snk'"),
    ("hwm-bytes-zero", edit("hwm: 100}", "hwm: 100, hwm_bytes: 0}"), (),
     "3: topics.numbers.hwm_bytes: must be >= 1, got 0"),
    ("hwm-bytes-string", edit("hwm: 100}", "hwm: 100, hwm_bytes: 1GB}"), (),
     "3: topics.numbers.hwm_bytes: expected an integer, got str '1GB'"),
    ("hwm-bytes-on-lossy", edit("reliable, hwm: 100}", "lossy, hwm: 100, hwm_bytes: 1000}"), (),
     "3: topics.numbers.hwm_bytes: only reliable topics queue messages; a lossy topic drops or "
     "replaces them"),
    ("ipc-path-too-long", edit("  source:\n", f"  {LONG}:\n"), (),
     f"5: nodes.{LONG}: node name and 'numbers' are too long for an ipc socket path"),
    ("set-yaml11-bool", BASE, ("nodes.sink.config.expected=no",), "11: nodes.sink.config."
     "expected: expected an integer, got str 'no'"),
    ("file-too-large", BASE + "#" * (1 << 20) + "\n", (), None),
]
assert len({c[0] for c in EXACT_CASES}) == len(EXACT_CASES)


@pytest.mark.parametrize("case_id,text,overrides,message", EXACT_CASES,
                         ids=[c[0] for c in EXACT_CASES])
def test_yaml_and_limit_mistakes_are_one_exact_line_in_under_2s(tmp_path, case_id, text,
                                                                overrides, message):
    import time

    path = tmp_path / f"{case_id}.yaml"
    path.write_text(text)
    started = time.monotonic()
    with pytest.raises(graphlib.GraphError) as info:
        graphlib.load(str(path), overrides)
    elapsed = time.monotonic() - started
    if message is None:
        message = " graph file is larger than 1048576 bytes"
        expected = f"{path}:{message}"
    else:
        expected = f"{path}:{message}"
    if case_id == "ipc-path-too-long":  # the limit depends on the temp directory's length
        assert str(info.value).startswith(expected), str(info.value)
    else:
        assert str(info.value) == expected
    assert elapsed < 2.0, f"{case_id} took {elapsed:.2f}s"


def test_numbers_are_yaml_1_2():
    from pipeline.graphyaml import read_value

    assert read_value("3e-4") == 3e-4 and read_value("1e5") == 100000.0
    assert read_value("1_000") == 1000 and read_value("-2.5E+3") == -2500.0
    assert read_value("0x1f") == 31 and read_value("010") == 10  # no YAML 1.1 octal
    assert read_value(".inf") == float("inf") and read_value("1:30") == "1:30"  # no base 60
    assert read_value("true") is True and read_value("null") is None
    # An integral float is a fine count (1e5 steps); the config keeps it an int.
    graph = graphlib.parse(edit("config: {count: 10}", "config: {count: 1e5}"), "g.yaml")
    assert graph.configs["source"].count == 100000 and type(graph.configs["source"].count) is int
    graph = graphlib.parse(BASE, "g.yaml", ["nodes.source.config.count=1_000"])
    assert graph.configs["source"].count == 1000


def test_alias_bomb_fails_fast_and_small(tmp_path):
    import resource
    import time

    assert len(BOMB) < 1500
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    with pytest.raises(graphlib.GraphError, match="YAML aliases expand to more than"):
        graphlib.load(str(path))
    assert time.monotonic() - started < 2.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50_000  # KiB


def test_hwm_bytes_and_coalesce_reach_the_launch():
    from pipeline import wiring

    graph = graphlib.parse(edit("hwm: 100}", "hwm: 100, hwm_bytes: 4096, coalesce: true}"),
                           "g.yaml")
    launch = wiring.make_launch(graph, "source", 0, 0, "/tmp/run", "/tmp/s", None)
    assert launch.topics["numbers"] == {"delivery": "reliable", "hwm": 100, "hwm_bytes": 4096,
                                      "partitioned": False, "coalesce": True}
    assert launch.calls == []


def test_alias_bomb_through_run_py_check(cli_results, case_files):
    result = cli_results["alias-bomb"]
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"error: {case_files['alias-bomb']}:6: YAML aliases expand to more "
                             "than 100000 values\n")


def test_run_py_check(case_files):
    ok = subprocess.run([sys.executable, "run.py", "check", DEMO, "--set",
                         "nodes.source.config.count=1e3"], cwd=REPO, capture_output=True,
                        text=True, timeout=120)
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "ok\n", "")
    bad = subprocess.run([sys.executable, "run.py", "check", case_files["replicas-bool"]],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == (f"error: {case_files['replicas-bool']}:13: nodes.sink.replicas: "
                          "expected an integer, got bool True\n")


@pytest.mark.parametrize("name", sorted(os.listdir(os.path.join(REPO, "graphs"))))
def test_shipped_graphs_pass_the_check(name):
    # As run.py check: a dataset a graph's header says how to make is a note, not an error.
    with typedconfig.noting_absent_inputs() as absent:
        try:
            graphlib.load(os.path.join(REPO, "graphs", name))
        except graphlib.GraphError as exc:  # an env of an extra not installed here (atari)
            if "extra: pip install" not in str(exc):
                raise
            pytest.skip(str(exc))
    assert all("bench/datasets.py" in note for note in absent), absent


def _string_constants(path: str) -> set[str]:
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)}


def test_every_shipped_graph_is_run_by_some_test():
    # A graph that only passes the check can still fail at its first step (a node's config the
    # schema allows but the node refuses, an env the runner cannot make): each one is named,
    # by its name or its file, as a string in some test that runs it.
    tests_dir = os.path.join(REPO, "tests")
    named = set().union(*(_string_constants(os.path.join(tests_dir, f))
                          for f in os.listdir(tests_dir) if f.endswith(".py")))
    unrun = [f for f in sorted(os.listdir(os.path.join(REPO, "graphs")))
             if f.removesuffix(".yaml") not in named
             and not any(s.endswith(f) for s in named)]
    assert not unrun, f"no test runs {unrun}"


def test_an_absent_input_is_an_error_unless_noted_and_the_note_ends_with_the_block():
    with pytest.raises(typedconfig.ConfigError, match="datasets.0: make it"):
        typedconfig.absent_input("datasets.0", "make it")
    with typedconfig.noting_absent_inputs() as absent:
        typedconfig.absent_input("datasets.0", "make it")
        typedconfig.absent_input("datasets.1", "and this")
    assert absent == ["make it", "and this"]
    with pytest.raises(typedconfig.ConfigError):
        typedconfig.absent_input("datasets.0", "make it")
