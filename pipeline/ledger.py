"""Ledgers: what each publisher sent on a reliable topic and what each consumer stored from it,
over the whole run, restarts included.

A node's own counters live and die with its process (or go back to its last checkpoint), so
they cannot show that a topic's messages were stored exactly once across kill -9s. A ledger
can: it is an append-only file per node replica and role, ``RUN_DIR/ledger/<topic>/<instance>
.sent`` or ``.stored``, holding one 12-byte record per message (sender, sequence number, items)
written with a single ``write`` -- which a kill -9 does not cut -- and read again by the next
incarnation. The consumer writes its record after the message's effect and before the message
is acknowledged, so a redelivered message is recognised (:meth:`Ledger.recorded`) and counted
once (a consumer whose effect outlives it, a memory-mapped store, writes just before it applies
the message, and on restart checks the newest record against its files: ``last_record``); the
producer writes before it hands the message to the transport, so what it counts as sent is
never less than what went out. At a clean end the bus marks its senders closed once
everything they sent was acknowledged.

:func:`reconcile` reads every ledger of a run directory: per topic what was produced, and per
consuming node what was stored, stored twice, missing from publishers that ended cleanly, and
lost with publishers that did not (messages queued inside a killed process). The supervisor
writes it into ``summary.json``. No RL here: nodes say what a message's items are.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import os
import struct

import numpy as np

log = logging.getLogger(__name__)

RECORD = np.dtype([("sender", "<u4"), ("seq", "<u4"), ("items", "<u4")])
_PACK = struct.Struct("<III").pack  # one RECORD
CLOSED = 0xFFFFFFFF  # the seq of a sender's last record: it ended with everything acknowledged
ROLES = ("sent", "stored")
# Records held in memory while the disk refuses them (ENOSPC, EIO): beyond this many the oldest
# writes are given up and counted. A consumer's ledger never gets near it: it holds back its
# acknowledgements meanwhile, so its publishers stop sending once its credit is used up.
PENDING_MAX = 1 << 20
RETRY_S, RETRY_MAX_S = 0.1, 5.0  # first retry of a refused write, doubling up to this


class Ledger:
    """One node replica's ledger for one topic and role; see the module docstring."""

    def __init__(self, run_dir: str, topic: str, instance: str, role: str):
        if role not in ROLES:
            raise ValueError(f"ledger role must be one of {ROLES}, got {role!r}")
        directory = os.path.join(run_dir, "ledger", topic)
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, f"{instance}.{role}")
        self.senders, records = _read(self.path)
        self._index = {name: i for i, name in enumerate(self.senders)}
        live = records[records["seq"] != CLOSED]
        self.items = int(live["items"].sum())
        self.last_seq: dict[str, int] = {}
        # The newest record: the one message whose effect may be in doubt after a kill, for a
        # consumer that records before it applies (see ReplayStore.reattach).
        self.last_record = (self.senders[live["sender"][-1]], int(live["seq"][-1]),
                            int(live["items"][-1])) if len(live) else None
        for sender in np.unique(live["sender"]):
            self.last_seq[self.senders[sender]] = int(live["seq"][live["sender"] == sender].max())
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._names = os.open(self.path + ".senders", os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                              0o600)
        # Disk trouble: writes the disk refused, in order (fd, bytes), retried with backoff.
        # As a gate of Bus.hold_acks (seq, completed_through: records made, records on disk) a
        # consumer acknowledges nothing it handled while its record is not written: it stops
        # acknowledging rather than exiting, and nothing is lost.
        self._pending: collections.deque = collections.deque()
        self.seq = self.completed_through = 0
        self.given_up = 0  # records dropped past PENDING_MAX (counted, reported)
        self._retry: asyncio.TimerHandle | None = None
        self._delay = RETRY_S
        self.write = os.write  # the one writer (a test injects a failing one)
        # on_trouble(message or None): a new episode of trouble, and its end; on_written():
        # held records reached the disk (the bus may acknowledge again).
        self.on_trouble = lambda message: None
        self.on_written = lambda: None

    def recorded(self, sender: str, seq: int) -> bool:
        """Whether this message was recorded before (a redelivery after a restart)."""
        return seq <= self.last_seq.get(sender, 0)

    def record(self, sender: str, seq: int, items: int) -> None:
        index = self._index.get(sender)
        if index is None:  # the name goes to disk before any record that refers to it
            index = self._index[sender] = len(self.senders)
            self.senders.append(sender)
            self._append(self._names, sender.encode() + b"\n")
        self.seq += 1
        self._append(self._fd, _PACK(index, seq, items))
        if not self._pending:
            self.completed_through = self.seq
        if seq > self.last_seq.get(sender, 0):
            self.last_seq[sender] = seq
        self.items += items
        if seq != CLOSED:
            self.last_record = (sender, seq, items)

    def _append(self, fd: int, data: bytes) -> None:
        if not self._pending:
            try:
                self._write_whole(fd, data)
                return
            except OSError as exc:
                self._trouble(exc)
        if len(self._pending) >= PENDING_MAX:
            self._pending.popleft()
            self.given_up += 1
        self._pending.append((fd, data, self.seq))
        self._schedule()

    def _write_whole(self, fd: int, data: bytes) -> None:
        """One record (or name) whole, or nothing: a short write (the disk filled up under
        it) is cut off again, so a retry never lands behind torn bytes."""
        written = self.write(fd, data)
        if written != len(data):
            os.ftruncate(fd, os.fstat(fd).st_size - written)
            raise OSError(errno.ENOSPC, f"short write ({written} of {len(data)} bytes)")

    def _trouble(self, exc: OSError) -> None:
        message = (f"ledger {self.path} not written ({exc.strerror or exc}): holding "
                   f"acknowledgements and retrying")
        log.error("%s", message)
        self.on_trouble(message)

    def _schedule(self) -> None:
        if self._retry is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (a script): flush() retries
                return
            self._retry = loop.call_later(self._delay, self._retry_now)
            self._delay = min(RETRY_MAX_S, self._delay * 2)

    def _retry_now(self) -> None:
        self._retry = None
        self.flush()

    def flush(self) -> bool:
        """Write what the disk refused before, in order; True once nothing is held."""
        pending = self._pending
        if not pending:
            return True
        while pending:
            fd, data, seq = pending[0]
            try:
                self._write_whole(fd, data)
            except OSError:
                self._schedule()
                return False
            pending.popleft()
            self.completed_through = seq if pending else self.seq
        self._delay = RETRY_S
        log.warning("ledger %s written again", self.path)
        self.on_trouble(None)
        self.on_written()
        return True

    def close_sender(self, sender: str) -> None:
        """Mark ``sender`` as ended with everything it sent acknowledged."""
        self.record(sender, CLOSED, 0)

    def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._pending and not self.flush():
            log.error("ledger %s: %d records could not be written", self.path,
                      len(self._pending))
        if self._fd >= 0:
            os.close(self._fd)
            os.close(self._names)
            self._fd = self._names = -1


