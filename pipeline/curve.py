"""CurveZMQ for the tcp transport: the run's key pairs, and who may connect.

Why: over tcp anyone who can reach a port could subscribe to experience, join a consumer group
or send control requests. With CURVE every tcp connection is encrypted and each side proves it
holds a key of this run.

Keys (made by the supervisor at the start of a run, reused on ``--resume``), all in
``RUN_DIR/keys/`` (mode 0700), one JSON file each (mode 0600):

* ``run.key``: the run's *server* key pair. Every socket that binds (topics, taps, services,
  the supervisor's control and events) is a CURVE server with it, so a client needs only one
  server public key, handed out in the launch spec.
* ``node-<name>.key``: one *client* key pair per graph node (its replicas and restarts share
  it, so the set of keys is fixed for the run); ``supervisor.key``; ``operator.key`` for
  ``run.py`` commands and monitors run by the run directory's owner.

A launch spec carries the public keys and the *paths* of the secret key files, never a secret
key: a node reads its secret keys from the (shared) run directory. Every process that binds
runs a ZAP handler (:class:`Gate`) that admits only the public keys the run made; a wrong key
is refused by the handler and logged, a client without CURVE fails the handshake and is logged
by a socket monitor. Neither reaches the node's code.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass

import zmq
import zmq.auth.thread

log = logging.getLogger(__name__)

KEY_DIR = "keys"
RUN_KEY, SUPERVISOR_KEY, OPERATOR_KEY = "run", "supervisor", "operator"


@dataclass(frozen=True)
class Curve:
    """The keys one process uses: as a client (its own pair and the run's server public key)
    and as a server (the run's pair), and the client public keys it admits."""

    public: bytes
    secret: bytes
    server_public: bytes
    server_secret: bytes | None
    authorized: frozenset

    def __repr__(self) -> str:  # never print a secret key (logs, tracebacks)
        return f"Curve(public={self.public.decode()}, {len(self.authorized)} authorized keys)"


def key_dir(run_dir: str) -> str:
    return os.path.join(run_dir, KEY_DIR)


def node_key_name(node: str) -> str:
    return f"node-{node}"


def _key_path(run_dir: str, name: str) -> str:
    return os.path.join(key_dir(run_dir), f"{name}.key")


def _write_private(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, json.dumps(data).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_pair(path: str) -> tuple[bytes, bytes]:
    """(public, secret) from a key file, as z85 bytes."""
    with open(path) as f:
        data = json.load(f)
    return data["public"].encode(), data["secret"].encode()


def ensure_keys(run_dir: str, nodes) -> dict:
    """Make the run's key files that do not exist yet (mode 0600 in a 0700 directory); return
    the public keys by name. ``nodes``: the graph's node names."""
    directory = key_dir(run_dir)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    publics = {}
    for name in (RUN_KEY, SUPERVISOR_KEY, OPERATOR_KEY, *map(node_key_name, nodes)):
        path = _key_path(run_dir, name)
        if not os.path.exists(path):
            public, secret = zmq.curve_keypair()
            _write_private(path, {"public": public.decode(), "secret": secret.decode()})
        publics[name] = read_pair(path)[0].decode()
    return publics


def launch_spec(run_dir: str, publics: dict, name: str) -> dict:
    """What a launch spec carries for the process using key ``name``: public keys and paths."""
    return {"public": publics[name], "secret_file": _key_path(run_dir, name),
            "server_public": publics[RUN_KEY], "server_secret_file": _key_path(run_dir, RUN_KEY),
            "authorized": sorted(v for k, v in publics.items() if k != RUN_KEY)}


def load(spec: dict) -> Curve:
    """The keys of a launch spec's ``curve`` entry, secret keys read from their files."""
    public, secret = read_pair(spec["secret_file"])
    if public.decode() != spec["public"]:
        raise ValueError(f"{spec['secret_file']} does not hold the key pair of the launch spec")
    server_secret = None
    if spec.get("server_secret_file"):
        server_public, server_secret = read_pair(spec["server_secret_file"])
        if server_public.decode() != spec["server_public"]:
            raise ValueError(f"{spec['server_secret_file']} is not the run's server key")
    return Curve(public, secret, spec["server_public"].encode(), server_secret,
                 frozenset(k.encode() for k in spec["authorized"]))


def operator(run_dir: str) -> Curve | None:
    """The operator's client keys for ``run.py`` commands and monitors; None if the run has
    no keys (ipc, or tcp with ``insecure``)."""
    path = _key_path(run_dir, OPERATOR_KEY)
    if not os.path.exists(path):
        return None
    public, secret = read_pair(path)
    server_public, _ = read_pair(_key_path(run_dir, RUN_KEY))
    return Curve(public, secret, server_public, None, frozenset())


def make_client(sock: zmq.Socket, curve: Curve) -> None:
    """Make ``sock`` a CURVE client of the run (before it connects)."""
    sock.setsockopt(zmq.CURVE_PUBLICKEY, curve.public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, curve.secret)
    sock.setsockopt(zmq.CURVE_SERVERKEY, curve.server_public)


# --- the server side ---------------------------------------------------------------------------


class _Keys:
    """pyzmq's credentials provider: admit a client key only if the run made it."""

    def __init__(self, authorized: frozenset):
        self.authorized = authorized
        self.refused = 0

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.authorized:
            return True
        self.refused += 1
        log.warning("refused a CURVE client with a key this run did not make (%s)",
                    key.decode(errors="replace"))
        return False


class Gate:
    """One per ZeroMQ context: the ZAP handler (a thread: it answers handshakes even while the
    node's event loop is busy) and the monitors that log failed handshakes."""

    _by_context: dict[int, Gate] = {}
    _lock = threading.Lock()

    def __init__(self, context: zmq.Context, authorized: frozenset):
        self.context = zmq.Context.shadow(context.underlying)
        self.keys = _Keys(authorized)
        self.auth = zmq.auth.thread.ThreadAuthenticator(self.context)
        self.auth.start()
        self.auth.configure_curve_callback(domain="*", credentials_provider=self.keys)
        self.failed_handshakes = 0
        self._monitors = 0

    @classmethod
    def of(cls, context: zmq.Context, authorized: frozenset) -> Gate:
        """The context's gate, started at its first CURVE server socket."""
        with cls._lock:
            gate = cls._by_context.get(context.underlying)
            if gate is None:
                gate = cls._by_context[context.underlying] = cls(context, authorized)
            return gate

    def watch(self, sock: zmq.Socket) -> None:
        """Log every handshake that fails on ``sock`` (no CURVE, wrong key, garbage)."""
        self._monitors += 1
        address = f"inproc://conduit-curve-monitor-{id(self)}-{self._monitors}"
        events = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL |
                  zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        sock.monitor(address, events)
        peer = self.context.socket(zmq.PAIR)
        peer.setsockopt(zmq.LINGER, 0)
        peer.connect(address)
        endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        threading.Thread(target=self._log_failures, args=(peer, endpoint), daemon=True,
                         name="curve-monitor").start()

    def _log_failures(self, peer: zmq.Socket, endpoint: str) -> None:
        from zmq.utils.monitor import parse_monitor_message

        try:
            while True:
                event = parse_monitor_message(peer.recv_multipart())
                self.failed_handshakes += 1
                log.warning("refused a connection to %s: handshake failed (%s, code %s)",
                            endpoint, zmq.Event(event["event"]).name, event["value"])
        except zmq.ZMQError:  # the socket or the context is closing
            pass
        finally:
            peer.close(linger=0)

    @classmethod
    def stop_all(cls) -> None:
        with cls._lock:
            gates, cls._by_context = list(cls._by_context.values()), {}
        for gate in gates:
            gate.auth.stop()
