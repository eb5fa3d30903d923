"""Free TCP ports: for servers whose addresses must be known before they start.

A parameter server is told the whole server list (the bucket map) and an etcd its peers' URLs,
so their ports are chosen first: the kernel names a port free right now (bind to port 0, read it
back, close). Nothing holds it afterwards, so another process may take it before the server
binds; every caller that starts a server on such a port retries on "address already in use".
This is the one place the engine, its plugins and their tests ask for one.
"""

from __future__ import annotations

import socket

__all__ = ["free_port", "free_ports"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` (an address of this machine, IPv4 or IPv6) right now."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports free on ``host`` right now (:func:`free_port` may name a port
    twice in a row)."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port(host)
        if port not in ports:
            ports.append(port)
    return ports