def _read(path: str) -> tuple[list[str], np.ndarray]:
    """The senders table and the records; a torn tail (a full disk) is cut off."""
    senders = []
    if os.path.exists(path + ".senders"):
        with open(path + ".senders", "rb") as f:
            senders = [line.decode() for line in f.read().split(b"\n") if line]
    if not os.path.exists(path):
        return senders, np.zeros(0, RECORD)
    with open(path, "rb") as f:
        data = f.read()
    whole = len(data) - len(data) % RECORD.itemsize
    if whole != len(data):
        os.truncate(path, whole)
    records = np.frombuffer(data[:whole], RECORD)
    return senders, records[records["sender"] < len(senders)]


def reconcile(run_dir: str) -> dict:
    """Every topic's ledgers, added up: see the module docstring. Empty without ledgers."""
    root = os.path.join(run_dir, "ledger")
    if not os.path.isdir(root):
        return {}
    out = {}
    for topic in sorted(os.listdir(root)):
        directory = os.path.join(root, topic)
        sent: dict[str, int] = {}
        closed: set[str] = set()
        stored: dict[str, list[np.ndarray]] = {}  # node -> (sender id, seq, items) arrays
        names: dict[str, int] = {}
        for file in sorted(os.listdir(directory)):
            instance, _, role = file.rpartition(".")
            if role not in ROLES:
                continue
            senders, records = _read(os.path.join(directory, file))
            if role == "sent":
                for i, name in enumerate(senders):
                    mine = records[records["sender"] == i]
                    sent[name] = sent.get(name, 0) + int(mine["items"].sum())
                    if np.any(mine["seq"] == CLOSED):
                        closed.add(name)
                continue
            # Sender names numbered across the run's files, so rows of shards and
            # incarnations compare.
            ids = np.array([names.setdefault(s, len(names)) for s in senders], np.int64)
            live = records[records["seq"] != CLOSED]
            node = instance.rpartition(".")[0] or instance
            stored.setdefault(node, []).append(np.stack(
                [ids[live["sender"]] if len(ids) else np.zeros(0, np.int64),
                 live["seq"].astype(np.int64), live["items"].astype(np.int64)], axis=1))
        name_of = {i: name for name, i in names.items()}
        nodes = {}
        for node, parts in stored.items():
            rows = np.concatenate(parts)
            keys = rows[:, 0] << 32 | rows[:, 1]
            _, first, counts = np.unique(keys, return_index=True, return_counts=True)
            once = rows[first]
            by_sender = {name_of[int(s)]: int(once[once[:, 0] == s, 2].sum())
                         for s in np.unique(once[:, 0])}
            missing = lost = unaccounted = 0
            for name, count in sent.items():
                short = count - by_sender.get(name, 0)
                if name in closed:
                    missing += max(0, short)
                else:
                    lost += max(0, short)
            for name, count in by_sender.items():
                unaccounted += count if name not in sent else max(0, count - sent[name])
            nodes[node] = {"stored": int(once[:, 2].sum()),
                           "stored_twice": int((counts > 1).sum()),
                           "missing": missing, "lost_with_publisher": lost,
                           "unaccounted": unaccounted}
        out[topic] = {"produced": sum(sent.values()),
                      "publishers": len(sent), "publishers_closed": len(closed),
                      "consumers": nodes}
    return out
