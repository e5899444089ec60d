"""Command-line interface behind ``run.py`` (see its docstring for the commands)."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import sys
import time

import yaml

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
COMMANDS = ("run", "check", "status", "monitor", "stop", "restart", "swap", "scale", "plot",
            "node", "checkpoint")
# Commands run.py carries out itself; every other one is a supervisor command (cmd_<name>).
LOCAL_COMMANDS = frozenset({"run", "check", "monitor", "plot", "node"})
# Reply codes that mean the user asked for something wrong (exit 2); the rest exit 1.
USAGE_CODES = frozenset({"unknown_command", "bad_request", "unauthorized"})


class UsageError(Exception):
    """A user mistake: printed as one line, exit code 2."""


class CommandFailed(Exception):
    """The supervisor could not do what was asked (timeout, run failed): one line, exit 1."""


def main(argv: list[str]) -> int:
    if argv and argv[0] == "node":  # the hot path of every node process: no argparse
        from pipeline.forkserver import PARENT_ENV, die_with_parent
        from pipeline.node import process_main

        if os.environ.get(PARENT_ENV):  # started by a supervisor: never outlive it
            die_with_parent(int(os.environ[PARENT_ENV]))

        return process_main(argv[1], argv[2] if len(argv) > 2 else None)
    try:
        args = parse_args(argv)
        if args.command is None:
            _parser().print_help()
            return EXIT_USAGE
        return args.func(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CommandFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_OK


# Commands a package above pipeline/ adds (``nodes`` adds ``play`` and ``export``): name ->
# (help, add_arguments(parser), run(args) -> exit code). pipeline/ knows no RL.
_EXTRA: dict[str, tuple[str, object, object]] = {}


def register_command(name: str, helptext: str, add_arguments, run) -> None:
    """Add ``run.py NAME``: ``add_arguments(parser)`` declares its arguments, ``run(args)``
    returns the exit code and may raise :class:`UsageError` (one line, exit 2) or
    :class:`CommandFailed` (one line, exit 1)."""
    _EXTRA[name] = (helptext, add_arguments, run)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        raise UsageError(message)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """``argv`` as ``run.py`` reads it (``run.py GRAPH ...`` is ``run.py run GRAPH ...``);
    a mistake raises :class:`UsageError`."""
    if argv and argv[0] not in COMMANDS and argv[0] not in _EXTRA and \
            not argv[0].startswith("-"):
        argv = ["run", *argv]  # `python run.py graph.yaml` is the main form
    return _parser().parse_args(argv)


# Shown by `run.py --help`; tests/test_docs_examples.py parses every line and runs the check.
EXAMPLES = """\
examples:
  run.py graphs/dqn_cartpole.yaml                       train: a progress line, then a summary
  run.py graphs/dqn_cartpole.yaml --set agent.algorithm.learning_rate=0.001 --seed 1
  run.py check graphs/dqn_cartpole.yaml                 check a graph; start nothing
  run.py status runs/dqn_cartpole/<time>                per-node state, or a finished run's end
  run.py monitor runs/dqn_cartpole/<time> --topic metrics   print a topic's messages
  run.py stop runs/dqn_cartpole/<time>                  stop it (as Ctrl-C does)
  run.py run --resume runs/dqn_cartpole/<time>          continue from its newest checkpoint
  run.py plot runs/dqn_cartpole/<time>                  returns against env steps and time

