"""Run ledgers (issue 11, item 3): what the unroller sent and the replay store stored, over the
whole run and through kill -9s, adds up in ``summary.json``: nothing stored twice, nothing
missing from a publisher that ended cleanly, and what a killed publisher still held counted as
lost with it. The ledger unit tests come first; then a real run of the DQN graph."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.ledger import CLOSED, RECORD, Ledger, reconcile
from tests.pipeline_harness import ROOT, LiveRun
from tests.test_reliability_replay_restart import _status, _wait


def test_a_restarted_consumer_recognises_what_it_recorded(tmp_path):
    first = Ledger(str(tmp_path), "experience", "replay_store.0", "stored")
    for seq in (1, 2, 3):
        first.record("unroller.0~1", seq, 4)
    first.close()  # killed: nothing else is written
    again = Ledger(str(tmp_path), "experience", "replay_store.0", "stored")
    assert again.items == 12 and again.last_seq == {"unroller.0~1": 3}
    assert again.recorded("unroller.0~1", 3) and not again.recorded("unroller.0~1", 4)
    assert not again.recorded("unroller.0~2", 1)  # another incarnation numbers from 1


def test_a_torn_tail_is_cut_off(tmp_path):
    ledger = Ledger(str(tmp_path), "t", "n.0", "stored")
    ledger.record("p~1", 1, 5)
    ledger.close()
    with open(ledger.path, "ab") as f:
        f.write(b"\x01\x02\x03")  # a write cut short (a full disk)
    again = Ledger(str(tmp_path), "t", "n.0", "stored")
    again.record("p~1", 2, 5)
    again.close()
    assert os.path.getsize(again.path) == 2 * RECORD.itemsize
    assert reconcile(str(tmp_path))["t"]["consumers"]["n"]["stored"] == 10


def _sent(tmp_path, instance: str, sender: str, items: list[int], closed: bool) -> None:
    ledger = Ledger(str(tmp_path), "t", instance, "sent")
    for seq, n in enumerate(items, 1):
        ledger.record(sender, seq, n)
    if closed:
        ledger.close_sender(sender)
    ledger.close()


def _stored(tmp_path, instance: str, rows: list[tuple[str, int, int]]) -> None:
    ledger = Ledger(str(tmp_path), "t", instance, "stored")
    for sender, seq, n in rows:
        ledger.record(sender, seq, n)
    ledger.close()


def test_reconcile_tells_missing_from_lost_with_a_killed_publisher(tmp_path):
    _sent(tmp_path, "u.0", "u.0~1", [4, 4, 4], closed=False)  # killed holding its last message
    _sent(tmp_path, "u.0", "u.0~2", [4, 4], closed=True)
    _stored(tmp_path, "r.0", [("u.0~1", 1, 4), ("u.0~1", 2, 4), ("u.0~2", 1, 4)])
    out = reconcile(str(tmp_path))["t"]
    assert out["produced"] == 20 and out["publishers"] == 2 and out["publishers_closed"] == 1
    assert out["consumers"]["r"] == {"stored": 12, "stored_twice": 0, "missing": 4,
                                     "lost_with_publisher": 4, "unaccounted": 0}


def test_reconcile_finds_a_message_stored_twice_across_shards_and_incarnations(tmp_path):
    _sent(tmp_path, "u.0", "u.0~1", [2, 2], closed=True)
    _stored(tmp_path, "r.0", [("u.0~1", 1, 2)])
    _stored(tmp_path, "r.1", [("u.0~1", 1, 2), ("u.0~1", 2, 2), ("x~1", 1, 7)])
    out = reconcile(str(tmp_path))["t"]["consumers"]["r"]
    assert out["stored"] == 11 and out["stored_twice"] == 1 and out["missing"] == 0
    assert out["unaccounted"] == 7  # from a sender without a sent ledger


def test_no_ledger_directory_reconciles_to_nothing(tmp_path):
    assert reconcile(str(tmp_path)) == {}
    assert RECORD.itemsize == 12 and np.dtype(RECORD).names == ("sender", "seq", "items")


_SEQ = st.integers(1, CLOSED - 1)  # up to 2^32 - 2: CLOSED marks a sender's end


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.sampled_from(["u.0~1", "u.0~2", "a.1~7", "b.0~3"]),
                               st.one_of(_SEQ, st.sampled_from([1, 65_536, 65_537, 1 << 31])),
                               st.integers(0, 9)), max_size=40),
       split=st.integers(0, 40))
def test_reconcile_counts_as_a_dictionary_would(tmp_path_factory, rows, split):
    """The class, not the case: random senders and sequence numbers anywhere up to 2^32 (so
    seq 1 and 65,537 of two senders, which a key packed as ``sender << 16 | seq`` confuses),
    written by two consumer replicas, reconcile to what a plain dictionary counts.
    Mutations this catches: the key packed with ``<< 16`` (sequence numbers from 65,536 on
    collide with the next sender's), items summed over every row instead of once per key."""
    tmp_path = tmp_path_factory.mktemp("ledgers")
    _stored(tmp_path, "r.0", rows[:split])
    _stored(tmp_path, "r.1", rows[split:])
    counts, items = {}, {}
    for sender, seq, n in rows:
        counts[sender, seq] = counts.get((sender, seq), 0) + 1
        items.setdefault((sender, seq), n)  # the first record's items count
    out = reconcile(str(tmp_path)).get("t", {}).get("consumers", {}).get("r")
    if not rows:
        assert out is None or out["stored"] == 0
        return
    assert out["stored"] == sum(items.values())
    assert out["stored_twice"] == sum(1 for c in counts.values() if c > 1)
    assert out["unaccounted"] == sum(items.values())  # no sent ledgers here


def _training_run(tmp_path, storage_dir: str) -> LiveRun:
    """The DQN CartPole graph with no stop condition, once its learner has trained."""
    run = LiveRun(str(tmp_path / "run"), os.path.join(ROOT, "graphs", "dqn_cartpole.yaml"),
                  "nodes.evaluator.config.stop_at_return=null",
                  "nodes.learner.config.num_env_steps=100000000",
                  f"nodes.replay_store.config.storage_dir={storage_dir}")
    try:
        run.wait_ready()
        _wait(run, lambda nodes: nodes["learner.0"].get("status", {}).get("iteration", 0) > 50,
              "the learner did not train")
    except BaseException:
        run.kill()
        raise
    return run


def _stop(run: LiveRun) -> tuple[dict, dict, dict]:
    """Stop the run cleanly; its summary, experience ledger and the replay store's part."""
    try:
        run.interrupt()
        assert run.finish() == 0, run.stderr
        summary = run.summary()
    finally:
        run.kill()
    ledger = summary["ledger"]["experience"]
    return summary, ledger, ledger["consumers"]["replay_store"]


@pytest.mark.timeout(400)
def test_kill_9_of_a_memory_mapped_replay_store_and_of_the_unroller_stores_every_step_once(
        tmp_path):
    """The memory-mapped replay store is killed twice and the unroller once, each mid-stream.
    Every kill of the store leaves a message it stored but had not acknowledged (acks go with
    the next receive): redelivered, it must be recognised, or the files hold it twice. At the
    end the files hold exactly what the ledger says was stored, and sent = stored + what the
    killed unroller still held."""
    run = _training_run(tmp_path, "replay")
    try:
        for victim in ("replay_store.0", "unroller.0", "replay_store.0"):
            before = _status(run, victim)
            os.kill(before["pid"], signal.SIGKILL)
            _wait(run, lambda nodes, v=victim, b=before: nodes[v]["restarts"] > b["restarts"]
                  and nodes[v]["state"] == "running"
                  and nodes[v].get("status", {}).get("env_steps" if v.startswith("unroller")
                                                     else "inserted", 0) > 0,
                  f"{victim} did not come back")
            steps = _status(run, "learner.0")["status"]["iteration"]
            _wait(run, lambda nodes, s=steps: nodes["learner.0"]["status"]["iteration"] > s + 20,
                  f"the learner did not train after the kill of {victim}")
    except BaseException:
        run.kill()
        raise
    summary, ledger, stored = _stop(run)
    assert ledger["publishers"] == 2 and ledger["publishers_closed"] == 1, ledger
    assert stored["stored_twice"] == 0 and stored["missing"] == 0, ledger
    assert stored["unaccounted"] == 0, ledger
    assert ledger["produced"] == stored["stored"] + stored["lost_with_publisher"], ledger
    # At most what the killed unroller could hold, in 4-step messages: its backlog (the topic's
    # hwm, 256), the one waiting for room, and those sent but still in its socket's queue (the
    # consumer's window, 256). Three runs here lost 257 messages each: a full backlog.
    assert stored["lost_with_publisher"] <= 4 * (256 + 1 + 256), ledger
    # The files: every insert since the start is in the write positions, once.
    assert summary["nodes"]["replay_store.0"]["status"]["inserted"] == stored["stored"], \
        (summary["nodes"]["replay_store.0"]["status"], ledger)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("storage_dir", ["replay", "null"])
def test_swap_of_a_replay_store_hands_its_contents_over_and_stores_every_step_once(
        tmp_path, storage_dir):
    """The swap stops the running store first (break before make): a memory-mapped one's
    replacement re-attaches to its files (one writer at a time), an in-memory one's takes the
    state it left in a file. Either goes on counting from there, the learner trains on, and
    nothing is stored twice or lost on the way (the unroller held its messages)."""
    run = _training_run(tmp_path, storage_dir)
    try:
        before = _status(run, "replay_store.0")
        out = run.cli("swap", run.run_dir, "replay_store", "--set", "metrics_interval_s=0.5")
        assert out.returncode == 0, out.stderr
        after = _wait(run, lambda nodes: "inserted" in nodes["replay_store.0"].get("status", {}),
                      "the new replay store did not report")["replay_store.0"]
        assert after["incarnation"] != before["incarnation"], (before, after)
        assert after["status"]["inserted"] >= before["status"]["inserted"], (before, after)
        assert "lost_at_restart" not in after["status"], after
        iteration = _status(run, "learner.0")["status"]["iteration"]
        _wait(run, lambda nodes: nodes["learner.0"]["status"]["iteration"] > iteration + 100,
              "the learner did not train after the swap")
    except BaseException:
        run.kill()
        raise
    summary, ledger, stored = _stop(run)
    assert ledger["publishers"] == ledger["publishers_closed"] == 1, ledger
    assert stored["stored_twice"] == stored["missing"] == stored["lost_with_publisher"] == 0
    assert ledger["produced"] == stored["stored"] == \
        summary["nodes"]["replay_store.0"]["status"]["inserted"], (ledger, summary["nodes"])


def _message(t: int):
    from nodes.messages import ExperienceBatch
    from storage import StepType
    from tests.test_replay_store_frames import experience

    return ExperienceBatch(np.array([0, 1]), experience([2 * t, 2 * t + 1],
                                                        [StepType.MID] * 2), version=0)


def _mmap_store(tmp_path):
    from tests.test_replay_store_frames import store_for

    store = store_for(tmp_path, storage_dir="replay")
    store.ledger = Ledger(str(tmp_path), "experience", "replay_store.0", "stored")
    return store


@pytest.mark.parametrize("killed_before_insert", [False, True])
def test_a_memory_mapped_store_restarted_stores_a_redelivery_only_if_its_files_lack_it(
        tmp_path, killed_before_insert):
    """The ledger is written just before each insert: a store killed between the two holds one
    message less than its ledger says, and that message's redelivery is stored (once) but not
    recorded again; one killed after the insert skips the redelivery."""
    store = _mmap_store(tmp_path)
    for seq in (1, 2):
        store.ingest("u~1", seq, [_message(seq)])
    if killed_before_insert:
        store.ledger.record("u~1", 3, 2)  # the insert of message 3 never happened
    else:
        store.ingest("u~1", 3, [_message(3)])
    store.buffer.close()
    store.ledger.close()

    again = _mmap_store(tmp_path)
    assert again.reattach()
    assert again.applied == {"u~1": 2 if killed_before_insert else 3}
    for seq in (3, 4):  # 3 is redelivered: never acknowledged
        again.ingest("u~1", seq, [_message(seq)])
    assert again.limiter.inserted == again.ledger.items == 8  # four messages of two steps, once
    assert again.redelivered == (0 if killed_before_insert else 1)


@pytest.mark.parametrize("stored_of_batch", [0, 1, 2, 3])
def test_a_coalesced_batch_is_stored_whole_and_once_through_a_restart_inside_it(
        tmp_path, stored_of_batch):
    """A coalesced batch (three messages under one sequence number) is one ledger record and
    three inserts. A store killed after ``stored_of_batch`` of them comes back with its files,
    and the batch's redelivery stores exactly the messages they lack."""
    store = _mmap_store(tmp_path)
    store.ingest("u~1", 1, [_message(1)])
    batch = [_message(2), _message(3), _message(4)]
    store.ledger.record("u~1", 2, 6)  # what ingest writes first, then the inserts, killed
    for msg in batch[:stored_of_batch]:
        store.insert(msg)
    store.buffer.close()
    store.ledger.close()

    again = _mmap_store(tmp_path)
    assert again.reattach()
    assert again.limiter.inserted == 2 + 2 * stored_of_batch
    again.ingest("u~1", 2, batch)  # redelivered: never acknowledged
    again.ingest("u~1", 3, [_message(5)])
    assert again.limiter.inserted == again.ledger.items == 10  # five messages of two steps
    assert again.redelivered == (1 if stored_of_batch == 3 else 0)
    frames = again.buffer.get_field("observation", [0] * 5, list(range(5)))  # env 0, in order
    assert [int(f.flatten()[0]) for f in frames] == [2, 4, 6, 8, 10]
