"""Helpers for multi-process tests: start ``run.py`` for real and talk to it like a user.

Nothing here sleeps to synchronize: the supervisor prints its control endpoint when it can take
commands, ``wait_ready`` is answered by the supervisor when nodes are ready, and progress inside
a run is observed on a topic's monitor tap.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time

import zmq

from pipeline import batch_codec, codec, curve
from pipeline.cli import control
from pipeline.sockets import remove_socket_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class LiveRun:
    def __init__(self, run_dir: str, graph: str | None, *overrides: str, resume: bool = False,
                 env: dict | None = None, seed: int = 0):
        self.run_dir = run_dir
        args = [sys.executable, os.path.join(ROOT, "run.py"), "run", "--quiet"]
        args += ["--resume", run_dir] if resume else [graph, "--run-dir", run_dir]
        args += ["--seed", str(seed)] if seed else []
        for item in overrides:
            args += ["--set", item]
        self.proc = subprocess.Popen(args, cwd=ROOT, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self.stderr_lines: list[str] = []
        for line in self.proc.stderr:  # blocks until the supervisor is listening
            self.stderr_lines.append(line)
            if line.startswith("control: "):
                break
        else:
            raise RuntimeError("run.py exited before it was ready:\n" + "".join(self.stderr_lines))

    def command(self, name: str, **kwargs) -> dict:
        return control(self.run_dir, name, **kwargs)

    def wait_ready(self, node: str | None = None) -> None:
        self.command("wait_ready", node=node, timeout=120)

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, os.path.join(ROOT, "run.py"), *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)

    def wait_for_origin(self, topic: str, origin: int, timeout_s: float = 120) -> int:
        """Watch ``topic`` through its tap until a record with ``origin`` >= the given one."""
        return self.wait_for_message(topic, lambda m: m.origin >= origin, timeout_s).origin

    def wait_for_message(self, topic: str, predicate, timeout_s: float = 300):
        """Watch ``topic`` through its tap until a message satisfies ``predicate``."""
        taps = self.command("status")["topics"][topic]["taps"]
        sock = zmq.Context.instance().socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        keys = curve.operator(self.run_dir)
        if keys is not None:  # tcp with CURVE: connect as the run's operator
            curve.make_client(sock, keys)
        try:
            for ep in taps:
                sock.connect(ep)
            sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
            deadline = time.monotonic() + timeout_s
            while True:
                # Waits in slices so that a run which ended is reported as such (with its exit
                # code and last words) instead of as a silent topic.
                if not sock.poll(1000):
                    if self.proc.poll() is not None:
                        raise RuntimeError(f"run.py exited with {self.proc.returncode} while "
                                           f"waiting on {topic}: {self.stderr_tail()}")
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"no message on {topic} for {timeout_s}s")
                    continue
                envelope = codec.decode(sock.recv_multipart()[1:])
                for item in batch_codec.messages_of(envelope):  # a batch as its messages
                    if predicate(item.message):
                        return item.message
        finally:
            sock.close(linger=0)

    def finish(self, timeout_s: float = 300) -> int:
        try:
            _, rest = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self.stderr_lines.append(rest)
        return self.proc.returncode

    def stderr_tail(self, lines: int = 8) -> str:
        """The last lines run.py wrote to stderr (read to the end once it has exited)."""
        if self.proc.poll() is not None and self.proc.stderr:
            self.stderr_lines.append(self.proc.stderr.read())
        return " | ".join("".join(self.stderr_lines).strip().splitlines()[-lines:])

    def ended_because(self, timeout_s: float = 120) -> str:
        """For a failure message when a run stopped when it should not have: wait for run.py
        to exit and return its last words (the supervisor prints why the run ended)."""
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return f"run.py still running after {timeout_s:.0f}s"
        return f"run.py exited {self.proc.returncode}: {self.stderr_tail(12)}"

    @property
    def stderr(self) -> str:
        return "".join(self.stderr_lines)

    def interrupt(self) -> None:
        self.proc.send_signal(signal.SIGINT)

    def interrupt_after_learning(self, env_steps: int) -> dict:
        """Stop the run as a user would with ctrl-c once the learner reported ``env_steps``;
        asserts it ended cleanly and returns its nodes' summary. The learner reports every
        ``metrics_interval_s``: a graph whose runners can finish the budget within one period
        must shorten it, or the stop comes after the end on a fast machine."""
        self.wait_ready()
        self.wait_for_message("metrics", lambda m: m.env_steps >= env_steps and
                              m.source.startswith("learner"))
        self.interrupt()
        assert self.finish(300) == 0, self.stderr
        return self.summary()["nodes"]

    def kill(self) -> None:
        """Last resort cleanup: kill the supervisor and every node it started."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in node_pids(self.run_dir):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        # A supervisor killed with SIGKILL could not remove its socket directory.
        with contextlib.suppress(OSError, ValueError, KeyError):
            with open(os.path.join(self.run_dir, "endpoints.json")) as f:
                control = json.load(f)["control"]
            if control.startswith("ipc://"):
                remove_socket_dir(os.path.dirname(control[len("ipc://"):]))

    def metrics(self) -> list[dict]:
        with open(os.path.join(self.run_dir, "metrics.jsonl")) as f:
            return [json.loads(line) for line in f]

    def summary(self) -> dict:
        return self.result("summary.json")

    def result(self, name: str = "sink_result.json") -> dict:
        with open(os.path.join(self.run_dir, name)) as f:
            return json.load(f)


