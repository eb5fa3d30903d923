"""A client without CURVE keys, and one with the job's, against a job's servers (run in a host).

``python -m tests.hosts.keyless JOB KEYS --ps ADDR... --data ADDR...`` prints one JSON line:
for every address, whether a client without keys was refused (``keyless_refused``: no answer)
and whether one with the job's keys was answered (``keyed_answered``: the control, so that a
refusal is the keys' doing and not a dead address; one client asks all the parameter servers,
as a job's layout names every one).
"""

from __future__ import annotations

import argparse
import json

from hogwild_plugins.ps.client import PSClient

from hogwild.data.remote import describe_server
from hogwild.errors import DataError
from hogwild.net.channel import PeerUnreachableError

TIMEOUT_S = 1.0


def _ps(servers: list[str], job: str, keys: str | None) -> bool:
    """Whether the parameter servers answered a client's hello, each of them (no answer: the
    CURVE handshake never completed)."""
    try:
        with PSClient(servers, job, client_id=90_000, keys=keys, timeout_s=TIMEOUT_S, retries=1):
            return True
    except PeerUnreachableError:
        return False


def _data(address: str, keys: str | None) -> bool:
    """Whether the data server answered a describe request."""
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
    parser.add_argument("--ps", nargs="*", default=[])
    parser.add_argument("--data", nargs="*", default=[])
    args = parser.parse_args()
    found = {}
    keyed = _ps(args.ps, args.job, args.keys) if args.ps else False  # one client: the job's
    for address in args.ps:  # layout names every server, so a keyed client asks them all
        found[address] = {
            "keyless_refused": not _ps([address], args.job, None),
            "keyed_answered": keyed,
        }
    for address in args.data:
        found[address] = {
            "keyless_refused": not _data(address, None),
            "keyed_answered": _data(address, args.keys),
        }
    print(json.dumps(found))


if __name__ == "__main__":
    main()
