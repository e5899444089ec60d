"""A thawed run does not restart everything (issue 37, item 5).

Every process of a run (supervisor, fork server, nodes) is stopped with SIGSTOP, as a paused
container or a suspended laptop stops them, for longer than the heartbeat timeout and the
membership timeout, then continued. Nobody missed a beat while nobody ran: the supervisor
judges heartbeats against its own wake-up and each publisher its members' silence against
its own, so the run goes on with no restart and no eviction, and delivers every record once.
(Before, every node was killed at once on thaw: their last heartbeats looked 40 s old.)
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from pipeline import membership
from tests.pipeline_harness import ROOT, LiveRun

GRAPH = os.path.join(ROOT, "graphs", "demo_counter.yaml")
FROZEN_S = 6.0  # past the heartbeat timeout (3 s) and the membership timeout (4 s)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, parents before children (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(0), []):
            out.append(child)
            todo.append(child)
    return out


@pytest.mark.timeout(180)
def test_a_run_frozen_as_a_whole_and_thawed_restarts_nothing(tmp_path):
    n = 60_000
    run = LiveRun(str(tmp_path / "run"), GRAPH, f"nodes.source.config.count={n}",
                  f"nodes.sink.config.expected={n}", "run.heartbeat_s=0.5",
                  "run.heartbeat_timeout_s=3", "run.duration_s=150",
                  env={membership.MEMBER_TIMEOUT_ENV: "4"})
    try:
        run.wait_ready()
        run.wait_for_origin("doubled", 5_000)
        processes = [run.proc.pid, *_descendants(run.proc.pid)]
        assert len(processes) >= 4, processes  # supervisor, fork server, three nodes
        for pid in processes:  # the supervisor first: it must not see the others stop
            os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(FROZEN_S)  # the freeze itself is what is tested, not a synchronization
        finally:
            for pid in processes:  # the supervisor wakes first: the harder order for it
                os.kill(pid, signal.SIGCONT)
        assert run.finish(150) == 0, run.stderr
        with open(os.path.join(run.run_dir, "events.jsonl")) as f:
            events = f.read()
        assert ".restarted" not in events and "no heartbeat" not in events, events[-3000:]
        result = run.result()
        assert result["missing"] == 0 and result["duplicates"] == 0, result
        assert result["unique"] == n, result
        for name in ("source", "transformer"):
            with open(os.path.join(run.run_dir, "logs", f"{name}.0.log")) as f:
                assert "dropping it" not in f.read(), name  # no member evicted on thaw
    finally:
        run.kill()
