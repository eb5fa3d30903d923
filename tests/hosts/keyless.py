"""Clients without keys, with the job's user's key, and a forger, against a job's servers.

``python -m tests.hosts.keyless JOB KEYS [--identity SECRET] --ps ADDR... --data ADDR...`` (run
in a host) prints one JSON line: for every address, whether a client without keys was refused
(``keyless_refused``: a raw socket's ``PING`` got no answer; hogwild's own clients refuse to
send one beyond loopback), whether one with the job's keys was answered (``keyed_answered``:
the control, so that a refusal is the keys' doing and not a dead address; one client asks all
the parameter servers, as a job's layout names every one) and, for a parameter server under a
roster (``--identity``: the key pair of a role of the job that is not a server), whether a
replication message sent with that key was refused as not a server's (``forged_refused``).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import zmq
from hogwild_plugins.ps.client import PSClient

from hogwild.data.remote import describe_server
from hogwild.errors import DataError
from hogwild.net.address import parse_address
from hogwild.net.auth import use_identity
from hogwild.net.channel import Peers, PeerUnreachableError
from hogwild.net.wire import DType, ErrorCode, Header, MsgType, job_id, pack_header

TIMEOUT_S = 1.0


def _keyless(address: str) -> bool:
    """Whether a socket without CURVE got no answer to a ``PING`` (the server never saw it)."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(parse_address(address).endpoint)
        sock.send(pack_header(Header(MsgType.PING, sender=90_001, seq=1)))
        return not sock.poll(int(TIMEOUT_S * 1000))
    finally:
        sock.close(linger=0)
        context.term()


def _ps(servers: list[str], job: str, keys: str) -> bool:
    """Whether the parameter servers answered a keyed client's hello, each of them."""
    try:
        with PSClient(servers, job, client_id=90_000, keys=keys, timeout_s=TIMEOUT_S, retries=1):
            return True
    except PeerUnreachableError:
        return False


def _forged(address: str, job: str, keys: str) -> bool:
    """Whether a ``COMMIT`` sent with this (non-server) role's key was refused as forged."""
    header = Header(MsgType.COMMIT, job=job_id(job), dtype=DType.FLOAT32, shape=(1,), frames=1)
    with Peers([address], sender=90_002, keys=keys, timeout_s=TIMEOUT_S, retries=1) as peers:
        reply, frames = peers.request(0, header, [np.zeros(1, np.float32)])
    said = bytes(memoryview(frames[0])).decode() if frames else ""
    return reply.code == ErrorCode.UNEXPECTED and "only the job's parameter servers" in said


def _data(address: str, keys: str) -> bool:
    """Whether the data server answered a keyed describe request."""
    try:
        describe_server(address, keys=keys, timeout_s=TIMEOUT_S, retries=1)
    except DataError as exc:
        if "did not answer" in str(exc):
            return False
        raise
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("job")
    parser.add_argument("keys")
    parser.add_argument("--identity", default=None, help="a non-server role's .key_secret")
    parser.add_argument("--ps", nargs="*", default=[])
    parser.add_argument("--data", nargs="*", default=[])
    args = parser.parse_args()
    use_identity(args.identity)
    found = {}
    keyed = _ps(args.ps, args.job, args.keys) if args.ps else False  # one client: the job's
    for address in args.ps:  # layout names every server, so a keyed client asks them all
        found[address] = {"keyless_refused": _keyless(address), "keyed_answered": keyed}
        if args.identity:
            found[address]["forged_refused"] = _forged(address, args.job, args.keys)
    for address in args.data:
        found[address] = {
            "keyless_refused": _keyless(address),
            "keyed_answered": _data(address, args.keys),
        }
    print(json.dumps(found))


if __name__ == "__main__":
    main()
