"""How a replay store goes on across its incarnations without storing a message twice.

A store comes back in one of three ways: it re-attaches to its memory-mapped files, it takes
the state a predecessor stopped for a swap or restart left for it (``take_handover``), or it
restores the newest checkpoint. It then knows, per sender, the newest message its buffer holds
(``ReplayStore.applied``), and a redelivered message (stored and not yet acknowledged when the
previous incarnation died) is stored again only if the buffer lacks it. The run ledger
(``pipeline.ledger``) is written just before each insert and counts each message once; what
it recorded beyond what the buffer came back with was lost with the previous process.
"""

from __future__ import annotations

import logging
import os

import torch

from nodes._common import save_atomically

log = logging.getLogger(__name__)


def applied_in_files(ledger, inserted: int) -> tuple[dict[str, int], tuple | None]:
    """``(applied, part)``: the newest message per sender that memory-mapped files holding
    ``inserted`` steps hold, and ``(sender, seq, steps)`` of a message they hold only the first
    ``steps`` of (else None). The ledger is written just before each message's inserts, so
    only its newest record can be missing from the files, whole (killed between the two) or
    in part (a coalesced batch of several inserts, killed between them): its redelivery is
    stored, less what the files hold, and not recorded again."""
    if ledger is None:
        return {}, None
    applied = dict(ledger.last_seq)
    short = ledger.items - inserted
    last = ledger.last_record
    if short and last is not None and 0 < short <= last[2]:
        applied[last[0]] = last[1] - 1
        return applied, (last[0], last[1], last[2] - short) if short < last[2] else None
    if short:
        log.warning("replay files hold %d steps, the ledger %d: a redelivery may be stored "
                    "twice", inserted, ledger.items)
    return applied, None


def lost_at_restart(ledger, inserted: int) -> int:
    """Steps stored after the state the store came back with, lost with the previous process
    (an in-memory buffer killed): the ledger knows, the buffer cannot."""
    return max(0, ledger.items - inserted) if ledger is not None else 0


def handover_path(run_dir: str, instance: str) -> str:
    """Where a replaced in-memory store leaves its state for its replacement."""
    return os.path.join(run_dir, "state", f"{instance}.handover.pt")


def leave_handover(path: str, state: dict) -> None:
    """An in-memory store stopped for a replacement writes its whole state for it
    (:func:`~nodes._common.save_atomically`: the replacement finds all of it or none)."""
    save_atomically(path, state)
    log.info("left the replay state for the replacement in %s", path)


def take_handover(path: str) -> dict | None:
    """What a replaced predecessor left (newer than any checkpoint), taken: a later restart
    comes back from a checkpoint again. None if it left nothing."""
    if not os.path.exists(path):
        return None
    state = torch.load(path, weights_only=True)
    os.remove(path)
    log.info("took over the replay state the replaced store left in %s", path)
    return state
