"""``run.launcher: ray``: each node replica is a process on a Ray node chosen by its placement.

Why Ray: it already knows the cluster's machines, their resources and labels, and notices when
one dies; we only need "start this command there and tell me when it exits". So each
incarnation gets one small Ray actor (:class:`NodeHost`), scheduled with the node's
``placement`` (``num_cpus``, ``num_gpus``, ``memory``, ``resources``, ``labels``). The actor
starts ``run.py node LAUNCH LOG`` as a fresh interpreter in its own session on its machine,
and answers ``wait()`` with the exit code. ZeroMQ stays the data plane; the supervisor keeps
watching, restarting with backoff, swapping, scaling and stopping as with local processes.

When the Ray node dies, its actors die with it, and the node process dies with its actor
(``PR_SET_PDEATHSIG``): ``wait()`` fails with an actor error, which reads as a SIGKILL, and the
watcher restarts the replica; Ray schedules the new actor on a node that satisfies the
placement.

Assumptions (docs/distributed.md): every machine sees the run directory at the same path (a
shared file system: launch specs, key files, logs, checkpoints), and has this project and its
Python at the same path as the supervisor. The user's own modules (the graph's ``imports:``,
``module:function`` kinds, ``module:EnvId`` environments) are imported by the node process from
its launch spec, with the supervisor's working directory on ``sys.path`` (docs/custom.md): that
directory too must be at the same path, or the modules installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys

from pipeline.launchers.local import run_py

log = logging.getLogger(__name__)

KILLED = -signal.SIGKILL  # what a replica whose Ray node (or actor) died reads as


def _ray():
    try:
        import ray
    except ImportError:
        raise RuntimeError("run.launcher: ray needs the ray extra (pip install -e '.[ray]')") from None
    return ray


class _Host:
    """Body of the Ray actor that starts and watches one node process on its machine.

    Threaded (``max_concurrency``): ``wait`` blocks while ``signal`` is answered."""

    def start(self, argv: list, log_path: str, env: dict, secret_file: str | None) -> dict:
        import subprocess

        from pipeline.forkserver import PARENT_ENV

        env = {**os.environ, **env, PARENT_ENV: str(os.getpid())}
        if secret_file:  # read here, from the shared run directory: never on Ray's wire
            with open(secret_file) as f:
                env["CONDUIT_RUN_SECRET"] = f.read().strip()
        import ray

        env.setdefault("CONDUIT_ADVERTISE_HOST", ray.util.get_node_ip_address())
        with open(log_path, "ab") as log_file:
            self.proc = subprocess.Popen(argv, stdout=log_file, stderr=log_file,
                                         stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)
        return {"pid": self.proc.pid, "host": env["CONDUIT_ADVERTISE_HOST"],
                "ray_node": ray.get_runtime_context().get_node_id()}

    def wait(self) -> int:
        return self.proc.wait()

    def signal(self, sig: int, group: bool = False) -> None:
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(self.proc.pid, sig)
            else:
                os.kill(self.proc.pid, sig)


class RayProcess:
    """The supervisor's handle on a node process that a :class:`_Host` actor started."""

    def __init__(self, ray, actor, info: dict):
        self._ray, self.actor = ray, actor
        self.pid, self.host, self.ray_node = info["pid"], info["host"], info["ray_node"]
        self.returncode: int | None = None
        self._waiting = actor.wait.remote()

    async def wait(self) -> int:
        if self.returncode is None:
            try:
                code = await self._waiting
            except Exception as exc:  # noqa: BLE001 - the actor or its Ray node died
                log.warning("node process %d on Ray node %s is lost (%s): counted as killed",
                            self.pid, self.ray_node[:12], type(exc).__name__)
                code = KILLED
            if self.returncode is None:
                self.returncode = code
            with contextlib.suppress(Exception):
                self._ray.kill(self.actor)  # frees the actor's resources
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            self.actor.signal.remote(int(sig))

    def kill_group(self) -> None:
        if self.returncode is None:
            self.actor.signal.remote(int(signal.SIGKILL), True)


class RayLauncher:
    """Starts node processes through Ray actors placed by each node's ``placement``."""

    def __init__(self, address: str, run_dir: str, place_timeout_s: float = 120.0):
        self.ray = _ray()
        self.place_timeout_s = place_timeout_s
        self.address, self.run_dir = address, run_dir
        self._actor_cls = None
        self._connecting = asyncio.Lock()

    def _connect(self):
        ray = self.ray
        if not ray.is_initialized():
            root = os.path.dirname(run_py())
            extra = {}
            if self.address.split(":")[0] in ("127.0.0.1", "localhost"):
                # A cluster on loopback (tests): Ray would otherwise pick this machine's
                # network address for the driver and never reach the cluster's services.
                extra["_node_ip_address"] = "127.0.0.1"
            ray.init(address=self.address, logging_level=logging.WARNING,
                     log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": root}},
                     **extra)
        if self._actor_cls is None:
            self._actor_cls = ray.remote(_Host)
        return self._actor_cls

    def options(self, placement: dict) -> dict:
        """Ray actor options for a node's ``placement`` (an actor reserves no CPU unless the
        placement asks: the node process is what uses it)."""
        opts = {"num_cpus": placement.get("num_cpus", 0), "max_concurrency": 4,
                "max_restarts": 0}
        for key in ("num_gpus", "memory"):
            if key in placement:
                opts[key] = placement[key]
        if placement.get("resources"):
            opts["resources"] = dict(placement["resources"])
        if placement.get("labels"):
            opts["label_selector"] = dict(placement["labels"])
        return opts

    async def start(self, node, launch_path: str, log_path: str, fresh: bool):
        try:
            async with self._connecting:  # one ray.init, whoever starts first
                cls = await asyncio.wait_for(asyncio.to_thread(self._connect),
                                             self.place_timeout_s)
        except TimeoutError:
            raise RuntimeError(f"cannot connect to the Ray cluster at {self.address} within "
                               f"{self.place_timeout_s:.0f}s") from None
        argv = [sys.executable, run_py(), "node", launch_path, log_path]
        secret = os.path.join(self.run_dir, "secret")
        secret = secret if os.path.exists(secret) else None
        deadline = asyncio.get_running_loop().time() + self.place_timeout_s
        while True:
            actor = cls.options(**self.options(node.placement)).remote()
            started = actor.start.remote(argv, log_path, {}, secret)
            left = deadline - asyncio.get_running_loop().time()
            try:
                info = await asyncio.wait_for(asyncio.wrap_future(started.future()),
                                              max(left, 0.001))
            except TimeoutError:
                self.ray.kill(actor)
                raise RuntimeError(f"no Ray node with {node.placement or 'any resources'} "
                                   f"took node {node.name} within "
                                   f"{self.place_timeout_s:.0f}s") from None
            except self.ray.exceptions.RayActorError as exc:
                # Placed on a Ray node that died before Ray noticed (a restart right after a
                # machine was lost): once it is marked dead, a new actor goes elsewhere.
                log.warning("the actor for %s died before it started (%s): placing it again",
                            node.name, type(exc).__name__)
                continue
            return RayProcess(self.ray, actor, info)

    def where(self, process) -> str:
        return f"pid {process.pid} on {process.host} (Ray node {process.ray_node[:12]})"

    async def close(self) -> None:
        return None