User mistakes print one line and exit 2; a run that fails exits 1 (docs/operations.md)."""


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="run.py", description="Conduit: RL training as a graph of processes.",
                epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", parser_class=_Parser)

    r = sub.add_parser("run", help="run a graph (also: run.py GRAPH)")
    r.add_argument("graph", nargs="?", help="graph YAML file")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a graph value, e.g. agent.algorithm.learning_rate=0.001 or "
                        "nodes.learner.config.mini_batch_size=128")
    r.add_argument("--seed", type=int, default=0, metavar="N",
                   help="add N to every node's seed: another run of the same graph (default 0: "
                        "the seeds as written)")
    r.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its checkpoint")
    r.add_argument("--run-dir", help="use this run directory instead of runs/<name>/<time>")
    r.add_argument("--quiet", action="store_true",
                   help="no progress line (the end-of-run block is printed still)")
    r.add_argument("--in-loop", action="store_true",
                   help="run every node as a task in this one process (debugging; no restarts)")
    r.set_defaults(func=cmd_run)

    c = sub.add_parser("check", help="check a graph as run would, start nothing; prints ok")
    c.add_argument("graph", help="graph YAML file")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a graph value, as for run")
    c.set_defaults(func=cmd_check)

    for name, helptext in [("status", "show per-node state (a finished run: its summary)"),
                           ("stop", "stop a run"),
                           ("checkpoint", "ask the checkpointer for a checkpoint now")]:
        s = sub.add_parser(name, help=helptext)
        s.add_argument("run_dir")
        s.add_argument("--json", action="store_true", help="print raw JSON")
        s.set_defaults(func=cmd_control_simple)

    s = sub.add_parser("restart", help="restart a node (make-before-break)")
    s.add_argument("run_dir")
    s.add_argument("node")
    s.set_defaults(func=cmd_restart)

    s = sub.add_parser("swap", help="replace a node's config or kind while the run goes on")
    s.add_argument("run_dir")
    s.add_argument("node")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config key of the node to change")
    s.add_argument("--kind", help="new node kind")
    s.set_defaults(func=cmd_swap)

    s = sub.add_parser("scale", help="change a node's replica count")
    s.add_argument("run_dir")
    s.add_argument("node")
    s.add_argument("replicas", type=int)
    s.set_defaults(func=cmd_scale)

    m = sub.add_parser("monitor", help="watch a live run (a finished run: its summary)")
    m.add_argument("run_dir")
    m.add_argument("--topic", action="append", default=[], help="print messages of a topic")
    m.add_argument("--interval", type=float, default=2.0)
    m.add_argument("--count", type=int, default=0, help="stop after N refreshes/messages")
    m.set_defaults(func=cmd_monitor)

    pl = sub.add_parser("plot", help="plot returns of one or more runs to a PNG")
    pl.add_argument("run_dirs", nargs="+")
    pl.add_argument("--out", help="PNG path (default: RUN_DIR/returns.png)")
    pl.set_defaults(func=cmd_plot)

    for name, (helptext, add_arguments, run) in _EXTRA.items():
        e = sub.add_parser(name, help=helptext)
        add_arguments(e)
        e.set_defaults(func=run)
    return p


# --- run ---------------------------------------------------------------------------------------


def cmd_run(args) -> int:
    from pipeline import graph as graphlib

    if args.resume:
        run_dir = args.resume
        graph_path = os.path.join(run_dir, "graph.yaml")
        if not os.path.exists(graph_path):
            raise UsageError(f"{run_dir}: not a run directory (no graph.yaml)")
        if args.graph:
            raise UsageError("give either GRAPH or --resume RUN_DIR, not both")
        if args.seed:
            raise UsageError("--seed starts another run; a resumed run keeps the seeds in its "
                             "graph.yaml")
    elif not args.graph:
        raise UsageError("missing GRAPH (a YAML file), e.g. python run.py graphs/demo_counter.yaml")
    else:
        graph_path = args.graph
    try:
        graph = graphlib.load(graph_path, args.set, args.seed)
    except graphlib.GraphError as exc:
        raise UsageError(str(exc)) from None
    if not args.resume:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")[:-3]
        run_dir = args.run_dir or os.path.join(graph.run.directory, graph.name, stamp)
    _own_run_dir(run_dir)
    resume, checked = None, {}
    if args.resume:
        from pipeline.wiring import latest_checkpoint

        resume = latest_checkpoint(run_dir, lambda line: print(f"warning: {line}",
                                                               file=sys.stderr), checked)
    try:
        with open(os.path.join(run_dir, "graph.yaml"), "w") as f:
            yaml.safe_dump(graph.raw, f, sort_keys=False)
    except OSError as exc:
        raise CommandFailed(f"cannot write to run directory {run_dir}: {exc}") from None
    if args.in_loop:
        return _run_in_loop(graph, run_dir)
    return _supervise(graph, run_dir, resume, quiet=args.quiet, checked=checked)


def cmd_check(args) -> int:
    from pipeline.graph import check_command

    return check_command([args.graph, *(a for item in args.set for a in ("--set", item))])


def _run_in_loop(graph, run_dir: str) -> int:
    import uvloop

    from pipeline.inloop import run_graph

    _new_secret(run_dir)  # the bus checks it on consumer-group joins here too
    print(f"run directory: {run_dir} (in one process)", file=sys.stderr)
    try:
        summaries = uvloop.run(run_graph(graph, run_dir))
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(summaries, indent=1, default=str))
    return EXIT_OK


_run_dir_lock: int | None = None  # held (never closed) for as long as this process runs
SECRET_ENV = "CONDUIT_RUN_SECRET"  # every node process of a run has it (consumer-group joins)
SECRET_FILE = "secret"


def _new_secret(run_dir: str) -> str:
    """A fresh random secret for this run: written to RUN_DIR/secret (mode 0600) for
    ``run.py`` clients, and put in the environment every node process inherits."""
    import secrets

    secret = secrets.token_hex(32)
    path = os.path.join(run_dir, SECRET_FILE)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)  # it may have existed with other bits
            os.write(fd, secret.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        raise CommandFailed(f"cannot write {path}: {exc.strerror or exc}") from None
    os.environ[SECRET_ENV] = secret
    return secret


def read_secret(run_dir: str) -> str | None:
    try:
        with open(os.path.join(run_dir, SECRET_FILE)) as f:
            return f.read().strip()
    except OSError:
        return None


def _own_run_dir(run_dir: str) -> None:
    """Create the run directory if needed and take its lock, or refuse in one line.

    The lock is an ``flock`` on ``RUN_DIR/.lock``: the kernel drops it when the process that
    holds it (and the fork server and nodes, which inherit it) are gone, so a run killed with
    SIGKILL never leaves a stale lock, and a second ``run.py`` on a live run (fresh or
    ``--resume``) stops before it touches anything of it, sockets included."""
    global _run_dir_lock
    import fcntl

    holder = ""
    try:
        os.makedirs(run_dir, exist_ok=True)
        fd = os.open(os.path.join(run_dir, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise CommandFailed(f"cannot use run directory {run_dir}: {exc.strerror or exc}"
                            f"{f' ({exc.filename})' if exc.filename else ''}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        # The run.py that holds it is gone (e.g. killed with SIGKILL): the holders left are its
        # nodes, which the kernel is killing (they die with their parent). Wait for them.
        if holder.isdigit() and _gone(int(holder)) and _wait_for_lock(fd, LOCK_WAIT_S):
            holder = ""
    if holder:
        os.close(fd)
        raise UsageError(f"run directory {run_dir} is in use by another run.py (pid "
                         f"{holder}); stop that run or choose another directory") from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError as exc:
        raise CommandFailed(f"cannot write to run directory {run_dir}: {exc}") from None
    _run_dir_lock = fd


LOCK_WAIT_S = 10.0  # for the nodes of a killed run.py to be gone


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie has exited
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _wait_for_lock(fd: int, timeout_s: float) -> bool:
    """Block in flock until the lock is ours or ``timeout_s`` passed (an interval timer
    interrupts the wait)."""
    import fcntl
    import signal

    def expire(*_):
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    except TimeoutError:
        return False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _supervise(graph, run_dir: str, resume: str | None, quiet: bool,
               checked: dict | None = None) -> int:
    import logging

    import uvloop

    from pipeline import diskio, forkserver
    from pipeline.supervisor import Supervisor

    secret = _new_secret(run_dir)
    # Now, while every node kind is imported (graph validation did it) and before the event
    # loop or any ZeroMQ context exists: nodes will be forks of this state.
    server = forkserver.start()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s",
                        handlers=[diskio.QuietFileHandler(os.path.join(run_dir, "supervisor.log"))])
    print(f"run directory: {run_dir}", file=sys.stderr)
    if resume:
        print(f"resuming from {resume}", file=sys.stderr)

    async def go() -> int:
        sup = Supervisor(graph, run_dir, resume=resume, forkserver=server, checked=checked,
                         secret=secret)
        code = await sup.run(progress=None if quiet else _progress)
        _print_end(sup, run_dir)
        return code

    try:
        return uvloop.run(go())
    except Exception as exc:  # noqa: BLE001 - one line on the terminal, the traceback in the log
        logging.getLogger("pipeline.supervisor").error("the supervisor failed", exc_info=exc)
        print(f"\nerror: the supervisor failed: {type(exc).__name__}: {exc} (traceback in "
              f"{os.path.join(run_dir, 'supervisor.log')})", file=sys.stderr)
        return EXIT_FAILED


def _print_end(sup, run_dir: str) -> None:
    """The end-of-run block (why it ended, best return and policy, env steps, wall time);
    a failed run's last line says why it failed, for scripts that read the last line."""
    from pipeline.monitor import format_summary

    if sup.summary is not None:
        print("\n" + format_summary(sup.summary), file=sys.stderr)
    else:  # summary.json could not be made: say at least how it ended
        print(f"\nrun ended ({sup.ended_by}): {run_dir}", file=sys.stderr)
    if sup.failure:
        print(f"error: {sup.failure}", file=sys.stderr)


