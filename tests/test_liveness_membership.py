"""Membership that heals (issue 37, item 1): real run.py, real processes, ipc and tcp.

The transformer of the demo graph is stopped (SIGSTOP) past the membership timeout while the
supervisor's heartbeat timeout is far away, as a network partition would do: the source evicts
it and gives its messages back to its group. On SIGCONT the transformer (a) is told it is no
longer a member and joins again holding what it had, and (b) as the publisher of ``doubled``,
does not evict the healthy sink although its own timers ran late while it was stopped. The run
must deliver every record exactly once and exit 0 (before, the sink waited forever at the
record it had reached, every node "running").

The membership timeout is shortened with ``membership.MEMBER_TIMEOUT_ENV`` (a test override that
wins over the graph, whose load check keeps heartbeat_timeout_s below it), so this runs in
seconds rather than the 60 s default.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from pipeline import membership
from tests.pipeline_harness import ROOT, LiveRun

GRAPH = os.path.join(ROOT, "graphs", "demo_counter.yaml")
MEMBER_TIMEOUT_S = 2.0


def _wait_for_line(path: str, text: str, timeout_s: float) -> bool:
    """Wait until ``text`` appears in the log file ``path`` (an event the node writes)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                if text in f.read():
                    return True
        except FileNotFoundError:
            pass
        time.sleep(0.1)  # a poll period: the condition is the log line
    return False


@pytest.mark.timeout(240)
@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_a_consumer_stopped_past_the_membership_timeout_rejoins_and_nothing_is_lost(
        tmp_path, transport):
    n = 60_000
    overrides = [f"nodes.source.config.count={n}", f"nodes.sink.config.expected={n}",
                 "run.heartbeat_timeout_s=50", "run.duration_s=200"]
    if transport == "tcp":
        overrides += ["run.transport=tcp", "run.insecure=true"]
    run = LiveRun(str(tmp_path / "run"), GRAPH, *overrides,
                  env={membership.MEMBER_TIMEOUT_ENV: str(MEMBER_TIMEOUT_S)})
    try:
        run.wait_ready()
        pid = run.command("status")["nodes"]["transformer.0"]["pid"]
        run.wait_for_origin("doubled", 5_000)
        os.kill(pid, signal.SIGSTOP)
        try:
            source_log = os.path.join(run.run_dir, "logs", "source.0.log")
            # The source evicts the silent transformer (and gives its messages back).
            assert _wait_for_line(source_log, "silent on numbers", 30), "no eviction"
        finally:
            os.kill(pid, signal.SIGCONT)
        assert run.finish(200) == 0, run.stderr
        result = run.result()
        assert result["missing"] == 0 and result["duplicates"] == 0, result
        assert result["unique"] == n and result["gaps"] == 0, result
        summary = run.summary()
        nodes = summary["nodes"]
        with open(os.path.join(run.run_dir, "events.jsonl")) as f:
            assert "supervisor.transformer.restarted" not in f.read()  # healed, not restarted
        with open(os.path.join(run.run_dir, "logs", "transformer.0.log")) as f:
            log = f.read()
        assert "joining again" in log, log[-2000:]
        # The transformer's own reaper ran late after SIGCONT: it kept the healthy sink.
        assert "silent on doubled" not in log, log[-2000:]
        assert nodes, summary
    finally:
        run.kill()


def test_an_evicted_member_gets_back_what_nobody_took_and_placeholders_for_the_rest():
    """The bookkeeping of a rejoin (pipeline.membership.Evictions) on the publisher's own
    records: late acknowledgements complete messages still in the backlog, a message another
    member took comes back as a placeholder (acknowledging it changes nothing), and credit
    counts what the member holds. Mutations this catches: reattaching a message another member
    took (handled twice, acknowledged twice), acknowledging late acks against the wrong end."""
    from pipeline import reliable

    records = [reliable._Msg(seq, [b"x" * seq], 1) for seq in range(1, 6)]
    group = reliable._Group("sink")
    old = reliable._Member(b"m1", "sink.0", credit=0, credit_bytes=0)
    old.inflight.extend(records[:4])
    evictions = membership.Evictions(reliable._PLACEHOLDER)
    evictions.remember(b"m1", group, old)
    group.backlog.extend(records)  # the drop put its four back in front of message 5
    assert evictions.late_acks(b"m1", 1)  # it handled message 1 while it was not a member
    assert records[0].remaining == 0 and list(group.backlog) == records[1:]
    group.backlog.remove(records[1])  # another member took message 2
    new = reliable._Member(b"m1", "sink.0", credit=10, credit_bytes=1000)
    evictions.reattach(group, new, holding=3)  # it still holds 2, 3 and 4
    assert list(new.inflight) == [reliable._PLACEHOLDER, records[2], records[3]]
    assert list(group.backlog) == [records[4]]
    assert new.credit == 7 and new.credit_bytes == 1000 - 3 - 4
    assert [r.remaining for r in records] == [0, 1, 1, 1, 1]
    # Forgotten (or never known): it holds what it holds, all placeholders, nothing taken.
    other = reliable._Member(b"m2", "sink.1", credit=4, credit_bytes=100)
    evictions.reattach(group, other, holding=2)
    assert list(other.inflight) == [reliable._PLACEHOLDER] * 2
    assert list(group.backlog) == [records[4]] and other.credit == 2
