"""A ledger client run as a process of its own (in a host of bench/figures/partitions.py).

``python -m bench.support.ledger_client --servers H:P,... --etcd H:P,... --keys DIR --dir DIR``
pushes non-negative integer deltas (:class:`bench.support.ps_ledger.Pusher`, ``low=0``) into a
job's replicated parameter servers and keeps, in float64, the sum of every acknowledged one
(the ledger) and of every push that raised (its fate unknown). It talks to the fault injector
through files in ``--dir``, written whole (a temporary name, then a rename):

- ``map.json``, every ``MAP_EVERY_S``: the bucket map read from etcd
  (:meth:`bench.support.ps_watch.ServerWatch.buckets`), the time it was read, the servers
  registered (``members``), the etcd member that leads (``etcd_leader``: its index in
  ``--etcd``, None while none answers with a leader), the pushes acknowledged so far and the
  last one's time, so that the injector, outside the hosts' network, knows each bucket's
  primary and whether updates flow, and each server's last word on its buckets (``roles``:
  :func:`server_roles`), which the injector's report of a stuck wait quotes;
- ``stop``: made by the injector; the client stops pushing, writes ``result.json`` with
  ``partial`` true (the pushes, acknowledgements, errors and history below: what the faults'
  figures need, kept should the client not finish), waits until every bucket has three in-sync
  copies again, pulls the parameters and writes it again whole (``partial`` false):
- ``result.json``: ``pushes``, ``acknowledged_lost`` (parameters below the ledger: an
  acknowledged update is missing), ``applied_twice`` (parameters above the ledger plus every
  unknown push: an update counted more than once; ``applied_twice_by_shard`` the same by
  shard), ``servers_copy_side`` (each server's copy-side counters at the end: how its copies
  were caught up, what they refused; its shards' versions, the updates each shard's memory
  took, its roles), ``acks`` (``[sent, acknowledged]``, both
  ``time.time()``, of each acknowledged push), ``errors`` and ``problems``; for the injector's
  breakdown of a failover, ``history`` (each map read that differed from the one before in its
  members, leader or a bucket's primary or epoch: ``[at, members, leader, {bucket: [primary,
  epoch]}]``) and ``takeovers`` (every takeover the servers reported in their statuses:
  bucket, epoch, server, ``won_at``, ``first_ack_at``).

All times are ``time.time()`` of one machine: the hosts are namespaces sharing its clock.

Every delta is >= 0, so a lost update and a doubled one cannot cancel out in one parameter.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.etcd import EtcdUnavailable

from bench.support.ps_ledger import JOB, Pusher
from bench.support.ps_watch import ServerWatch
from hogwild.errors import HogwildError

MAP_EVERY_S = 0.1  # also the resolution of the history's times
MAP_ERROR_EVERY_S = 10.0  # at most one "map not read" line in this long, in the log
SYNC_TIMEOUT_S = 90.0
LEADER_TIMEOUT_S = 0.2  # an etcd member that does not tell its status within this is skipped


def etcd_leader(members: list[str], ids: dict[int, int]) -> int | None:
    """The index in ``members`` of the etcd member that leads, as the first member to answer
    its status says (None: none answered, or none named a leader it knows); ``ids`` (member id
    -> index) is filled as members answer."""
    import requests

    leader = None
    for i, member in enumerate(members):
        try:
            reply = requests.post(f"http://{member}/v3/maintenance/status", json={},
                                  timeout=LEADER_TIMEOUT_S).json()  # fmt: skip
        except (requests.RequestException, ValueError):
            continue
        ids[int(reply.get("header", {}).get("member_id", 0))] = i
        if leader is None and reply.get("leader"):
            leader = int(reply["leader"])
    return None if leader is None else ids.get(leader)


def write_json(path: Path, value) -> None:
    """Write ``value`` to ``path`` whole: a reader sees the old file or the new, never half."""
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(value))
    os.replace(part, path)


def server_roles(watch: ServerWatch) -> dict[str, dict]:
    """Each server's last STATUS in brief, by bucket: ``[role, epoch, in_sync, {copy: lease}
    of the copies it caught up as primary]`` (a bucket it holds no role of: None)."""
    return {
        str(server): {
            str(b): None if r is None else
            [r.get("role"), r.get("epoch"), r.get("in_sync"), r.get("confirmed") or {}]
            for b, r in (brief.get("roles") or {}).items()
        }
        for server, brief in list(watch.last.items())
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.support.ledger_client")
    parser.add_argument("--servers", required=True, help="every server, H:P,H:P,...")
    parser.add_argument("--etcd", required=True, help="the etcd members, H:P,H:P,...")
    parser.add_argument("--keys", help="CURVE key directory")
    parser.add_argument("--job", default=JOB, help=f"the servers' job name (default {JOB})")
    parser.add_argument("--dir", required=True, help="where map.json, stop, result.json go")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--push-every-s", type=float, default=0.0,
                        help="start a push at most this often (0: back to back)")  # fmt: skip
    args = parser.parse_args(argv)
    folder = Path(args.dir)
    servers = args.servers.split(",")
    client = PSClient(servers, args.job, client_id=1, etcd=args.etcd, keys=args.keys, failover_s=60)
    watch = ServerWatch(servers, args.etcd, args.job, keys=args.keys).start()
    n_params = client.layout.n_params
    client.assign(np.zeros(n_params, np.float32))
    problems: list[str] = []
    if watch.wait_copies(3, SYNC_TIMEOUT_S)[1] is None:
        problems.append("the three copies never came in sync before the pushes")
    ledger = np.zeros(n_params, np.float64)
    acks: list[tuple[float, float]] = []
    pusher = Pusher(client, ledger, n_params, args.seed, low=0, keep_going=True, acks=acks,
                    every_s=args.push_every_s)  # fmt: skip
    stop = threading.Event()

    history: list[list] = []
    members = args.etcd.split(",")
    leaders: dict[str, int | None] = {"now": None}
    ids: dict[int, int] = {}

    def follow_leader() -> None:  # apart from the map: a cut member's status waits its timeout
        while not stop.wait(MAP_EVERY_S):
            try:
                leaders["now"] = etcd_leader(members, ids)
            except Exception as exc:  # noqa: BLE001 - a dead thread would leave a stale leader
                leaders["now"] = None  # not known: the breakdown counts such cuts apart
                print(f"etcd leader not read: {exc!r}", file=sys.stderr)

    def publish() -> None:
        last, said_at = None, 0.0
        while not stop.wait(MAP_EVERY_S):
            try:
                seen = watch.buckets()
            except (EtcdUnavailable, HogwildError) as exc:  # a member down: the next read goes
                # on to another; said in the log, at most so often: a map.json left old says why
                if time.monotonic() - said_at > MAP_ERROR_EVERY_S:
                    said_at = time.monotonic()
                    print(f"{time.strftime('%H:%M:%S')} map not read: {exc!r}", file=sys.stderr)
                continue
            at, last_ack = time.time(), acks[-1][1] if acks else None
            brief = [watch.members, leaders["now"],
                     {b: [v["primary"], v["epoch"]] for b, v in seen.items()}]  # fmt: skip
            if brief != last:
                history.append([at, *brief])
                last = brief
            state = {"at": at, "buckets": seen, "pushes": pusher.count, "members": watch.members}
            state |= {"etcd_leader": leaders["now"], "last_ack": last_ack}
            state["roles"] = server_roles(watch)  # what each server last said (a stuck report)
            write_json(folder / "map.json", state)

    mapper = threading.Thread(target=publish, name="ledger-map", daemon=True)
    mapper.start()
    leader = threading.Thread(target=follow_leader, name="ledger-leader", daemon=True)
    leader.start()
    while not (folder / "stop").exists():
        time.sleep(0.05)
    pusher.stop()
    stop.set()
    mapper.join()
    leader.join()
    # what the faults' figures need, kept before the final wait: an injector that stops waiting
    # for this client (or kills it) still has every acknowledgement and the map's history
    write_json(folder / "result.json", {
        "partial": True,
        "pushes": pusher.count,
        "unknown_pushes": len(pusher.errors),
        "n_params": n_params,
        "acks": acks,
        "errors": pusher.errors[:20],
        "problems": problems,
        "history": history,
        "takeovers": None,  # read from the servers only after the final wait: not known here
    })  # fmt: skip
    waited, seen = watch.wait_copies(3, SYNC_TIMEOUT_S)
    if seen is None:
        problems.append(f"the copies did not all catch up within {waited:.0f} s after the faults")
    final = np.empty(n_params, np.float32)
    client.pull(final)
    watch.poll()  # the last takeovers' first acknowledgements
    takeovers = [dict(t, bucket=b, epoch=e) for (b, e), t in sorted(watch.takeovers.items())]
    servers = {
        str(i): {**(brief.get("copy_side") or {}), "versions": brief.get("versions"),
                 "applied": brief.get("applied"), "roles": brief.get("roles")}
        for i, brief in sorted(watch.last.items())
    }  # fmt: skip
    watch.stop()
    client.close()
    got = final.astype(np.float64)
    above = got > ledger + pusher.uncertain
    layout = client.layout
    by_shard = {  # parameters above the ledger, by shard (a doubled update covers ~3/4 of one)
        str(s): int(np.count_nonzero(above[slice(*layout.shard_range(s))]))
        for s in range(layout.n_shards)
    }
    write_json(folder / "result.json", {
        "partial": False,
        "pushes": pusher.count,
        "unknown_pushes": len(pusher.errors),
        "acknowledged_lost": int(np.count_nonzero(got < ledger)),
        "applied_twice": int(np.count_nonzero(above)),
        "applied_twice_by_shard": by_shard,
        "servers_copy_side": servers,
        "n_params": n_params,
        "acks": acks,
        "errors": pusher.errors[:20],
        "problems": problems,
        "caught_up_s": round(waited, 3),
        "history": history,
        "takeovers": takeovers,
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
