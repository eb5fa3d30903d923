"""What one poll of the etcd watch costs the polling process: kept ``http.client`` connections
(:class:`~hogwild_plugins.ps.etcd_poll.RangePoller`, the watch's transport) against the client's
own path through etcd3gw's ``requests`` session (:meth:`~hogwild_plugins.ps.etcd.Etcd._post`,
the watch's transport before it and still its transport over TLS), the peer.

Both post the watch's own range request (keys only, the newest by mod_revision, ``limit=1``) to
one etcd on loopback that this script starts and stops. The measure is this process's CPU time
(user + system, ``time.process_time``) per poll, in milliseconds; etcd's own CPU is not counted,
being the same request for both. Rounds alternate the two paths, ``--polls`` polls each, after
one untimed round of each. ``python bench/figures/etcd_poll.py --repeats 5 --out
bench/results/etcd_poll.json`` prints one JSON line: the median per path, their ratio, every
round, the machine and the versions.
"""

from __future__ import annotations

import argparse
import base64
import statistics
import sys
import time
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.support.record import measured_and_emitted

PATHS = ("http_client", "etcd3gw_requests")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python bench/figures/etcd_poll.py", description=__doc__)
    add = parser.add_argument
    add("--polls", type=int, default=500, help="polls per path and round (default 500)")
    add("--repeats", type=int, default=5, help="rounds of each path (default 5)")
    add("--quick", action="store_true", help="one round of 100 polls each: a smoke run")
    add("--out", metavar="FILE", help="also write the JSON line to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.polls, args.repeats = 100, 1
    if min(args.polls, args.repeats) < 1:
        parser.error("--polls and --repeats must be at least 1")
    return args


def cpu_ms_per_poll(poll, polls: int) -> float:
    started = time.process_time()
    for _ in range(polls):
        poll()
    return (time.process_time() - started) * 1000.0 / polls


def measure(args: argparse.Namespace) -> dict:
    from hogwild_plugins.ps.etcd import Etcd, EtcdProcess
    from hogwild_plugins.ps.etcd_poll import RangePoller

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    prefix = "/hogwild/bench-etcd-poll/"
    query = {"key": b64(prefix.encode()), "range_end": b64(prefix[:-1].encode() + b"0")}
    query |= {"keys_only": True, "limit": 1, "sort_order": "DESCEND", "sort_target": "MOD"}
    rounds: dict[str, list[float]] = {path: [] for path in PATHS}
    with EtcdProcess() as server, Etcd(server.address, prefix=prefix) as client:
        client.put("key", {"v": 1})
        poller = RangePoller(client.members, lambda i: client._clients[i].api_path, 2.0)
        try:
            polls = {
                "http_client": lambda: poller.post("/kv/range", query),
                "etcd3gw_requests": lambda: client._post("/kv/range", query),
            }
            for path in PATHS:  # connections opened, API path asked, code warm
                cpu_ms_per_poll(polls[path], min(args.polls, 50))
            for _ in range(args.repeats):
                for path in PATHS:
                    rounds[path].append(round(cpu_ms_per_poll(polls[path], args.polls), 4))
        finally:
            poller.close()
    medians = {path: statistics.median(rounds[path]) for path in PATHS}
    return {
        "benchmark": "etcd_poll",
        "polls_per_round": args.polls,
        "cpu_ms_per_poll": medians,
        "etcd3gw_over_http_client": round(medians["etcd3gw_requests"] / medians["http_client"], 1),
        "rounds": rounds,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    return measured_and_emitted(__file__, argv, lambda: measure(args), args.out)


if __name__ == "__main__":
    sys.exit(main())
