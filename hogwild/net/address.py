"""Addresses of hogwild's servers, and the rule that only loopback may be bound without keys.

Users write a server's address as ``HOST:PORT`` (``127.0.0.1:5570``, ``[::1]:5570``,
``ps-3.example:5570``); code may also pass a ZeroMQ endpoint as it is (``tcp://...``,
``ipc:///path``, ``inproc://name``). :func:`parse_address` turns either into an
:class:`Address`, whose :attr:`~Address.endpoint` is what ``bind``/``connect`` take.

Binding policy (:func:`check_bind`): a server binds ``127.0.0.1`` unless told otherwise; ``ipc``
and ``inproc`` never leave the machine; any other TCP address (a wildcard like ``0.0.0.0``, a
public interface) is refused unless CURVE keys are given, with a message saying how to make them.
Clients follow the same rule (:func:`check_connect`): a request to a server beyond loopback
without keys would cross the network in the clear, so it is never sent.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from hogwild.errors import HogwildError

__all__ = [
    "LOOPBACK",
    "Address",
    "AddressError",
    "InsecureBindError",
    "check_bind",
    "check_connect",
    "is_loopback",
    "parse_address",
]

LOOPBACK = "127.0.0.1"
TRANSPORTS = ("tcp", "ipc", "inproc")


class AddressError(HogwildError, ValueError):
    """An address that is not ``HOST:PORT`` or a ZeroMQ endpoint."""


class InsecureBindError(HogwildError):
    """A server asked to listen beyond loopback without CURVE keys."""


@dataclass(frozen=True)
class Address:
    """A server address.

    Attributes:
        transport: ``tcp``, ``ipc`` or ``inproc``.
        host: The host (tcp), or the path / name (ipc, inproc).
        port: The TCP port (0: any free port, when binding); 0 for ipc and inproc.
    """

    transport: str
    host: str
    port: int = 0

    @property
    def endpoint(self) -> str:
        """The ZeroMQ endpoint (``tcp://127.0.0.1:5570``)."""
        if self.transport != "tcp":
            return f"{self.transport}://{self.host}"
        return f"tcp://{host_port(self.host, self.port)}"

    def __str__(self) -> str:
        return host_port(self.host, self.port) if self.transport == "tcp" else self.endpoint

    def with_port(self, port: int) -> Address:
        return Address(self.transport, self.host, port)


def host_port(host: str, port: int | str) -> str:
    """``HOST:PORT``, an IPv6 host in brackets (``[::1]:5570``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(text: str, default_port: int | None = None) -> Address:
    """``HOST:PORT``, ``[IPv6]:PORT``, ``tcp://HOST:PORT``, ``ipc://PATH`` or ``inproc://NAME``.

    Args:
        default_port: The port when ``text`` is a bare host (None: a port is required).

    Raises:
        AddressError: Anything else, naming the text and what was expected.
    """
    if not isinstance(text, str) or not text.strip():
        raise AddressError(f"address {text!r}: expected HOST:PORT")
    text = text.strip()
    if "://" in text:
        transport, _, rest = text.partition("://")
        if transport not in TRANSPORTS:
            raise AddressError(
                f"address {text!r}: transport {transport!r}, expected one of {TRANSPORTS}"
            )
        if transport != "tcp":
            if not rest:
                raise AddressError(f"address {text!r}: no path or name after {transport}://")
            return Address(transport, rest)
        text = rest
    host, port = _split_host_port(text, default_port)
    return Address("tcp", host, port)


def _split_host_port(text: str, default_port: int | None) -> tuple[str, int]:
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep:
            raise AddressError(f"address {text!r}: unclosed '[' around an IPv6 host")
        port_text = rest[1:] if rest.startswith(":") else None
        if rest and not rest.startswith(":"):
            raise AddressError(f"address {text!r}: expected [HOST]:PORT")
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    elif ":" in text:
        raise AddressError(f"address {text!r}: an IPv6 host must be written [HOST]:PORT")
    else:
        host, port_text = text, None
    if not host:
        raise AddressError(f"address {text!r}: no host")
    if port_text is None:
        if default_port is None:
            raise AddressError(f"address {text!r}: expected HOST:PORT (no port given)")
        return host, default_port
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise AddressError(f"address {text!r}: port {port_text!r} is not a number in 0..65535")
    return host, int(port_text)


def is_loopback(address: Address) -> bool:
    """True when the address cannot be reached from another machine."""
    if address.transport != "tcp":
        return True
    if address.host == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.host).is_loopback
    except ValueError:
        return False  # a name or an interface: it may resolve anywhere


def check_bind(address: Address, keys: str | None) -> None:
    """Refuse to bind beyond loopback without CURVE keys.

    Raises:
        InsecureBindError: ``address`` is reachable from other machines and ``keys`` is empty.
    """
    if keys or is_loopback(address):
        return
    raise InsecureBindError(
        f"refusing to bind {address}: it is reachable from other machines and the parameter "
        "server's traffic would be neither authenticated nor encrypted. Make CURVE keys with "
        "`hogwild ps keys DIR`, copy DIR to every machine of the job, and pass --keys DIR (or set "
        f"ps.keys); or bind {LOOPBACK}"
    )


def check_connect(address: Address, keys: str | None) -> None:
    """Refuse to connect beyond loopback without CURVE keys.

    Raises:
        InsecureBindError: ``address`` is on another machine (or may be) and ``keys`` is empty.
    """
    if keys or is_loopback(address):
        return
    raise InsecureBindError(
        f"refusing to connect to {address} without CURVE keys: the traffic would cross the "
        "network neither authenticated nor encrypted. Pass the job's key directory (--keys DIR "
        "or ps.keys), or connect over loopback"
    )
