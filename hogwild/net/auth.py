"""CURVE keys: authentication and encryption of hogwild's ZeroMQ traffic beyond loopback.

ZeroMQ's CURVE mechanism (CurveZMQ: Curve25519 key exchange, then authenticated encryption of
every frame) secures a connection when the server knows its secret key and the client knows the
server's public key; pyzmq's :class:`~zmq.auth.thread.ThreadAuthenticator` (the ZAP handler)
then admits only clients whose public keys are in an authorised directory.

A key directory, made by :func:`make_keys` (``hogwild ps keys DIR``), holds::

    DIR/server.key          the server's public key      (clients need it)
    DIR/server.key_secret   the server's key pair        (servers only)
    DIR/client.key          a client's public key
    DIR/client.key_secret   the client's key pair        (clients only)
    DIR/authorized/         public keys the servers admit (client.key to start with)

Copy DIR to every machine of the job (keep the ``*_secret`` files private: they are created
mode 0600). To admit another client, put its public key file into ``authorized/``.

**A key pair per role** (the layout ``hogwild cluster`` makes for a job beyond loopback): every
role makes its own key pair where it runs (:func:`make_identity`: a secret file that never
leaves its node) and only public keys travel. The job's *roster*, ``DIR/roster.json``, names
each role's public key and, once known, the address it serves on::

    {"roles": {"ps 0": {"key": "Z85...", "address": "10.0.0.1:5570"}, "replica 0": {...}}}

A process learns which key pair is its own from :func:`use_identity` or the environment
(:data:`IDENTITY_ENV`: the path of its ``.key_secret`` file). In that layout a server admits
exactly the roster's keys (read again whenever the file changes, as roles join), ZeroMQ tags
every message with its sender's role name (the ZAP handler's User-Id, read per message with
:func:`sender_role`), so a server can check what a role may send; a client takes the public key
of the server it connects to from the roster entry at that address.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import zmq
import zmq.auth
from zmq.utils import z85

from hogwild.errors import HogwildError
from hogwild.net.address import AddressError, parse_address

if TYPE_CHECKING:  # imported where a server is secured: it loads asyncio, which most roles skip
    from zmq.auth.thread import ThreadAuthenticator

__all__ = [
    "IDENTITY_ENV",
    "ROSTER",
    "KeysError",
    "ServerSecurity",
    "has_roster",
    "identity_path",
    "make_identity",
    "make_keys",
    "read_roster",
    "secure_client",
    "secure_server",
    "sender_role",
    "use_identity",
    "write_roster",
]

SERVER, CLIENT, AUTHORIZED = "server", "client", "authorized"
ROSTER = "roster.json"
IDENTITY_ENV = "HOGWILD_KEY"
"""The environment variable naming this process's own secret key file (a role's identity)."""
MAX_ROSTER_BYTES = 1 << 20
ROLE_NAME = re.compile(r"[a-z]+( [0-9]+)?")  # "ps 0", "replica 3", "driver"
Z85_KEY = re.compile(r"[0-9A-Za-z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")
_identity: Path | None = None


class KeysError(HogwildError):
    """A key directory is missing, incomplete or unreadable."""


def make_keys(directory: str | os.PathLike) -> Path:
    """Create a key directory (server and client key pairs, the client authorised).

    Raises:
        KeysError: ``directory`` already holds keys (they are never overwritten).
    """
    root = Path(directory)
    if root.exists() and not root.is_dir():
        raise KeysError(f"{root}: exists and is not a directory; give a directory for the keys")
    existing = [p.name for p in (root / f"{SERVER}.key", root / f"{CLIENT}.key") if p.exists()]
    if existing:
        raise KeysError(
            f"{root}: already holds keys ({', '.join(existing)}); keys are never overwritten, "
            "choose another directory or remove this one"
        )
    try:
        root.mkdir(parents=True, exist_ok=True)
        for name in (SERVER, CLIENT):
            public, secret = zmq.curve_keypair()
            _write_certificate(root / f"{name}.key", public, None, 0o644)
            _write_certificate(root / f"{name}.key_secret", public, secret, 0o600)
        (root / AUTHORIZED).mkdir(exist_ok=True)
        shutil.copyfile(root / f"{CLIENT}.key", root / AUTHORIZED / f"{CLIENT}.key")
    except OSError as exc:
        raise KeysError(f"{root}: cannot write keys there ({exc.strerror or exc})") from None
    return root


def _write_certificate(path: Path, public: bytes, secret: bytes | None, mode: int) -> None:
    """A ZeroMQ certificate file (the format :func:`zmq.auth.load_certificate` reads), created
    with ``mode`` from the start: a secret is never readable by others, not even for a moment
    (a chmod after creating it would leave that moment). An existing file is never replaced."""
    lines = ["#   ZeroMQ CURVE certificate (hogwild ps keys)", "metadata", "curve",
             f'    public-key = "{public.decode("ascii")}"']  # fmt: skip
    if secret is not None:
        lines.insert(1, "#   secret: keep it private (mode 0600)")
        lines.append(f'    secret-key = "{secret.decode("ascii")}"')
    handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(handle, "w", encoding="ascii") as out:
        out.write("\n".join(lines) + "\n")


def _load(path: Path, secret: bool) -> tuple[bytes, bytes | None]:
    if not path.is_file():
        raise KeysError(
            f"{path}: missing; make a key directory with `hogwild ps keys DIR` and pass it "
            "with --keys DIR (or ps.keys)"
        )
    try:
        public, secret_key = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise KeysError(f"{path}: not a ZeroMQ certificate ({exc})") from exc
    if secret and secret_key is None:
        raise KeysError(f"{path}: holds no secret key")
    return public, secret_key


# -- a key pair per role ---------------------------------------------------------------------


def make_identity(directory: str | os.PathLike, role: str) -> tuple[Path, str]:
    """Make ``role``'s own key pair in ``directory`` (created mode 0700), where the role runs;
    the secret file's path and the public key (Z85 text, the only part that travels). An
    existing key pair of the role is kept (a restarted role is the same role).

    Raises:
        KeysError: A bad role name, or the directory cannot be written.
    """
    _check_role(role, "role")
    root = Path(directory)
    path = root / f"{role.replace(' ', '-')}.key_secret"
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not path.exists():
            public, secret = zmq.curve_keypair()
            _write_certificate(path, public, secret, 0o600)
    except OSError as exc:
        raise KeysError(f"{root}: cannot write {role}'s key pair there ({exc})") from None
    public, _ = _load(path, secret=True)
    return path, public.decode("ascii")


def use_identity(path: str | os.PathLike | None) -> None:
    """This process's own key pair from now on (its ``.key_secret`` file); None: the
    environment's (:data:`IDENTITY_ENV`)."""
    global _identity
    _identity = Path(path) if path else None


