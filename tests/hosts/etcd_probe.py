"""Clients of a job's etcd members from outside the job: plain HTTP, TLS without a certificate,
and the job's own client certificate (the control).

``python -m tests.hosts.etcd_probe CA CERT KEY ADDR...`` (run in a host) prints one JSON line:
for every member's client address, whether a plain-HTTP request got no etcd answer
(``plain_refused``), whether the member's certificate, checked against the job's ``CA``, names
the address it was reached at (``names_its_address``), whether a TLS client without a
certificate got no answer (``certless_refused``: the member ends the handshake), and whether one
with the job's certificate ``CERT``/``KEY`` was answered (``certified_answered``: the control, so
that a refusal is the certificates' doing and not a dead address).
"""

from __future__ import annotations

import argparse
import json
import socket
import ssl

from hogwild.net.address import parse_address

TIMEOUT_S = 2.0
REQUEST = (
    b"POST /v3/maintenance/status HTTP/1.1\r\nHost: etcd\r\nContent-Type: application/json\r\n"
    b"Content-Length: 2\r\nConnection: close\r\n\r\n{}"
)


def _answered(reply: bytes) -> bool:
    """Whether ``reply`` is etcd's answer to the status request."""
    return reply.startswith(b"HTTP/1.1 200") and b'"header"' in reply


def _exchange(sock: socket.socket) -> bytes:
    sock.sendall(REQUEST)
    reply = b""
    while chunk := sock.recv(65536):
        reply += chunk
    return reply


def _plain(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT_S) as sock:
            return not _answered(_exchange(sock))
    except OSError:  # reset or closed: refused as well
        return True


def _tls(host: str, port: int, ca: str, cert: tuple[str, str] | None) -> tuple[bool, bool]:
    """Whether the member's certificate named ``host`` (checked against ``ca``), and whether
    the request was answered, with ``cert`` as the client certificate (None: without one)."""
    context = ssl.create_default_context(cafile=ca)  # names checked: an IP in the certificate
    if cert is not None:
        context.load_cert_chain(*cert)
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT_S) as raw:
            with context.wrap_socket(raw, server_hostname=host) as sock:
                try:  # the handshake checked the member's certificate and the name in it
                    return True, _answered(_exchange(sock))
                except OSError:  # ssl.SSLError included: the member's alert, or a reset
                    return True, False
    except OSError:  # ssl.SSLCertVerificationError included; or the member ended the handshake
        return False, False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ca")
    parser.add_argument("cert")
    parser.add_argument("key")
    parser.add_argument("addresses", nargs="+")
    args = parser.parse_args()
    found = {}
    for address in args.addresses:
        parsed = parse_address(address)
        host, port = parsed.host, parsed.port
        _, certless_answered = _tls(host, port, args.ca, None)
        named, certified = _tls(host, port, args.ca, (args.cert, args.key))
        found[address] = {
            "plain_refused": _plain(host, port),
            "names_its_address": named,
            "certless_refused": not certless_answered,
            "certified_answered": certified,
        }
    print(json.dumps(found))


if __name__ == "__main__":
    main()
