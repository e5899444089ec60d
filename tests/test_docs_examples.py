"""Every ``run.py`` command example in README.md, docs/*.md and ``run.py --help`` is one that
``run.py`` accepts: each parses as ``run.py`` parses it; the ones naming a graph file of the
repository pass ``check`` with their overrides; ``status`` and ``monitor`` examples run for
real on a finished demo run; every ``--set`` example of the help texts is accepted by a real
graph. The one-machine Ray recipe of docs/distributed.md runs as written (skipped without the
``ray`` extra)."""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

import nodes  # noqa: F401 - registers the node kinds and run.py's play and export
from pipeline import cli
from tests.pipeline_harness import ROOT

DOCS = ["README.md", *sorted(os.path.relpath(p, ROOT)
                             for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
# Placeholders where a number is wanted (scale's N, --seed N, --interval S, --count N).
NUMBERS = {"N": "2", "S": "2"}
RUN_DIR_PLACEHOLDER = re.compile(r"^(RUN_DIR|runs/[\w-]+/<time>|/shared/runs/\w+)$")


def _argv(command: str) -> list[str] | None:
    """The arguments of one example (the text from ``run.py`` on), as a shell would split
    them, with ``[optional]`` brackets and ``...`` dropped; None for a mention that is not a
    command (``run.py stop`` in a sentence, ``run.py run ...``) or for the internal ``node``."""
    command = re.split(r"\s+#|\s*(?:&&|\|\||;|\|)\s*|\s{2,}", command)[0]
    try:
        words = shlex.split(command)[1:]
    except ValueError:
        return None
    if any(w == "..." or (w.endswith("...") and not w.endswith("...]")) for w in words) and \
            not any(w.startswith("[") for w in words):
        return None
    words = [w.strip("[]") for w in words]
    words = [NUMBERS.get(w, w) for w in words if w and w not in ("...", "|")]
    if not words or words[0] == "node":
        return None
    # A command named with options only (`run.py swap --set`) is a mention of the option.
    if not any(not w.startswith("-") for w in words[1:]) and \
            (words[0] in cli.COMMANDS or words[0] in cli._EXTRA):
        return None
    return words


def _doc_examples() -> list[tuple[str, list[str]]]:
    """(where, argv) of every run.py example in code of the docs: each line of a fenced
    block and each inline code span that holds ``run.py``."""
    found = []
    for doc in DOCS:
        with open(os.path.join(ROOT, doc)) as f:
            text = f.read()
        fenced = False
        for number, line in enumerate(text.splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            pieces = [line] if fenced else re.findall(r"`([^`]*)`", line)
            for piece in pieces:
                at = piece.find("run.py")
                if at < 0:
                    continue
                argv = _argv(piece[at:])
                if argv is not None:
                    found.append((f"{doc}:{number}", argv))
    return found


def _help_texts() -> dict[str, str]:
    parser = cli._parser()
    texts = {"run.py --help": parser.format_help()}
    for name, sub in parser._subparsers._group_actions[0].choices.items():
        texts[f"run.py {name} --help"] = sub.format_help()
    return texts


def _help_examples() -> list[tuple[str, list[str]]]:
    found = []
    for where, text in _help_texts().items():
        for line in text.splitlines():
            if line.strip().startswith("run.py "):
                argv = _argv(line.strip())
                if argv is not None:
                    found.append((where, argv))
    return found


EXAMPLES = _doc_examples() + _help_examples()


def _parse(argv: list[str]):
    """``run.py``'s reading of ``argv``; None for a request for help (argparse prints it and
    exits 0), which is a valid command too."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return cli.parse_args(argv)
    except SystemExit as exc:
        assert exc.code == 0, argv
        return None


def test_the_examples_were_found():
    where = {w.split(":")[0] for w, _ in EXAMPLES}
    assert {"README.md", "docs/operations.md", "docs/distributed.md", "run.py --help"} <= where
    commands = {args.command for _, argv in EXAMPLES if (args := _parse(argv))}
    assert {"run", "check", "status", "monitor", "stop", "swap", "scale", "plot"} <= commands


@pytest.mark.parametrize("where,argv", EXAMPLES, ids=[f"{w} {' '.join(a)}" for w, a in EXAMPLES])
def test_every_example_parses(where, argv):
    args = _parse(argv)
    assert args is None or args.command is not None


def test_run_py_help_lists_every_command():
    text = _help_texts()["run.py --help"]
    for command in [c for c in cli.COMMANDS if c != "node"] + list(cli._EXTRA):
        assert re.search(rf"^\s+{command}\s", text, re.M), command


def _graph_examples() -> list[tuple[str, list[str]]]:
    out = []
    for where, argv in EXAMPLES:
        args = _parse(argv)
        if args is not None and args.command in ("run", "check") and getattr(args, "graph", None) and \
                os.path.exists(os.path.join(ROOT, args.graph)):
            out.append((where, ["check", args.graph,
                                *(a for item in args.set for a in ("--set", item))]))
    return out


GRAPH_EXAMPLES = _graph_examples()


@pytest.mark.parametrize("where,argv", GRAPH_EXAMPLES,
                         ids=[f"{w} {' '.join(a)}" for w, a in GRAPH_EXAMPLES])
def test_examples_that_name_a_graph_pass_its_check(where, argv, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    code = cli.main(argv)
    captured = capsys.readouterr()
    if code != 0 and "bench/datasets.py" in captured.err:
        pytest.skip(captured.err.strip())  # a graph whose dataset is made by a bench, not shipped
    assert code == 0, captured.err
    assert captured.out.strip() == "ok"


def _set_examples() -> list[str]:
    pattern = re.compile(r"\b(?:agent|nodes|run|topics)\.[\w.]+=[\w.\-]+")
    return sorted({m for text in _help_texts().values() for m in pattern.findall(text)})


@pytest.mark.parametrize("item", _set_examples())
def test_every_set_example_of_the_help_is_accepted(item, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert cli.main(["check", "graphs/dqn_cartpole.yaml", "--set", item]) == 0, \
        capsys.readouterr().err


def test_the_help_has_set_examples():
    assert {"agent.algorithm.learning_rate=0.001",
            "nodes.learner.config.mini_batch_size=128"} <= set(_set_examples())


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A short demo run that ended: what status and monitor examples are run against."""
    run_dir = str(tmp_path_factory.mktemp("docs") / "run")
    result = subprocess.run([sys.executable, "run.py", "graphs/demo_counter.yaml", "--run-dir",
                             run_dir, "--quiet", "--set", "nodes.source.config.count=5000",
                             "--set", "nodes.sink.config.expected=5000"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return run_dir


LOOKS = [(w, a) for w, a in EXAMPLES if a[0] in ("status", "monitor") and _parse(a)]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("where,argv", LOOKS, ids=[f"{w} {' '.join(a)}" for w, a in LOOKS])
def test_status_and_monitor_examples_run_on_a_finished_run(where, argv, finished_run, capsys):
    argv = [finished_run if RUN_DIR_PLACEHOLDER.match(a) else a for a in argv]
    assert finished_run in argv, argv
    assert cli.main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    if "--json" in argv:
        assert json.loads(out)["ended"]["reason"] == "stop condition"
    else:
        assert out.startswith("run ended: stop condition (sink.0 finished)\n"), out


# --- docs/distributed.md: the one-machine Ray recipe ---------------------------------------------

MACHINE_CPUS = 2  # the smallest machine the recipe is for: Ray's CPUs where it names none


def _ray_recipe() -> tuple[dict, list[str]]:
    """The `ray start --head` and `run.py` lines of docs/distributed.md's one-machine recipe:
    the head's Ray arguments, and run.py's."""
    with open(os.path.join(ROOT, "docs", "distributed.md")) as f:
        text = f.read()
    block = text[text.index("To try it on one machine"):]
    block = block[block.index("```sh") + 5:block.index("```", block.index("```sh") + 5)]
    start = next(line for line in block.splitlines() if line.startswith("ray start --head"))
    head = {"num_cpus": MACHINE_CPUS, "resources": {}}
    for word in shlex.split(start):
        if word.startswith("--num-cpus="):
            head["num_cpus"] = int(word.split("=", 1)[1])
        elif word.startswith("--resources="):
            head["resources"] = json.loads(word.split("=", 1)[1])
    command = next(line for line in block.splitlines() if "run.py" in line)
    return head, _argv(command[command.index("run.py"):])


def test_the_ray_recipe_is_read_from_the_docs():
    head, argv = _ray_recipe()
    assert head["resources"] == {"replay_box": 1, "learner_box": 1, "runner_box": 4}
    assert argv[0] == "graphs/dqn_cartpole_cluster.yaml"
    assert "run.interface=127.0.0.1" in argv


@pytest.mark.timeout(400)
def test_the_one_machine_ray_recipe_runs_on_two_cores(tmp_path):
    # Ray would resolve a loopback cluster to the machine's address unless told the cluster is
    # on one machine (see test_scaleout_ray); before Ray is imported, inherited by run.py.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    head, argv = _ray_recipe()
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={
        "node_ip_address": "127.0.0.1", **head})
    try:
        # The recipe as written, on this cluster, with a budget that ends it within a minute.
        command = [sys.executable, "run.py", *argv, "--run-dir", str(tmp_path / "run"),
                   "--quiet", "--set", f"run.ray_address={cluster.address}",
                   "--set", "run.ready_timeout_s=120",
                   "--set", "nodes.learner.config.num_env_steps=1500",
                   "--set", "nodes.evaluator.config.eval_interval=100000"]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                                timeout=360)
    finally:
        cluster.shutdown()
    assert result.returncode == 0, result.stderr[-3000:]
    assert "run ended: budget reached (learner.0 finished 1,500 env steps)" in result.stderr, \
        result.stderr[-3000:]


def test_no_install_hint_names_the_unrelated_conduit_package():
    """`conduit` on the package index is another project: an extra installs from the checkout,
    `pip install -e '.[extra]'`. The docs, the help texts and the code's errors say so."""
    texts = dict(_help_texts())
    sources = [os.path.join(package, f) for package in ("pipeline", "nodes", "algorithms",
                                                        "storage", "algorithms/envs")
               for f in os.listdir(os.path.join(ROOT, package)) if f.endswith(".py")]
    for doc in [*DOCS, *sources]:  # the errors that name a missing extra, too
        with open(os.path.join(ROOT, doc)) as f:
            texts[doc] = f.read()
    offenders = [f"{where}: {line.strip()}" for where, text in texts.items()
                 for line in text.splitlines() if "conduit[" in line]
    assert not offenders, "\n".join(offenders)
