"""Bring your own node kind (docs/custom.md): a module (its ``run``) or ``module:function``
whose ``Config``, ``PORTS``, ``validate`` and ``exclusive`` are read from the function first,
then from the module, and checked at load like a built-in kind's; and ``critical: false``,
a node the run goes on without once its restarts are exhausted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import nodes  # noqa: F401 - registers the built-in kinds and the agent section
from pipeline import graph as graphlib
from pipeline import kinds
from pipeline.cli import CommandFailed
from pipeline.graphyaml import GraphError
from tests.pipeline_harness import ROOT, LiveRun

CORRIDOR = os.path.join(ROOT, "examples", "corridor_dqn.yaml")

# One module, two kinds: ``run`` takes the module's declarations, ``other`` its own.
TWO_KINDS = '''
from dataclasses import dataclass
from pipeline.messages import Record
from pipeline.ports import Port, Ports
from typedconfig import ConfigError

@dataclass(frozen=True)
class Config:
    count: int = 1

PORTS = Ports(subscribes={"numbers": Port(Record)})

def validate(config):
    if config.count > 9:
        raise ConfigError("count", "at most 9")

def exclusive(config):
    return True

async def run(config, node, ready):
    ready()

@dataclass(frozen=True)
class OtherConfig:
    width: float = 1.0

async def other(config, node, ready):
    ready()

other.Config = OtherConfig
'''

GRAPH = """\
name: kinds
topics:
  numbers: {delivery: reliable}
nodes:
  source: {kind: demo_source, config: {count: 10}}
  user:
    kind: %s
    config: %s
"""


@pytest.fixture
def two_kinds(tmp_path, monkeypatch):
    (tmp_path / "conduit_test_two_kinds.py").write_text(TWO_KINDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "conduit_test_two_kinds"
    sys.modules.pop("conduit_test_two_kinds", None)


def load_error(kind: str, config: str) -> str:
    with pytest.raises(GraphError) as info:
        graphlib.parse(GRAPH % (kind, config), "k.yaml")
    return str(info.value)


def test_a_kind_takes_the_functions_declarations_then_the_modules(two_kinds):
    for kind in (two_kinds, f"{two_kinds}:run"):  # the module's run, by either spelling
        resolved = kinds.resolve(kind)
        assert resolved.config_cls.__name__ == "Config"
        assert resolved.ports.subscribes.keys() == {"numbers"}
        assert resolved.exclusive is not None and resolved.validate is not None
        graph = graphlib.parse(GRAPH % (kind, "{count: 3}"), "k.yaml")
        assert graph.configs["user"].count == 3
        assert graph.nodes["user"].subscribes == ("numbers",)  # defaulted from its PORTS
        assert load_error(kind, "{cuont: 3}") == \
            "k.yaml:8: nodes.user.config.cuont: unknown key (known: count)"
        assert load_error(kind, "{count: 10}") == "k.yaml:8: nodes.user.config.count: at most 9"
    other = kinds.resolve(f"{two_kinds}:other")
    assert other.config_cls.__name__ == "OtherConfig"  # its own, not the module's
    assert other.ports is not None  # what it does not carry, the module declares
    assert load_error(f"{two_kinds}:other", "{count: 3}") == \
        "k.yaml:8: nodes.user.config.count: unknown key (known: width)"


def test_the_example_node_is_checked_by_run_py_check():
    result = subprocess.run([sys.executable, "run.py", "check", CORRIDOR, "--set",
                             "nodes.best_return.config={metrc: eval/return}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout
    assert result.stderr.strip().endswith(
        "nodes.best_return.config.metrc: unknown key (known: metric, filename)"), result.stderr


def test_a_critical_false_node_cannot_end_the_run():
    text = GRAPH % ("demo_sink", "{input: numbers, expected: 10}") + \
        "    critical: false\nrun: {stop_when: [user]}\n"
    with pytest.raises(GraphError, match=r"k.yaml:10: run.stop_when.0: node 'user' is "
                                         r"critical: false \(the run goes on without it\)"):
        graphlib.parse(text, "k.yaml")


@pytest.mark.timeout(300)
def test_the_example_node_keeps_the_best_return_in_fresh_interpreters(tmp_path):
    """examples/best_return.py in the corridor graph, every node a fresh interpreter
    (CONDUIT_FORKSERVER=0): each imports the graph's imports: and resolves the example kind
    from its launch spec, not from what a fork server had imported."""
    run = LiveRun(str(tmp_path / "run"), CORRIDOR, env={"CONDUIT_FORKSERVER": "0"})
    try:
        assert run.finish(240) == 0, run.stderr
        returns = [m["eval/return"] for m in run.metrics() if "eval/return" in m]
        with open(os.path.join(run.run_dir, "best_return.json")) as f:
            best = json.load(f)
        assert best["best"] == max(returns) >= 1.0, (best, returns)
        assert best["source"] == "evaluator.0"
        summary = run.summary()
        assert summary["nodes"]["best_return.0"]["status"]["best"] == best["best"]
        assert summary["forkserver"] is None
    finally:
        run.kill()


CRASHING = """
name: optional
topics:
  numbers: {delivery: reliable, hwm: 100}
  doubled: {delivery: reliable, hwm: 100}
