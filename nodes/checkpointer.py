"""checkpointer: collects every stateful node's state and writes it atomically.

On a schedule and when the run stops it asks each service in ``services`` (e.g.
``learner_state``, ``replay_state``, ``unroller_state``) for its state, writes one file per
component into a hidden temporary directory, fsyncs every file, writes a ``COMPLETE`` marker,
renames the directory into place and fsyncs the parent. A crash at any point leaves either the
previous checkpoints or a hidden partial directory that nothing loads. It keeps the newest
``num_checkpoints``. The nodes keep working while the files are written (in a thread).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field

import numpy as np

from nodes.messages import FINAL_CHECKPOINT, StateReply, StateRequest
from pipeline.ports import Ports, Service
from pipeline.wiring import MARKER, file_sha256, latest_checkpoint

log = logging.getLogger(__name__)

RETRY_S = 5.0  # after a failed write (disk full, read-only), try again this soon


@dataclass(frozen=True)
class Config:
    services: list[str] = field(default_factory=lambda: ["unroller_state", "replay_state",
                                                         "learner_state"],
                                metadata={"doc": "state services to collect, in this order"})
    interval_s: float = field(default=60.0, metadata={"doc": "seconds between checkpoints"})
    num_checkpoints: int = field(default=3, metadata={"doc": "newest ones kept"})
    timeout_s: float = field(default=120.0, metadata={"doc": "wait for each state"})
    final: bool = field(default=True, metadata={"doc": "checkpoint when the run stops"})


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def as_torch(tree):
    """Arrays that came over the wire as numpy become tensors: ``torch.load(weights_only=True)``
    accepts tensors and plain containers only."""
    import torch  # here, not at the top: the node starts without torch (start-up is CPU-bound)

    if isinstance(tree, np.ndarray):
        return torch.from_numpy(np.array(tree))
    if isinstance(tree, dict):
        return {k: as_torch(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(as_torch(v) for v in tree)
    return tree


def write_checkpoint(root: str, states: dict, env_steps: int, sequence: int,
                     previous: str | None = None) -> str:
    """Write ``states`` (component -> state) as one checkpoint directory; return its path.

    Components of ``previous`` that ``states`` lacks are carried over as copies whose content
    hash is checked against the one ``previous`` recorded, so every checkpoint is complete on
    its own and no two share a file (a damaged file damages one checkpoint only). The
    ``COMPLETE`` marker, written last, lists every file's SHA-256, which
    :func:`pipeline.wiring.latest_checkpoint` verifies before anything loads it."""
    os.makedirs(root, exist_ok=True)
    name = f"ckpt-{env_steps:012d}-{sequence:04d}"
    tmp = os.path.join(root, f".tmp-{name}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        return _write_into(tmp, root, name, states, env_steps, previous)
    except BaseException:
        # Whatever failed (ENOSPC, EIO, torch.save's RuntimeError on a short write): a partial
        # directory that nothing loads would only take the space the next attempt needs.
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_into(tmp: str, root: str, name: str, states: dict, env_steps: int,
                previous: str | None) -> str:
    import torch

    hashes = {}
    for component, state in states.items():
        path = os.path.join(tmp, f"{component}.pt")
        with open(path, "wb") as f:
            torch.save(as_torch(state), f)
            f.flush()
            os.fsync(f.fileno())
        hashes[f"{component}.pt"] = file_sha256(path)  # read back from the page cache
    if previous is not None and os.path.isdir(previous):
        recorded = _recorded_hashes(previous)
        for filename in sorted(os.listdir(previous)):
            if not filename.endswith(".pt") or filename[:-3] in states:
                continue
            copy = os.path.join(tmp, filename)
            shutil.copyfile(os.path.join(previous, filename), copy)
            digest = file_sha256(copy)
            if filename in recorded and recorded[filename] != digest:
                log.error("%s/%s does not match its content hash: not carried over",
                          previous, filename)
                os.unlink(copy)
                continue
            with open(copy, "rb+") as f:
                os.fsync(f.fileno())
            hashes[filename] = digest
    with open(os.path.join(tmp, MARKER), "w") as f:
        json.dump({"env_steps": env_steps, "time": time.time(), "components": sorted(states),
                   "files": hashes}, f)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)
    final = os.path.join(root, name)
    os.rename(tmp, final)
    _fsync_dir(root)
    return final


def _recorded_hashes(checkpoint: str) -> dict:
    try:
        with open(os.path.join(checkpoint, MARKER)) as f:
            return dict(json.load(f).get("files", {}))
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def _last_sequence(root: str) -> int:
    """The highest sequence number among a run's checkpoints: a restarted checkpointer goes on
    from there, so names keep sorting in the order they were written."""
    numbers = [0]
    if os.path.isdir(root):
        for name in os.listdir(root):
            tail = name.rsplit("-", 1)[-1]
            if name.startswith(("ckpt-", ".tmp-ckpt-")) and tail.isdigit():
                numbers.append(int(tail))
    return max(numbers)


def remove_partial(root: str) -> list[str]:
    """Remove the hidden partial directories (``.tmp-ckpt-*``) an earlier incarnation left
    when it was killed while writing: nothing loads them, and on a full disk they hold the
    space a new checkpoint needs. Only the run's one checkpointer writes there."""
    removed = []
    if os.path.isdir(root):
        for name in sorted(os.listdir(root)):
            if name.startswith(".tmp-ckpt-"):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
                removed.append(name)
    return removed