PROGRESS_S, PROGRESS_LOG_EVERY = 1.0, 10  # refreshed in place; every 10th to a file or pipe


async def _progress(sup) -> None:
    """The progress line (:class:`pipeline.monitor.Progress`): rewritten in place every
    second on a terminal; when stderr is a file or a pipe, a new line every 10 s (measured
    every second all the same, so the first one has a rate)."""
    from pipeline.monitor import WIDTH, Progress

    tty = sys.stderr.isatty()
    run = sup.graph.run
    # duration_s gives the ETA only where reaching it is how the run ends, not a failure.
    budget = run.duration_s if run.on_duration == "stop" or not run.stop_when else None
    progress = Progress(budget)
    ticks = 0
    while True:
        await asyncio.sleep(PROGRESS_S)  # a display period
        line = progress.line(await sup.status(), ending=sup.ended_by is not None)
        ticks += 1
        if tty:
            try:
                columns = os.get_terminal_size(sys.stderr.fileno()).columns
            except OSError:
                columns = 0
            width = min(WIDTH, columns - 1) if columns > 1 else WIDTH  # 0: size unknown
            print("\r" + line[:width].ljust(width), end="", file=sys.stderr, flush=True)
        elif ticks % PROGRESS_LOG_EVERY == 0:
            print(line[:WIDTH], file=sys.stderr, flush=True)