nodes:
  source: {kind: demo_source, config: {count: 0}}
  transformer: {kind: demo_transformer}
  sink: {kind: demo_sink, config: {expected: 0}}
  broken:
    kind: "tests.crashing_node:run"
    subscribes: [numbers]
    critical: false
    restart: {policy: always, max_failures: 2, window_s: 60, backoff_s: 0.05}
"""


@pytest.mark.timeout(180)
def test_a_critical_false_node_in_a_crash_loop_does_not_end_the_run(tmp_path):
    graph = tmp_path / "optional.yaml"
    graph.write_text(CRASHING)
    run = LiveRun(str(tmp_path / "run"), str(graph))
    try:
        # Answered when its watcher gives it up: it never says ready.
        with pytest.raises(CommandFailed, match=r"broken.0 stopped before it was ready "
                                                r"\(state failed\)"):
            run.command("wait_ready", node="broken", timeout=120)
        # The run goes on, and its publisher does not hold messages for the node it lost:
        # with the group of a node that never joins declared, the source would stop at hwm.
        sent = run.command("status")["nodes"]["source.0"]["status"]["sent"]
        run.wait_for_origin("doubled", sent + 20 * 100, timeout_s=60)
        status = run.command("status")["nodes"]
        assert {n: status[n]["state"] for n in status} == {
            "source.0": "running", "transformer.0": "running", "sink.0": "running",
            "broken.0": "failed"}
        assert run.cli("stop", run.run_dir).returncode == 0
        assert run.finish(120) == 0, run.stderr
    finally:
        run.kill()
    assert "warning: node broken.0 failed 2 times within 60s (last: RuntimeError: deliberate " \
           "failure in broken.0)" in run.stderr
    assert "critical: false: the run goes on without it" in run.stderr
    summary = run.summary()
    assert summary["failure"] is None
    assert summary["nodes"]["broken.0"]["state"] == "failed"
    with open(os.path.join(run.run_dir, "events.jsonl")) as f:
        events = [json.loads(line) for line in f]
    failed = [e for e in events if e["topic"] == "supervisor.broken.failed"]
    assert len(failed) == 1 and "failed 2 times" in failed[0]["detail"], events
    with open(os.path.join(run.run_dir, "supervisor.log")) as f:
        assert "critical: false: the run goes on without it" in f.read()


PLUGIN = '''
import os

async def run(config, node, ready):
    ready()
    with open(os.path.join(node.info.run_dir, "hello.txt"), "w") as f:
        f.write(config["word"])
    return {}
'''


@pytest.mark.timeout(120)
def test_node_processes_import_from_the_working_directory(tmp_path):
    """A user's module next to where they start run.py (not next to run.py) is importable by
    the supervisor and by a node started as a fresh interpreter."""
    (tmp_path / "myplugin.py").write_text(PLUGIN)
    (tmp_path / "g.yaml").write_text(textwrap.dedent("""\
        name: plugin
        imports: [myplugin]
        nodes:
          hello: {kind: "myplugin:run", config: {word: hi}}
        run: {stop_when: [hello]}
        """))
    result = subprocess.run([sys.executable, os.path.join(ROOT, "run.py"), "run", "g.yaml",
                             "--run-dir", "run", "--quiet"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=100, env={**os.environ, "CONDUIT_FORKSERVER": "0"})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "run" / "hello.txt").read_text() == "hi"
