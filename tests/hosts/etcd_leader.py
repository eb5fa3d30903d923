"""Make a chosen member of a job's etcd cluster its leader, from outside the job.

``python -m tests.hosts.etcd_leader CA CERT KEY WANTED ADDR...`` (run in a host) asks every
member at ``ADDR...`` for its status over TLS with the job's client certificate ``CERT``/``KEY``
(checked against the job's ``CA``); if the leader is not the member at ``WANTED``, asks the
leader to hand its leadership to it (etcd's ``MoveLeader``), then waits until every member
names ``WANTED``'s member as leader. Prints one JSON line: ``{"leader": WANTED, "moved": bool}``;
exits 1 naming what went wrong. A test that loses the leader's host picks that host this way,
so that the loss always costs an election (the clients' first member then answers without a
leader until a new one is elected).
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import time
import urllib.request

TIMEOUT_S = 2.0
SETTLED_WITHIN_S = 20.0


def _post(context: ssl.SSLContext, address: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        f"https://{address}{path}", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=context) as reply:
        return json.load(reply)


def _status(context: ssl.SSLContext, addresses: list[str]) -> dict[str, tuple[str, str]]:
    """Every member's ``(its own id, the leader's id)``, as it says them."""
    found = {}
    for address in addresses:
        status = _post(context, address, "/v3/maintenance/status", {})
        found[address] = (str(status["header"]["member_id"]), str(status.get("leader", "")))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ca")
    parser.add_argument("cert")
    parser.add_argument("key")
    parser.add_argument("wanted")
    parser.add_argument("addresses", nargs="+")
    args = parser.parse_args()
    if args.wanted not in args.addresses:
        sys.exit(f"{args.wanted}: not one of the members {args.addresses}")
    context = ssl.create_default_context(cafile=args.ca)
    context.load_cert_chain(args.cert, args.key)
    status = _status(context, args.addresses)
    wanted_id = status[args.wanted][0]
    leaders = {leader for _, leader in status.values()}
    moved = leaders != {wanted_id}
    if moved:
        by_id = {member: address for address, (member, _) in status.items()}
        leader = by_id.get(status[args.wanted][1])
        if leader is None:
            sys.exit(f"no member of {args.addresses} is the leader {args.wanted} names")
        _post(context, leader, "/v3/maintenance/transfer-leadership", {"targetID": wanted_id})
    deadline = time.monotonic() + SETTLED_WITHIN_S
    while {leader for _, leader in _status(context, args.addresses).values()} != {wanted_id}:
        if time.monotonic() > deadline:
            sys.exit(f"{args.wanted} did not become every member's leader in {SETTLED_WITHIN_S} s")
        time.sleep(0.1)
    print(json.dumps({"leader": args.wanted, "moved": moved}))


if __name__ == "__main__":
    main()
