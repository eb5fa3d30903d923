"""What an idle etcd watch costs etcd and the watching process: the watch as it is
(:class:`~hogwild_plugins.ps.etcd_watch.Watch`: etcd's watch stream, and a poll every 0.5 s as its
safety net) against the watch as it was, the peer: the same range request polled every 50 ms on a
kept connection (:class:`~hogwild_plugins.ps.etcd_poll.RangePoller`, the watch's transport).

One etcd on loopback, started and stopped by this script, and ``--watches`` watches of one
prefix, as many replicated parameter servers keep; nothing changes while they idle. A round is
``--idle-s`` seconds of one kind; rounds alternate the kinds, ``--repeats`` of each. The measures
are the CPU seconds (user + system) of the etcd process and of this process in a round, per
second; the medians per kind and the ratios. Then the latency of a change: ``--changes`` puts to
the prefix, a random 0.1 to 0.3 s apart (so that the peer's 50 ms polls are met at every phase),
each timed from just before the put is sent until the watch's ``on_change()`` and, in the same
run and for the same put, until the peer's polls see the change (a watch and a peer both running
throughout); medians and 90th percentiles of each. ``python bench/figures/etcd_watch.py --out
bench/results/etcd_watch.json`` prints one JSON line: those, every round, the machine and the
versions.
"""

from __future__ import annotations

import argparse
import base64
import random
import statistics
import sys
import threading
import time
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.support.record import measured_and_emitted

KINDS = ("stream", "polls_50ms")
PEER_INTERVAL_S = 0.05  # the watch's poll before it heard etcd's stream


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python bench/figures/etcd_watch.py", description=__doc__)
    add = parser.add_argument
    add("--watches", type=int, default=3, help="watches of the prefix (default 3)")
    add("--idle-s", type=float, default=20.0, help="seconds of one round (default 20)")
    add("--repeats", type=int, default=3, help="rounds of each kind (default 3)")
    add("--changes", type=int, default=30, help="puts timed to on_change (default 30)")
    add("--quick", action="store_true", help="one round of 3 s each: a smoke run")
    add("--out", metavar="FILE", help="also write the JSON line to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.idle_s, args.repeats, args.changes = 3.0, 1, 5
    if min(args.watches, args.repeats, args.changes) < 1 or not args.idle_s > 0:
        parser.error("--watches and --repeats must be at least 1, --idle-s more than 0")
    return args


def measure(args: argparse.Namespace) -> dict:
    import psutil
    from hogwild_plugins.ps.etcd import Etcd, EtcdProcess
    from hogwild_plugins.ps.etcd_poll import RangePoller

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    prefix = "/hogwild/bench-etcd-watch/"
    query = {"key": b64(prefix.encode()), "range_end": b64(prefix[:-1].encode() + b"0")}
    query |= {"keys_only": True, "limit": 1, "sort_order": "DESCEND", "sort_target": "MOD"}

    def cpu_s(process: psutil.Process) -> float:
        times = process.cpu_times()
        return times.user + times.system

    rounds: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    with EtcdProcess() as server, Etcd(server.address, prefix=prefix) as client:
        client.put("key", {"v": 1})
        etcd, me = psutil.Process(server.process.pid), psutil.Process()

        def stream_round() -> None:
            watches = [client.watch("", lambda: None) for _ in range(args.watches)]
            try:
                time.sleep(args.idle_s)
            finally:
                for watch in watches:
                    watch.cancel()

        def polls_round() -> None:
            stop = threading.Event()

            def poll() -> None:
                poller = RangePoller(client.members, lambda i: client._clients[i].api_path, 2.0)
                try:
                    while not stop.wait(PEER_INTERVAL_S):
                        poller.post("/kv/range", query)
                finally:
                    poller.close()

            threads = [threading.Thread(target=poll) for _ in range(args.watches)]
            for thread in threads:
                thread.start()
            time.sleep(args.idle_s)
            stop.set()
            for thread in threads:
                thread.join()

        def latencies() -> dict[str, list[float]]:
            """Each put's time to the watch's on_change and to the peer's polls, in ms."""
            heard = {kind: threading.Event() for kind in KINDS}
            at: dict[str, float] = {}  # when each heard of the put, stamped where it heard

            def hear(kind: str) -> None:
                if not heard[kind].is_set():
                    at[kind] = time.monotonic()
                    heard[kind].set()

            stop = threading.Event()

            def peer() -> None:
                poller = RangePoller(client.members, lambda i: client._clients[i].api_path, 2.0)
                try:
                    seen = None
                    while not stop.wait(PEER_INTERVAL_S):
                        reply = poller.post("/kv/range", query)
                        now = (reply.get("count"), [kv.get("mod_revision") for kv in
                                                    reply.get("kvs", [])])  # fmt: skip
                        if seen is not None and now != seen:
                            hear("polls_50ms")
                        seen = now
                finally:
                    poller.close()

            watch = client.watch("", lambda: hear("stream"))
            polls = threading.Thread(target=peer)
            polls.start()
            found: dict[str, list[float]] = {kind: [] for kind in KINDS}
            rng = random.Random(38)
            try:
                for n in range(args.changes):
                    time.sleep(rng.uniform(0.1, 0.3))
                    for event in heard.values():
                        event.clear()
                    sent = time.monotonic()
                    client.put("key", {"v": n})
                    for kind in KINDS:
                        if heard[kind].wait(5.0):
                            found[kind].append(round(1000 * (at[kind] - sent), 2))
            finally:
                stop.set()
                polls.join()
                watch.cancel()
            return found

        run = {"stream": stream_round, "polls_50ms": polls_round}
        for _ in range(args.repeats):
            for kind in KINDS:
                etcd0, me0, started = cpu_s(etcd), cpu_s(me), time.monotonic()
                run[kind]()
                wall = time.monotonic() - started
                rounds[kind].append({
                    "etcd_cpu_s_per_s": round((cpu_s(etcd) - etcd0) / wall, 4),
                    "watcher_cpu_s_per_s": round((cpu_s(me) - me0) / wall, 4),
                })  # fmt: skip
        change_ms = latencies()
    medians = {
        kind: {m: statistics.median(r[m] for r in rounds[kind]) for m in rounds[kind][0]}
        for kind in KINDS
    }
    return {
        "benchmark": "etcd_watch",
        "watches": args.watches,
        "idle_s": args.idle_s,
        "medians": medians,
        "polls_over_stream": {
            m: round(medians["polls_50ms"][m] / max(medians["stream"][m], 1e-6), 1)
            for m in medians["stream"]
        },
        "rounds": rounds,
        "change_to_on_change_ms": {
            kind: {
                "median": statistics.median(change_ms[kind]) if change_ms[kind] else None,
                "p90": _percentile(change_ms[kind], 0.9),
                "heard": len(change_ms[kind]),
                "of": args.changes,
            }
            for kind in KINDS
        },
        "change_ms": change_ms,
    }


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    return measured_and_emitted(__file__, argv, lambda: measure(args), args.out)


if __name__ == "__main__":
    sys.exit(main())
