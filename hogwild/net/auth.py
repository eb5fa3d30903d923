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
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from hogwild.errors import HogwildError

__all__ = ["KeysError", "ServerSecurity", "make_keys", "secure_client", "secure_server"]

SERVER, CLIENT, AUTHORIZED = "server", "client", "authorized"


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


@dataclass
class ServerSecurity:
    """A server socket's CURVE setup; :meth:`close` stops its authenticator thread."""

    authenticator: ThreadAuthenticator
    authorized: Path

    def close(self) -> None:
        self.authenticator.stop()


def secure_server(
    context: zmq.Context, socket: zmq.Socket, directory: str | os.PathLike
) -> ServerSecurity:
    """Make ``socket`` (before it binds) a CURVE server admitting the authorised clients only.

    Raises:
        KeysError: The server's key pair or the ``authorized`` directory is missing.
    """
    root = Path(directory)
    public, secret = _load(root / f"{SERVER}.key_secret", secret=True)
    authorized = root / AUTHORIZED
    if not authorized.is_dir() or not any(authorized.glob("*.key")):
        raise KeysError(
            f"{authorized}: no authorised client keys; `hogwild ps keys DIR` makes one, or copy "
            "a client's public .key file there"
        )
    authenticator = ThreadAuthenticator(context)
    authenticator.start()
    authenticator.configure_curve(domain="*", location=str(authorized))
    socket.curve_secretkey = secret
    socket.curve_publickey = public
    socket.curve_server = True
    return ServerSecurity(authenticator, authorized)


def secure_client(socket: zmq.Socket, directory: str | os.PathLike) -> None:
    """Make ``socket`` (before it connects) a CURVE client of the directory's server.

    Raises:
        KeysError: The client's key pair or the server's public key is missing.
    """
    root = Path(directory)
    server_public, _ = _load(root / f"{SERVER}.key", secret=False)
    public, secret = _load(root / f"{CLIENT}.key_secret", secret=True)
    socket.curve_secretkey = secret
    socket.curve_publickey = public
    socket.curve_serverkey = server_public