def prune(root: str, keep: int) -> None:
    done = sorted(d for d in os.listdir(root) if d.startswith("ckpt-"))
    for name in done[:-keep]:
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def left_state_path(run_dir: str, service: str) -> str:
    """Where a node that finished on its own leaves what ``service`` would have answered
    (``nodes._common.leave_state``); the final checkpoint takes it."""
    return os.path.join(run_dir, "state", f"{service}.final.pt")


def _left_state(run_dir: str, service: str) -> dict | None:
    """What a node that finished left for ``service`` (``nodes._common.leave_state``)."""
    path = left_state_path(run_dir, service)
    if not os.path.exists(path):
        return None
    import torch

    return torch.load(path, weights_only=True)


def PORTS(config: Config) -> Ports:  # noqa: N802 - the name the pipeline looks for
    """It calls every state service in ``services`` (what the graph entry lists)."""
    return Ports(calls={name: Service(StateRequest, StateReply) for name in config.services})


async def run(config: Config, node, ready) -> dict:
    bus = node.bus
    clients = {name: bus.client(name) for name in config.services}
    root = os.path.join(node.info.run_dir, "checkpoints")
    sequence = _last_sequence(root)
    for name in remove_partial(root):
        log.warning("removed %s, a checkpoint an earlier incarnation did not finish", name)
    written = []
    # One checkpoint at a time: a requested one waits for a scheduled one under way.
    writing = asyncio.Lock()

    async def on_demand() -> dict:
        """``run.py checkpoint``: write one now and answer with its path (or why not)."""
        async with writing:
            path = await checkpoint("requested")
        node.status.pop("warning", None)
        return {"path": path}

    node.commands["checkpoint"] = on_demand
    ready()

    async def checkpoint(reason: str) -> str:
        nonlocal sequence
        # In the configured order, one after the other: the unroller flushes its experience
        # into replay before it answers a final request, so replay must be asked after it.
        replies, carried, left = [], [], {}
        for name, client in clients.items():
            if reason == FINAL_CHECKPOINT and not client.connections:
                # It already finished: the state it left (the learner at its budget), else
                # its newest periodic one, carried over.
                state = _left_state(node.info.run_dir, name)
                if state is None:
                    carried.append(name)
                else:
                    left[name] = state
                continue
            if len(client.connections) > 1:  # replay shards: every one, each its own file
                replies += await asyncio.gather(*(
                    client.submit(StateRequest(reason), config.timeout_s, endpoint)
                    for endpoint in list(client.connections)))
                continue
            replies.append(await client.request(StateRequest(reason), config.timeout_s))
        states = {r.message.component: r.message.state for r in replies}
        states.update((s["component"], s["state"]) for s in left.values())
        env_steps = max([r.message.env_steps for r in replies] +
                        [s["env_steps"] for s in left.values()], default=0)
        sequence += 1
        # A restarted checkpointer carries over from the run's newest intact checkpoint.
        previous = written[-1] if written else latest_checkpoint(node.info.run_dir)
        if carried:
            log.warning("final checkpoint: %s no longer running; their state is carried over "
                        "from %s", ", ".join(carried), previous)
        path = await asyncio.to_thread(write_checkpoint, root, states, env_steps, sequence,
                                       previous)
        await asyncio.to_thread(prune, root, config.num_checkpoints)
        written.append(path)
        for name in left:  # taken: never again in place of a node that runs
            os.remove(left_state_path(node.info.run_dir, name))
        node.status.update(checkpoints=len(written), env_steps=env_steps)
        log.info("checkpoint %s (%s)", path, reason)
        return path

    async def attempt(reason: str) -> bool:
        """One checkpoint; False if it could not be written (the disk), which is reported in
        the node's status ``warning`` (the supervisor prints it on the terminal) until a
        later attempt succeeds."""
        try:
            async with writing:
                await checkpoint(reason)
        except TimeoutError as exc:  # a node is restarting: try again next time
            log.warning("checkpoint skipped: %s", exc)
            return True
        except Exception as exc:  # noqa: BLE001 - any failure is this attempt's, not the node's
            # Not only OSError: torch.save on a nearly full disk raises RuntimeError
            # ("unexpected pos"), a state that does not serialize raises what it raises.
            node.status["warning"] = (f"checkpoint not written: {type(exc).__name__}: {exc}; "
                                     f"retrying every {retry_s:g}s")
            log.error("%s", node.status["warning"], exc_info=not isinstance(exc, OSError))
            return False
        if node.status.pop("warning", None):
            log.warning("checkpoints are written again")
        return True

    retry_s = min(config.interval_s, RETRY_S)
    wait_s = config.interval_s
    while True:
        try:
            await asyncio.wait_for(node.stopping.wait(), wait_s)
            break
        except TimeoutError:
            pass
        wait_s = config.interval_s if await attempt("scheduled") else retry_s
    if config.final and not await attempt(FINAL_CHECKPOINT):
        log.error("final checkpoint failed: %s", node.status.get("warning"))
    return {"checkpoints": len(written), "last": written[-1] if written else None}
