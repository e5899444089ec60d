"""Local security of a run: private socket directory, a per-run secret on control requests and
in every node's environment; and the tcp transport on loopback."""

from __future__ import annotations

import os
import stat

import pytest
import zmq

from pipeline import cli, codec
from pipeline.messages import ControlRequest
from pipeline.sockets import check_private_dir, private_socket_dir, remove_socket_dir
from tests.pipeline_harness import ROOT, LiveRun, idle_demo_graph

DEMO = os.path.join(ROOT, "graphs", "demo_counter.yaml")
IDLE = ("nodes.source.config.count=0", "nodes.sink.config.expected=0")


def _request(endpoint: str, args: dict):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send_multipart(codec.encode(ControlRequest("stop", args), "intruder"))
        assert sock.poll(10_000), "no reply"
        return codec.decode(sock.recv_multipart()).message
    finally:
        sock.close(linger=0)


PROBED = idle_demo_graph("probed", """
  probe:
    kind: "tests.pipeline_harness:secret_probe"
""")


def test_socket_dirs_are_fresh_private_and_refused_when_not_ours(tmp_path):
    first, second = private_socket_dir(), private_socket_dir()
    try:
        assert first != second
        for path in (first, second):
            assert stat.S_IMODE(os.lstat(path).st_mode) == 0o700
        os.chmod(first, 0o755)
        with pytest.raises(PermissionError, match="not a private directory"):
            check_private_dir(first)
        remove_socket_dir(first)  # not removed either: it is not (any more) a private one
        assert os.path.isdir(first)
        os.chmod(first, 0o700)
        link = tmp_path / "link"
        link.symlink_to(second)
        with pytest.raises(PermissionError):
            check_private_dir(str(link))
        if os.geteuid() == 0:  # as root, a directory of another user can be made
            other = tmp_path / "other"
            other.mkdir(mode=0o700)
            os.chown(other, 65534, 65534)
            with pytest.raises(PermissionError):
                check_private_dir(str(other))
    finally:
        remove_socket_dir(first)
        remove_socket_dir(second)
    assert not os.path.exists(first) and not os.path.exists(second)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("forkserver", ["1", "0"], ids=["forked", "fresh-interpreters"])
def test_control_requests_need_the_run_secret_and_sockets_are_private(tmp_path, forkserver):
    graph = tmp_path / "graph.yaml"
    graph.write_text(PROBED)
    run = LiveRun(str(tmp_path / "run"), str(graph), env={"CONDUIT_FORKSERVER": forkserver})
    try:
        run.wait_ready()
        secret_path = os.path.join(run.run_dir, "secret")
        assert stat.S_IMODE(os.stat(secret_path).st_mode) == 0o600
        secret = cli.read_secret(run.run_dir)
        assert len(secret) >= 32
        status = run.command("status")
        control = status["events"].replace("/events", "/control")
        sock_dir = os.path.dirname(control[len("ipc://"):])
        assert stat.S_IMODE(os.lstat(sock_dir).st_mode) == 0o700
        with open(os.path.join(run.run_dir, "probe.0")) as f:
            assert f.read() == secret  # what every node process sees in CONDUIT_RUN_SECRET
        for args in ({}, {"_secret": "0" * 64}, {"_secret": 7}):
            reply = _request(control, args)
            assert not reply.ok and reply.result["code"] == "unauthorized", reply
        assert run.command("status")["nodes"]["sink.0"]["state"] == "running"  # not stopped
        assert run.cli("stop", run.run_dir).returncode == 0
        assert run.finish(60) == 0, run.stderr
        assert not os.path.exists(sock_dir)  # removed at exit
    finally:
        run.kill()


@pytest.mark.timeout(180)
def test_a_stale_socket_dir_of_a_killed_run_is_removed_on_resume(tmp_path):
    run = LiveRun(str(tmp_path / "run"), DEMO, *IDLE)
    resumed = None
    try:
        run.wait_ready()
        control = run.command("status")["events"].replace("/events", "/control")
        old_dir = os.path.dirname(control[len("ipc://"):])
        run.proc.kill()
        run.proc.wait()
        assert os.path.isdir(old_dir)  # nobody could remove it
        resumed = LiveRun(run.run_dir, None, resume=True)
        resumed.wait_ready()
        assert not os.path.exists(old_dir)
        resumed.interrupt()
        assert resumed.finish(60) == 0, resumed.stderr
    finally:
        if resumed is not None:
            resumed.kill()
        run.kill()


@pytest.mark.timeout(180)
def test_the_tcp_transport_runs_on_loopback(tmp_path):
    n = 20_000
    run = LiveRun(str(tmp_path / "run"), DEMO, f"nodes.source.config.count={n}",
                  f"nodes.sink.config.expected={n}", "run.transport=tcp")
    try:
        run.wait_ready()
        taps = run.command("status")["topics"]["doubled"]["taps"]
        assert taps and all(ep.startswith("tcp://127.0.0.1:") and not ep.endswith("*.tap")
                            for ep in taps), taps
        assert run.finish(150) == 0, run.stderr
        result = run.result()
        assert result["missing"] == 0 and result["unique"] == n and result["duplicates"] == 0
    finally:
        run.kill()
