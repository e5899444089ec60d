"""Launchers: how the supervisor starts a node replica's process, and where.

The supervisor's watchers, restarts with backoff, swap, scale and stop only need a *process
handle*: ``pid``, ``returncode``, ``await wait()`` (its exit code, negative for a signal),
``send_signal(sig)``, and optionally ``kill_group()`` (SIGKILL to its whole process group,
where ``os.killpg`` on this machine cannot reach it). A launcher makes them:

* :class:`~pipeline.launchers.local.LocalLauncher` (the default): a fork of the fork server,
  or a fresh interpreter, on this machine; what the supervisor always did.
* :class:`pipeline.launchers.ray.RayLauncher` (``run.launcher: ray``): a fresh interpreter on a
  Ray node chosen by the node's ``placement``, started and watched by a Ray actor.
"""

from __future__ import annotations

from pipeline.launchers.local import LocalLauncher, kill, run_py

__all__ = ["LocalLauncher", "kill", "make", "run_py"]


def make(graph, forkserver, run_dir: str):
    """The launcher ``run.launcher`` names."""
    if graph.run.launcher == "ray":
        # Only here: ray is an optional extra, slow to import.
        from pipeline.launchers.ray import RayLauncher

        return RayLauncher(graph.run.ray_address, run_dir, graph.run.ready_timeout_s)
    return LocalLauncher(forkserver)