# --- control commands -----------------------------------------------------------------------


def control(run_dir: str, command: str, timeout: float = 120.0, **kwargs) -> dict:
    """Send one command to a run's supervisor; return its result.

    Raises UsageError for a request the supervisor refused as wrong, CommandFailed when it
    could not carry it out or did not answer within ``timeout`` seconds (it answers before
    that, with code ``timeout``, if the command is still going on)."""
    import zmq

    from pipeline import codec
    from pipeline.messages import ControlRequest

    info_path = os.path.join(run_dir, "endpoints.json")
    try:
        with open(info_path) as f:
            info = json.load(f)
    except (OSError, ValueError):
        raise UsageError(f"{run_dir}: not a run directory with a live supervisor "
                         f"(no endpoints.json)") from None
    if not _is_live(run_dir):
        raise UsageError(f"{run_dir}: no live run (it ended or was killed; "
                         f"`run.py run --resume {run_dir}` continues it)")
    from pipeline import curve

    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        keys = curve.operator(run_dir) if str(info["control"]).startswith("tcp://") else None
        if keys is not None:  # tcp with CURVE: the run's operator key (RUN_DIR/keys, 0600)
            curve.make_client(sock, keys)
        sock.connect(info["control"])
        args = {**kwargs, "_timeout_s": timeout, "_secret": read_secret(run_dir)}
        sock.send_multipart(codec.encode(ControlRequest(command, args), "cli"))
        # Wait for the reply in slices: a run that ends meanwhile (its supervisor releases the
        # run directory's lock) never answers, and the client should say so at once instead of
        # waiting out a timeout of up to 600 s.
        deadline = time.monotonic() + timeout
        while not sock.poll(500):
            if not _is_live(run_dir):
                raise CommandFailed(f"{run_dir}: the run ended before it answered {command!r}")
            if time.monotonic() > deadline:
                raise CommandFailed(f"{run_dir}: supervisor did not answer {command!r} within "
                                    f"{timeout:.0f}s (is the run still going?)")
        reply = codec.decode(sock.recv_multipart()).message
    finally:
        sock.close(linger=0)
    if not reply.ok:
        code = reply.result.get("code", "internal")
        if code in USAGE_CODES:
            raise UsageError(f"{command}: {reply.reason}")
        raise CommandFailed(f"{command}: {reply.reason} ({code})")
    return reply.result


