"""The supervisor's own failures: killed with SIGKILL it leaves no process behind, and the run
can be resumed."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from tests.pipeline_harness import ROOT, LiveRun, alive, node_pids, wait_for_exit

DEMO = os.path.join(ROOT, "graphs", "demo_counter.yaml")
HEARTBEAT_TIMEOUT_S = 10


@pytest.mark.timeout(240)
@pytest.mark.parametrize("forkserver", ["1", "0"], ids=["forked", "fresh-interpreters"])
def test_kill_9_of_the_supervisor_leaves_no_process_and_resume_continues(tmp_path, forkserver):
    run_dir = str(tmp_path / "run")
    n = 100_000
    run = LiveRun(run_dir, DEMO, f"nodes.source.config.count={n}",
                  f"nodes.sink.config.expected={n}",
                  f"run.heartbeat_timeout_s={HEARTBEAT_TIMEOUT_S}",
                  env={"CONDUIT_FORKSERVER": forkserver})
    resumed = None
    try:
        run.wait_ready()
        status = run.command("status")
        pids = [info["pid"] for info in status["nodes"].values()]
        if status["forkserver"]:
            pids.append(status["forkserver"]["pid"])
        assert len(pids) == (4 if forkserver == "1" else 3) and all(alive(p) for p in pids)
        run.wait_for_origin("doubled", 1000)  # mid-stream

        killed_at = time.monotonic()
        os.kill(run.proc.pid, signal.SIGKILL)
        run.proc.wait()
        for pid in pids:
            assert wait_for_exit(pid, HEARTBEAT_TIMEOUT_S), f"pid {pid} outlived the supervisor"
        assert time.monotonic() - killed_at < HEARTBEAT_TIMEOUT_S
        assert not [pid for pid in node_pids(run_dir) if alive(pid)]

        resumed = LiveRun(run_dir, None, resume=True, env={"CONDUIT_FORKSERVER": forkserver})
        assert resumed.finish(180) == 0, resumed.stderr
        result = resumed.result()
        assert result["missing"] == 0 and result["unique"] == n, result
        assert not [pid for pid in node_pids(run_dir) if alive(pid)]
    finally:
        run.kill()
        if resumed is not None:
            resumed.kill()


def test_a_supervisor_task_that_dies_fails_the_run_in_one_line(tmp_path):
    from pipeline import graph as graphlib
    from pipeline.sockets import remove_socket_dir
    from pipeline.supervisor import Supervisor

    async def broken():
        raise RuntimeError("boom")

    async def go():
        sup = Supervisor(graphlib.load(DEMO), str(tmp_path))
        try:
            task = sup.guarded(broken(), "the heartbeat watchdog")
            after = asyncio.Event()  # done callbacks run in the order they were added
            task.add_done_callback(lambda _: after.set())
            await after.wait()
            return sup
        finally:
            remove_socket_dir(sup.sock_dir)

    sup = asyncio.run(go())
    assert sup.stop_event.is_set() and sup.ended_by == "failure"
    assert sup.failure.startswith("supervisor error in the heartbeat watchdog: "
                                  "RuntimeError: boom (traceback in ")


def test_the_crash_loop_window_forgets_old_failures():
    """A long run with rare failures never adds up to a crash loop: only failures within
    ``window_s`` count (mutation caught: old failures never forgotten, which turned a run with
    a failure every 20 minutes into a crash loop after five of them)."""
    from pipeline.watcher import recent_failures

    failures: list[float] = []
    for now in (0.0, 100.0, 200.0, 300.0, 400.0, 500.0):  # one failure per 100 s, window 60 s
        failures = recent_failures(failures, now, 60.0)
        assert failures == [now]
    for now in (510.0, 520.0, 530.0):  # a burst: every failure in the window counts
        failures = recent_failures(failures, now, 60.0)
    assert failures == [500.0, 510.0, 520.0, 530.0]
    assert recent_failures(failures, 580.0, 60.0) == [520.0, 530.0, 580.0]  # 60 s back: kept