def identity_path() -> Path:
    """This process's own secret key file.

    Raises:
        KeysError: None was given (a role of a job with a roster must have one).
    """
    chosen = _identity or (Path(os.environ[IDENTITY_ENV]) if os.environ.get(IDENTITY_ENV) else None)
    if chosen is None:
        raise KeysError(
            f"this key directory holds a roster ({ROSTER}: a key pair per role), and this "
            f"process has no key pair of its own; set {IDENTITY_ENV} to its .key_secret file"
        )
    return chosen


def has_roster(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` is a job's key directory of one key pair per role."""
    return (Path(directory) / ROSTER).is_file()


def _check_role(name, what: str) -> None:
    if not isinstance(name, str) or not ROLE_NAME.fullmatch(name):
        raise KeysError(f"{what} {name!r}: expected a role name such as 'ps 0' or 'driver'")


def read_roster(directory: str | os.PathLike) -> dict[str, dict]:
    """The roster's roles: name -> ``{"key": Z85 public key, "address": "HOST:PORT" or ""}``,
    every field checked (a roster may come from another node).

    Raises:
        KeysError: A missing, oversized or malformed roster, naming what is wrong.
    """
    path = Path(directory) / ROSTER
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_ROSTER_BYTES + 1)
    except OSError as exc:
        raise KeysError(f"{path}: cannot read the job's roster ({exc.strerror or exc})") from None
    if len(raw) > MAX_ROSTER_BYTES:
        raise KeysError(f"{path}: larger than {MAX_ROSTER_BYTES} bytes; not a roster")
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise KeysError(f"{path}: not JSON ({exc})") from None
    roles = data.get("roles") if isinstance(data, dict) else None
    if not isinstance(roles, dict):
        raise KeysError(f'{path}: expected {{"roles": {{NAME: {{"key": ..., "address": ...}}}}}}')
    checked = {}
    for name, entry in roles.items():
        _check_role(name, f"{path}: role")
        if not isinstance(entry, dict) or not Z85_KEY.fullmatch(str(entry.get("key", ""))):
            raise KeysError(f"{path}: role {name!r}: expected a 40-character Z85 public key")
        address = entry.get("address", "")
        if not isinstance(address, str) or len(address) > 300:
            raise KeysError(f"{path}: role {name!r}: address {address!r} is not HOST:PORT")
        checked[name] = {"key": entry["key"], "address": address}
    return checked


def write_roster(directory: str | os.PathLike, roles: dict[str, dict]) -> Path:
    """Write the roster (public keys and addresses only) whole: a reader never sees half."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    for name, entry in roles.items():
        _check_role(name, "role")
        if not Z85_KEY.fullmatch(entry["key"]):
            raise KeysError(f"role {name!r}: {entry['key']!r} is not a Z85 public key")
    path = root / ROSTER
    temporary = root / f".{ROSTER}.{os.getpid()}.tmp"
    temporary.write_text(json.dumps({"roles": roles}, sort_keys=True))
    temporary.replace(path)
    return path


def sender_role(frame: zmq.Frame) -> str:
    """The role that sent ``frame`` (its key's name in the roster), as the server's ZAP handler
    named it when the connection was authenticated; ``""`` where there is no roster."""
    try:
        return frame.get("User-Id")
    except zmq.ZMQError:
        return ""


@dataclass
class _Roster:
    """The roster as the ZAP handler sees it: reread when the file changes (roles join)."""

    directory: Path
    roles: dict[str, str] = field(default_factory=dict)  # Z85 key -> role name
    stamp: tuple = ()
    lock: threading.Lock = field(default_factory=threading.Lock)

    def role(self, z85_key: str) -> str | None:
        with self.lock:
            try:
                found = (self.directory / ROSTER).stat()
                stamp = (found.st_mtime_ns, found.st_size, found.st_ino)
            except OSError:
                stamp = ()
            if stamp != self.stamp:
                try:
                    roster = read_roster(self.directory)
                    self.roles = {e["key"]: name for name, e in roster.items()}
                except KeysError:
                    pass  # a broken roster admits what the last good one did
                self.stamp = stamp
            return self.roles.get(z85_key)

    def callback(self, domain, key: bytes) -> bool:  # pyzmq's credentials provider
        return self.role(key.decode("ascii")) is not None


@cache
def _roster_authenticator() -> type:
    """pyzmq's ZAP handler admitting the roster's keys, each named by its role (the User-Id):
    a class made once, where a server is secured (pyzmq's authenticator thread loads asyncio)."""
    from zmq.auth.thread import ThreadAuthenticator

    class RosterAuthenticator(ThreadAuthenticator):
        def __init__(self, context: zmq.Context, roster: _Roster) -> None:
            super().__init__(context)
            self.roster = roster

        def curve_user_id(self, client_public_key: bytes) -> str:
            return self.roster.role(z85.encode(client_public_key).decode("ascii")) or ""

    return RosterAuthenticator


@dataclass
class ServerSecurity:
    """A server socket's CURVE setup; :meth:`close` stops its authenticator thread.
    ``roles``: the clients are the roster's roles, each message tagged with its sender's."""

    authenticator: ThreadAuthenticator
    authorized: Path
    roles: bool = False

    def close(self) -> None:
        self.authenticator.stop()


def secure_server(
    context: zmq.Context, socket: zmq.Socket, directory: str | os.PathLike
) -> ServerSecurity:
    """Make ``socket`` (before it binds) a CURVE server admitting the authorised clients only:
    with a roster, exactly the job's roles, with this process's own key pair.

    Raises:
        KeysError: The server's key pair or the ``authorized`` directory is missing.
    """
    root = Path(directory)
    if has_roster(root):
        read_roster(root)  # a broken roster is said now, not at the first client
        public, secret = _load(identity_path(), secret=True)
        roster = _Roster(root)
        authenticator = _roster_authenticator()(context, roster)
        authenticator.start()
        authenticator.configure_curve_callback(domain="*", credentials_provider=roster)
        socket.curve_secretkey, socket.curve_publickey = secret, public
        socket.curve_server = True
        return ServerSecurity(authenticator, root / ROSTER, roles=True)
    public, secret = _load(root / f"{SERVER}.key_secret", secret=True)
    authorized = root / AUTHORIZED
    if not authorized.is_dir() or not any(authorized.glob("*.key")):
        raise KeysError(
            f"{authorized}: no authorised client keys; `hogwild ps keys DIR` makes one, or copy "
            "a client's public .key file there"
        )
    from zmq.auth.thread import ThreadAuthenticator

    authenticator = ThreadAuthenticator(context)
    authenticator.start()
    authenticator.configure_curve(domain="*", location=str(authorized))
    socket.curve_secretkey = secret
    socket.curve_publickey = public
    socket.curve_server = True
    return ServerSecurity(authenticator, authorized)


def secure_client(
    socket: zmq.Socket, directory: str | os.PathLike, endpoint: str = "", role: str = ""
) -> None:
    """Make ``socket`` (before it connects) a CURVE client of the directory's server; with a
    roster, of the role serving at ``endpoint`` (a ZeroMQ endpoint), or of ``role`` where it is
    named (a role serving a second socket besides the address the roster has: a partitioned
    replica's link), with this process's own key pair.

    Raises:
        KeysError: The client's key pair or the server's public key is missing.
    """
    root = Path(directory)
    if has_roster(root):
        if role:
            entry = read_roster(root).get(role)
            if entry is None:
                raise KeysError(f"{root / ROSTER}: no role {role!r}; its public key is not known")
            server_public = entry["key"].encode("ascii")
        else:
            server_public = _server_key(root, endpoint).encode("ascii")
        public, secret = _load(identity_path(), secret=True)
    else:
        server_public, _ = _load(root / f"{SERVER}.key", secret=False)
        public, secret = _load(root / f"{CLIENT}.key_secret", secret=True)
    socket.curve_secretkey = secret
    socket.curve_publickey = public
    socket.curve_serverkey = server_public


def _server_key(root: Path, endpoint: str) -> str:
    for entry in read_roster(root).values():
        try:
            if entry["address"] and parse_address(entry["address"]).endpoint == endpoint:
                return entry["key"]
        except AddressError:
            continue
    raise KeysError(
        f"{root / ROSTER}: no role of the job serves at {endpoint or 'this address'}; its "
        "public key is not known, so the connection could not be authenticated"
    )
