"""The end of a run, for :class:`pipeline.supervisor.Supervisor`: every node stopped in
:meth:`Graph.stop_order` waves, ``summary.json`` written, the supervisor's own helpers and
sockets closed, and whatever is still running killed. Each step runs even if one before it
failed, and every error is reported (aiohttp's ``BaseRunner.cleanup``)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import sys
import time

from pipeline import launchers
from pipeline.ledger import reconcile
from pipeline.sockets import remove_socket_dir

log = logging.getLogger(__name__)

EXIT_OK, EXIT_NODE_FAILED = 0, 1


async def clean_up(sup, helpers: list) -> None:
    """LIFO-style teardown where every step runs even if one before it failed, each error
    is reported, and whatever happened no node process is left: the last step kills what
    is still running."""

    async def stop_helpers():
        for helper in helpers:
            helper.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)

    async def close_forkserver():
        if sup.forkserver is not None:
            await sup.forkserver.close()
        await sup.launcher.close()

    steps = [("stop the nodes", functools.partial(stop_all, sup)),
             ("write summary.json", functools.partial(write_summary, sup)),
             ("stop its helpers", stop_helpers),
             ("close its sockets", as_async(sup.sockets.close_all)),
             ("close the fork server", close_forkserver),
             ("close events.jsonl", as_async(sup._events_file.close)),
             ("remove its socket directory", as_async(
                 lambda: remove_socket_dir(sup.sock_dir)))]
    for what, step in steps:
        try:
            await step()
        except Exception as exc:  # noqa: BLE001 - report it, go on cleaning up
            log.error("could not %s", what, exc_info=exc)
            print(f"warning: the supervisor could not {what}: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
    kill_leftovers(sup)

def kill_leftovers(sup) -> None:
    for inc in list(sup.incarnations.values()):
        if inc.process is not None and inc.process.returncode is None:
            log.error("%s still running at exit: SIGKILL", inc.launch.incarnation)
            launchers.kill(inc.process)

async def write_summary(sup) -> None:
    # What every node reported last (final summaries and bus counters), for users and
    # tests to read after the run.
    summary = await sup.status()
    summary["failure"] = sup.failure
    # Why the run ended (the end-of-run block and `status` of a finished run read it):
    # reason is STOP_CONDITION, "duration", "stop requested", "signal SIGINT|SIGTERM" or
    # "failure"; node, the stop_when replica that finished; the exit code run() returns.
    summary["ended"] = {"reason": sup.ended_by, "node": sup.ended_node,
                        "exit_code": EXIT_NODE_FAILED if sup.failure else EXIT_OK,
                        "duration_s": sup.graph.run.duration_s,
                        "on_duration": sup.graph.run.on_duration,
                        "stop_when": list(sup.graph.run.stop_when)}
    summary["ledger"] = reconcile(sup.run_dir)  # exactly-once over the run: see ledger.py
    sup.summary = summary
    # A full or failing disk may clear (a log rotated, a checkpoint pruned): retry with
    # backoff for a while rather than end the run without its summary.
    path, delay, deadline = os.path.join(sup.run_dir, "summary.json"), 0.1, time.monotonic() + 10
    while True:
        try:
            write_json(path, summary)
            return
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.remove(path + ".tmp")
            if time.monotonic() + delay > deadline:
                raise
            log.warning("cannot write %s (%s); retrying", path, exc.strerror or exc)
            await asyncio.sleep(delay)  # a backoff, not a synchronization
            delay = min(2.0, delay * 2)



async def stop_all(sup) -> None:
    for wave in sup.graph.stop_order():
        await asyncio.gather(*(w.stop("run ending") for n in wave
                               for w in sup.watchers[n]))
    # Anything left (e.g. a replacement that was still starting) is killed outright.
    for inc in list(sup.incarnations.values()):
        await sup.stop_incarnation(inc, "run ending")


def remove_stale_socket_dir(endpoints_json: str) -> None:
    """The socket directory of an earlier run on this run directory that could not remove it
    (killed with SIGKILL). Safe: we hold the run directory's lock, so that run is over."""
    try:
        with open(endpoints_json) as f:
            control = json.load(f).get("control", "")
    except (OSError, ValueError, AttributeError):
        return
    if isinstance(control, str) and control.startswith("ipc://"):
        remove_socket_dir(os.path.dirname(control[len("ipc://"):]))


def as_async(fn):
    async def call():
        fn()

    return call



def write_json(path: str, data: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(path + ".tmp", path)
