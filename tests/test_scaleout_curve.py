"""tcp with CurveZMQ: the demo graph delivers every record exactly once, keys stay private,
clients without the run's keys are refused (and logged) without disturbing anything, and
garbage from an authenticated client changes nothing."""

from __future__ import annotations

import glob
import json
import os
import stat

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from pipeline import curve
from pipeline.graph import GraphError, load
from tests.pipeline_harness import ROOT, LiveRun

DEMO = os.path.join(ROOT, "graphs", "demo_counter.yaml")
FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
          zmq.EVENT_HANDSHAKE_FAILED_AUTH)


def _handshake(endpoint: str, keys: curve.Curve | None, garbage: list | None = None) -> int:
    """Connect a raw DEALER (CURVE client with ``keys``, or plain) and return the first
    handshake event its monitor reports: succeeded, or one of the failures."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 10_000)  # one attempt is enough to see the verdict
    if keys is not None:
        curve.make_client(sock, keys)
    mon = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | sum(FAILED))
    try:
        sock.connect(endpoint)
        assert mon.poll(20_000), f"no handshake verdict from {endpoint}"
        event = recv_monitor_message(mon)["event"]
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            for frames in garbage or []:
                sock.send_multipart(frames)
        return event
    finally:
        sock.disable_monitor()
        mon.close(linger=0)
        sock.close(linger=0 if not garbage else 1000)


def _read(path: str) -> str:
    with open(path, "rb") as f:
        return f.read().decode(errors="replace")


def _stranger() -> curve.Curve:
    """A well-formed CURVE client that knows the run's server key but holds a key of its own."""
    public, secret = zmq.curve_keypair()
    return curve.Curve(public, secret, b"", None, frozenset())


def test_tcp_without_curve_only_on_loopback_and_only_when_asked(tmp_path):
    with pytest.raises(GraphError, match="run.insecure"):
        load(DEMO, ["run.transport=tcp", "run.insecure=true", "run.interface=*"])
    with pytest.raises(GraphError, match="run.insecure"):
        load(DEMO, ["run.insecure=true"])  # ipc: nothing to be insecure about
    assert load(DEMO, ["run.transport=tcp", "run.insecure=true"]).run.insecure


@pytest.mark.timeout(180)
def test_demo_over_curve_exactly_once_with_private_keys(tmp_path):
    n = 20_000
    run = LiveRun(str(tmp_path / "run"), DEMO, f"nodes.source.config.count={n}",
                  f"nodes.sink.config.expected={n}", "run.transport=tcp")
    try:
        assert run.finish(150) == 0, run.stderr
        result = run.result()
        assert result["unique"] == n and result["duplicates"] == 0 and result["missing"] == 0
    finally:
        run.kill()
    keys = os.path.join(run.run_dir, "keys")
    assert stat.S_IMODE(os.stat(keys).st_mode) == 0o700
    files = glob.glob(os.path.join(keys, "*.key"))
    assert {os.path.basename(f) for f in files} >= {"run.key", "supervisor.key", "operator.key",
                                                    "node-source.key", "node-sink.key"}
    secrets = set()
    for path in files:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
        secrets.add(json.loads(_read(path))["secret"])
    launch = json.loads(_read(glob.glob(os.path.join(run.run_dir, "launch", "source.0~*"))[0]))
    assert launch["curve"]["server_public"] and launch["curve"]["authorized"]
    # No secret key in a launch spec, a log or the event stream.
    for path in glob.glob(os.path.join(run.run_dir, "**", "*"), recursive=True):
        if os.path.isfile(path) and not path.startswith(keys):
            text = _read(path)
            assert not any(s in text for s in secrets), path


@pytest.mark.timeout(240)
def test_strangers_are_refused_and_garbage_changes_nothing(tmp_path):
    run = LiveRun(str(tmp_path / "run"), DEMO, "nodes.source.config.count=0",
                  "nodes.sink.config.expected=0", "run.transport=tcp")
    try:
        run.wait_ready()
        status = run.command("status")
        control = json.loads(_read(os.path.join(run.run_dir, "endpoints.json")))["control"]
        publisher = status["topics"]["numbers"]["publishers"][0]
        tap = status["topics"]["doubled"]["taps"][0]
        assert all(ep.startswith("tcp://127.0.0.1:") for ep in (control, publisher, tap))
        stranger = _stranger()
        operator = curve.operator(run.run_dir)
        stranger = curve.Curve(stranger.public, stranger.secret, operator.server_public, None,
                               frozenset())
        for endpoint in (control, publisher, tap):
            assert _handshake(endpoint, stranger) in FAILED, endpoint  # wrong key
            assert _handshake(endpoint, None) in FAILED, endpoint  # no CURVE at all
        # An authenticated client sending garbage: dropped, nothing else happens.
        junk = [[b"\x00" * 7], [b"numbers", os.urandom(64)], [os.urandom(3000)] * 3, [b""]]
        for endpoint in (control, publisher):
            assert _handshake(endpoint, operator, junk) == zmq.EVENT_HANDSHAKE_SUCCEEDED
        seen = run.wait_for_message("doubled", lambda m: True, 60).origin
        run.wait_for_origin("doubled", seen + 1000, 120)  # records still flow
        assert run.command("status")["nodes"], "the control endpoint still answers"
        run.interrupt()
        assert run.finish(120) == 0, run.stderr
    finally:
        run.kill()
    result = run.result()
    assert result["duplicates"] == 0 and result["gaps"] == 0 and result["malformed"] == 0
    assert result["unique"] == result["received"] > 0
    events = [json.loads(line)["topic"] for line in
              _read(os.path.join(run.run_dir, "events.jsonl")).splitlines()]
    assert not any(t.endswith((".restarted", ".failed")) for t in events), events
    logs = "".join(map(_read, glob.glob(os.path.join(run.run_dir, "logs", "*")))) + \
        _read(os.path.join(run.run_dir, "supervisor.log"))
    assert "refused a CURVE client" in logs and "handshake failed" in logs


@pytest.mark.parametrize("overrides, key", [
    (["run.launcher=ray"], "run.launcher"),  # ray needs tcp
    (["run.launcher=slurm"], "run.launcher"),
    (["run.transport=tcp", "nodes.sink.placement={cpus: 1}"], "nodes.sink.placement"),
    (["run.transport=tcp", "nodes.sink.placement={num_cpus: -1}"], "nodes.sink.placement.num_cpus"),
])
def test_launcher_and_placement_mistakes_are_one_line(overrides, key):
    with pytest.raises(GraphError) as info:
        load(DEMO, overrides)
    assert key in str(info.value) and "\n" not in str(info.value)


def test_placement_is_read():
    graph = load(DEMO, ["run.transport=tcp", "run.launcher=ray",
                        "nodes.sink.placement={num_gpus: 1, resources: {box: 2}, "
                        "labels: {rack: b}}"])
    assert graph.nodes["sink"].placement == {"num_gpus": 1.0, "resources": {"box": 2.0},
                                             "labels": {"rack": "b"}}
    assert graph.run.ray_address == "auto" and graph.nodes["source"].placement == {}
