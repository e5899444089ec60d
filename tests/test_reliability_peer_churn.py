"""A subscriber survives its publishers being killed -9 and replaced (issue 11: the unroller
aborted with libzmq's ``Assertion failed: !_more (src/fq.cpp:80)`` after its learner, the
``params`` publisher, was killed). See tests/broadcast_churn.py for the scenario; it runs as a
process of its own because the failure is an abort."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.pipeline_harness import ROOT

ROUNDS = 12


def test_latest_subscriber_survives_publishers_killed_mid_stream(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tests.broadcast_churn", "subscribe",
                           str(tmp_path), str(ROUNDS)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert "Assertion failed" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r"ok (\d+) rounds, (\d+) with a message waiting", proc.stdout)
    assert found and int(found[1]) >= ROUNDS, proc.stdout
    # The hazard was there: a message half taken by libzmq when the dead peer's pipe was cut.
    assert int(found[2]) >= 1, proc.stdout
