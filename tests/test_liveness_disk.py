"""Disk trouble degrades (issue 37, item 4): a full or failing disk must not kill the run.

- A ledger whose writes are refused holds its records (bounded, counted), retries with
  backoff, reports once per episode, and a consumer stops acknowledging meanwhile (its
  ``stored`` ledger is a gate of ``Bus.hold_acks``), so nothing is lost and nothing exits.
- Log files drop lines with one warning per episode (no ``--- Logging error ---`` tracebacks).
- A launch file the run directory refuses goes to the run's private socket directory.
- A checkpoint write that fails with any exception leaves no partial directory, and the
  partial directories an earlier incarnation left are removed at start.
- End to end, as root: the run directory on a small tmpfs filled mid-run while a node is
  killed and restarted; the run ends with exit 0 and every record once.

Faults are injected into the one writer each part uses (``Ledger.write``), or come from
``/dev/full`` (every write ENOSPC) and a real full tmpfs.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import signal
import subprocess
import time

import numpy as np
import pytest
import zmq.asyncio

from nodes import checkpointer
from pipeline import diskio, ledger
from pipeline.bus import Bus, TopicSpec
from pipeline.ledger import RECORD, Ledger
from pipeline.messages import Record
from pipeline.node import NodeContext, NodeInfo
from pipeline.sockets import SocketFactory
from tests.pipeline_harness import ROOT, LiveRun


class _Disk:
    """A writer that refuses (ENOSPC) while ``full``; counts the refusals."""

    def __init__(self):
        self.full, self.refused = True, 0

    def __call__(self, fd, data):
        if self.full:
            self.refused += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.write(fd, data)


def test_a_ledger_holds_what_the_disk_refuses_and_writes_it_in_order_later(tmp_path):
    book = Ledger(str(tmp_path), "experience", "replay.0", "stored")
    troubles = []
    book.on_trouble = troubles.append
    book.record("a.0~1", 1, 5)
    disk = book.write = _Disk()
    for seq in range(2, 6):
        book.record("b.0~1" if seq == 3 else "a.0~1", seq, 1)  # a new sender's name too
    assert book.seq == 5 and book.completed_through == 1  # held, not lost, no exception
    assert len(troubles) == 1 and "not written (No space left on device)" in troubles[0]
    assert not book.flush() and book.completed_through == 1  # still full
    disk.full = False
    assert book.flush() and book.completed_through == 5 and troubles[-1] is None
    book.close()
    again = Ledger(str(tmp_path), "experience", "replay.0", "stored")
    assert again.senders == ["a.0~1", "b.0~1"]
    assert again.last_seq == {"a.0~1": 5, "b.0~1": 3} and again.items == 9
    records = np.fromfile(again.path, RECORD)
    assert records["seq"].tolist() == [1, 2, 3, 4, 5]
    again.close()


def test_a_record_the_disk_takes_only_in_part_is_cut_off_and_written_whole_later(tmp_path):
    """A disk that fills under a write takes part of a record (seen on a full tmpfs): the
    torn bytes go, so the record written later is not read behind them, out of step."""
    book = Ledger(str(tmp_path), "t", "r.0", "stored")
    book.record("a~1", 1, 1)
    full = [True]

    def torn(fd, data):
        return os.write(fd, data[:5]) if full[0] else os.write(fd, data)

    book.write = torn
    book.record("a~1", 2, 1)
    assert os.path.getsize(book.path) == RECORD.itemsize and book.completed_through == 1
    full[0] = False
    assert book.flush()
    book.close()
    assert np.fromfile(book.path, RECORD)["seq"].tolist() == [1, 2]


def test_a_ledger_beyond_its_bound_counts_what_it_gave_up(tmp_path, monkeypatch):
    monkeypatch.setattr(ledger, "PENDING_MAX", 3)
    book = Ledger(str(tmp_path), "t", "x.0", "sent")
    book.record("x.0~1", 1, 1)  # the sender's name is on disk
    book.write = _Disk()
    for seq in range(2, 7):
        book.record("x.0~1", seq, 1)
    assert book.given_up == 2 and len(book._pending) == 3
    book.write = os.write
    book.close()


async def _consumer_holds_acks(tmp_path) -> None:
    topics = {"numbers": TopicSpec("reliable", 100)}
    ctx = zmq.asyncio.Context()
    pub_bus = Bus("source.0~0", "source", topics, {"numbers": f"ipc://{tmp_path}/numbers"},
                  {"numbers": ["sink"]}, sockets=SocketFactory(ctx))
    sub_bus = Bus("sink.0~0", "sink", topics, {}, {}, sockets=SocketFactory(ctx))
    node = NodeContext(sub_bus, NodeInfo("sink", "sink.0", 0, str(tmp_path), "cpu", None))
    try:
        pub = pub_bus.publisher("numbers")
        sub_bus.set_peers({"numbers": [pub.endpoint]}, {})
        sub = sub_bus.subscriber("numbers")
        book = node.ledger("numbers", "stored")
        disk = book.write = _Disk()
        for i in range(1, 11):
            await pub.send(Record(i, None))
        for _ in range(10):
            envelope = await asyncio.wait_for(sub.recv(), 5)
            book.record(envelope.sender, envelope.seq, 1)
        recv_more = asyncio.ensure_future(sub.recv())  # asks past the tenth: acknowledges it
        while disk.refused < 3:  # the ledger retried (0.1 s, then 0.2 s) and was refused
            await asyncio.sleep(0.01)  # polls the condition, a counter of refused writes
        assert pub.completed_through == 0, "acknowledged what its ledger did not hold"
        assert node.status["warning"].startswith("ledger ")
        disk.full = False
        assert await pub.flush(timeout=10), "the acknowledgements never came"
        assert pub.completed_through == 10 and "warning" not in node.status
        recv_more.cancel()
    finally:
        node.close_ledgers(acknowledged=False)
        pub_bus.close()
        sub_bus.close()
        ctx.term()


@pytest.mark.timeout(60)
def test_a_consumer_whose_ledger_cannot_be_written_stops_acknowledging(tmp_path):
    asyncio.run(asyncio.wait_for(_consumer_holds_acks(tmp_path), 30))


def test_a_log_file_on_a_full_disk_drops_lines_with_one_warning(capsys):
    handler = diskio.QuietFileHandler("/dev/full")
    log = logging.getLogger("test_liveness_disk.full")
    log.addHandler(handler)
    log.propagate = False
    try:
        for i in range(5):
            log.warning("line %d", i)
    finally:
        log.removeHandler(handler)
        handler.close()
    err = capsys.readouterr().err
    assert handler.dropped >= 5  # each line, and the buffer at close
    assert err.count("cannot write /dev/full") == 1, err
    assert "Logging error" not in err and "Traceback" not in err, err


def test_a_launch_file_a_full_disk_refuses_goes_to_the_private_directory(tmp_path):
    class Launch:
        def dump(self, path):
            with open(path, "w") as f:
                f.write("{}")
                f.flush()  # on a full disk: ENOSPC

    fallback = tmp_path / "private"
    os.symlink("/dev/full", tmp_path / "x~1.json")  # the run directory's file, on a full disk
    path = diskio.dump_launch(Launch(), str(tmp_path / "x~1.json"), str(fallback))
    assert path == str(fallback / "x~1.json") and os.path.exists(path)
    assert os.stat(fallback).st_mode & 0o777 == 0o700
    # A broken run directory is not disk trouble: the start fails with its reason.
    with pytest.raises(NotADirectoryError):
        diskio.dump_launch(Launch(), "/dev/full/launch/x~1.json", str(fallback))


def test_a_checkpoint_write_that_raises_anything_leaves_no_partial_directory(tmp_path,
                                                                             monkeypatch):
    import torch

    def short_write(obj, f):  # what torch.save raises on a nearly full disk
        f.write(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64")

    monkeypatch.setattr(torch, "save", short_write)
    root = tmp_path / "checkpoints"
    with pytest.raises(RuntimeError, match="unexpected pos"):
        checkpointer.write_checkpoint(str(root), {"learner": {"w": np.zeros(3)}}, 10, 1)
    assert os.listdir(root) == []


def test_partial_checkpoints_of_an_earlier_incarnation_are_removed(tmp_path):
    root = tmp_path / "checkpoints"
    (root / ".tmp-ckpt-000000000010-0001").mkdir(parents=True)
    (root / ".tmp-ckpt-000000000010-0001" / "learner.pt").write_bytes(b"x" * 100)
    (root / "ckpt-000000000005-0000").mkdir()
    assert checkpointer.remove_partial(str(root)) == [".tmp-ckpt-000000000010-0001"]
    assert os.listdir(root) == ["ckpt-000000000005-0000"]


@contextlib.contextmanager
def _tmpfs(path, size: str):
    os.makedirs(path, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield str(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _fill(directory: str) -> str:
    """Write one file until the filesystem is full; return its path."""
    path = os.path.join(directory, "filler")
    with open(path, "wb", buffering=0) as f:
        for size in (1 << 20, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * size)
    return path


@pytest.mark.timeout(240)
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_full_disk_mid_run_does_not_end_the_run(tmp_path):
    n = 100_000
    with _tmpfs(tmp_path / "disk", "24m") as disk:
        run = LiveRun(os.path.join(disk, "run"), os.path.join(ROOT, "graphs", "demo_counter.yaml"),
                      f"nodes.source.config.count={n}",
                      "nodes.sink.kind=tests.liveness_nodes:memory_sink",
                      f"nodes.sink.config={{expected: {n}}}", "nodes.sink.subscribes=[doubled]",
                      "run.duration_s=200")
        try:
            run.wait_ready()
            pid = run.command("status")["nodes"]["transformer.0"]["pid"]
            run.wait_for_origin("doubled", 2_000)
            filler = _fill(disk)
            # A node dies while the disk is full: its restart needs a launch file, every
            # lifecycle event and log line is refused.
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while run.command("status")["nodes"]["transformer.0"]["pid"] in (pid, None):
                assert time.monotonic() < deadline, "the transformer was not restarted"
                time.sleep(0.1)  # polls the condition: the supervisor's status
            run.wait_ready("transformer")
            os.remove(filler)
            assert run.finish(200) == 0, run.stderr
            assert "Logging error" not in run.stderr and "Traceback" not in run.stderr, \
                run.stderr
            with open(os.path.join(run.run_dir, "memory_sink.json")) as f:
                result = json.load(f)
            assert result["unique"] == n, result
            assert os.path.exists(os.path.join(run.run_dir, "summary.json"))
        finally:
            run.kill()