def _is_live(run_dir: str) -> bool:
    """Whether a run holds the run directory's lock (a directory without one is taken to be
    live: it may come from a version that did not lock)."""
    import fcntl

    try:
        fd = os.open(os.path.join(run_dir, ".lock"), os.O_RDONLY)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def finished_summary(run_dir: str) -> dict | None:
    """A run that ended: its ``summary.json``; None while it runs or if it has none."""
    if _is_live(run_dir):
        return None
    try:
        with open(os.path.join(run_dir, "summary.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _show_finished(summary: dict, as_json: bool = False) -> int:
    from pipeline.monitor import format_summary

    if as_json:
        print(json.dumps(summary, indent=1))
    else:
        print(format_summary(summary))
        print(format_status(summary, ended=True))
    return EXIT_OK


def cmd_control_simple(args) -> int:
    if args.command == "status":
        summary = finished_summary(args.run_dir)
        if summary is not None:
            return _show_finished(summary, args.json)
    result = control(args.run_dir, args.command, timeout=10 if args.command == "status" else 600)
    if args.command == "status" and not args.json:
        print(format_status(result))
    elif args.command == "checkpoint" and not args.json:
        print(result["path"])
    else:
        print(json.dumps(result, indent=1))
    return EXIT_OK


def format_status(status: dict, ended: bool = False) -> str:
    lines = [f"graph {status['graph']}  {'ran' if ended else 'up'} {status['uptime_s']}s  "
             f"{status['run_dir']}"]
    for instance, info in status["nodes"].items():
        counters = " ".join(f"{k}={v}" for k, v in (info.get("status") or {}).items())
        lines.append(f"  {instance:<22} {info['state']:<10} pid={info['pid']} "
                     f"restarts={info['restarts']} {counters}")
        for topic, stats in (info.get("topics") or {}).items():
            if stats:
                lines.append(f"      {topic:<24} " + " ".join(f"{k}={v}" for k, v in
                                                             stats.items()))
    return "\n".join(lines)


def cmd_restart(args) -> int:
    print(json.dumps(control(args.run_dir, "restart", node=args.node, timeout=600)))
    return EXIT_OK


def cmd_swap(args) -> int:
    for item in args.set:
        if "=" not in item:
            raise UsageError(f"--set expects key=value, got {item!r}")
    result = control(args.run_dir, "swap", node=args.node, kind=args.kind, set=args.set,
                     timeout=600)
    print(json.dumps(result))
    return EXIT_OK


def cmd_scale(args) -> int:
    print(json.dumps(control(args.run_dir, "scale", node=args.node, replicas=args.replicas,
                             timeout=600)))
    return EXIT_OK


def cmd_monitor(args) -> int:
    from pipeline.monitor import monitor

    summary = finished_summary(args.run_dir)
    if summary is None:
        try:
            return monitor(args.run_dir, topics=args.topic, interval=args.interval,
                           count=args.count, control=control)
        except (UsageError, CommandFailed):
            summary = finished_summary(args.run_dir)  # it ended while we watched
            if summary is None:
                raise
    return _show_finished(summary)


def cmd_plot(args) -> int:
    from pipeline.plot import plot_runs

    for run_dir in args.run_dirs:
        if not os.path.isdir(run_dir):
            raise UsageError(f"{run_dir}: no such run directory")
    out = args.out or os.path.join(args.run_dirs[0], "returns.png")
    try:
        plot_runs(args.run_dirs, out)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(out)
    return EXIT_OK