def node_pids(run_dir: str) -> list[int]:
    """Every node pid the supervisor ever started in this run (from events.jsonl)."""
    pids = []
    path = os.path.join(run_dir, "events.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                event = json.loads(line)
                if event["topic"].endswith(".started"):
                    pids.append(int(event["detail"].split()[1]))
    return pids


def wait_for_exit(pid: int, timeout_s: float = 60) -> bool:
    """Block until a process that is not our child has exited (its pidfd turns readable);
    False if it is still running after ``timeout_s``."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)


def alive(pid: int) -> bool:
    """Running (a zombie waiting for init to reap it is not: it has exited)."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


async def idle_node(config, node, ready):
    """A node kind for tests (``tests.pipeline_harness:idle_node``): never says ready, only
    waits to be stopped; ``wait_ready`` on it can only time out."""
    await node.stopping.wait()
    return {}


async def stop_probe(config, node, ready):
    """A node kind for tests (``tests.pipeline_harness:stop_probe``): until stopped; then
    writes ``RUN_DIR/stopped.<pid>`` with the reason its Stop message gave (empty if none
    came), and ``RUN_DIR/signalled.<pid>`` if a SIGTERM reached it."""
    import asyncio
    import signal

    pid = os.getpid()

    def signalled():
        with open(os.path.join(node.info.run_dir, f"signalled.{pid}"), "w") as f:
            f.write("SIGTERM")
        node.stopping.set()

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, signalled)
    ready()
    await node.stopping.wait()
    with open(os.path.join(node.info.run_dir, f"stopped.{pid}"), "w") as f:
        f.write(node.stop_reason or "")
    return {}


async def secret_probe(config, node, ready):
    """A node kind for tests (``tests.pipeline_harness:secret_probe``): writes the run secret
    it sees in its environment to ``RUN_DIR/probe.<replica>`` before it says ready."""
    with open(os.path.join(node.info.run_dir, f"probe.{node.info.replica}"), "w") as f:
        f.write(os.environ.get("CONDUIT_RUN_SECRET", ""))
    ready()
    await node.stopping.wait()
    return {}


async def gc_probe(config, node, ready):
    """A node kind for tests (``tests.pipeline_harness:gc_probe``): after ``ready()``, until
    stopped; its summary is its garbage collector's thresholds and frozen-object count."""
    import gc

    ready()
    await node.stopping.wait()
    return {"gc_threshold": list(gc.get_threshold()), "gc_frozen": gc.get_freeze_count()}


IDLE_DEMO = """
name: {name}
topics:
  numbers: {{delivery: reliable}}
  doubled: {{delivery: reliable}}
nodes:
  source:
    kind: demo_source
    config: {{count: 0}}
    publishes: [numbers]
  transformer:
    kind: demo_transformer
    subscribes: [numbers]
    publishes: [doubled]
  sink:
    kind: demo_sink
    config: {{expected: 0}}
    subscribes: [doubled]
"""


def idle_demo_graph(name: str, extra: str) -> str:
    """The demo graph with nothing to send (it runs until stopped), plus ``extra`` YAML lines
    (more nodes, then optionally a ``run:`` block): for tests of the control plane."""
    return IDLE_DEMO.format(name=name) + extra.lstrip("\n")


def probe_run(tmp_path, probe: str) -> LiveRun:
    """The idle demo graph plus one node ``probe`` of kind ``tests.pipeline_harness:<probe>``,
    started (``tmp_path/run``)."""
    graph = tmp_path / f"{probe}.yaml"
    graph.write_text(idle_demo_graph(probe, f"""
  probe:
    kind: "tests.pipeline_harness:{probe}"
"""))
    return LiveRun(str(tmp_path / "run"), str(graph))
