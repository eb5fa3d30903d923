"""What an etcd election costs a 1 s lease and its readers, per election timeout: three etcd
members on loopback, the leader stopped with SIGSTOP (as a cut of its host stops it answering).

For each election timeout (``--elections``, milliseconds) this script starts a three-member
:class:`~hogwild_plugins.ps.etcd_process.EtcdCluster` (pre-vote on, as hogwild starts them) and:

- measures the members' idle CPU (user + system of the three etcd processes, ``--idle-s``
  seconds with no request): CPU-s a second;
- then ``--stops`` times: grants a 1 s lease through the leader and writes a key under it (the
  cut primary's lease, renewed through its own member, the leader, until the stop), and a
  second 1 s lease through a follower (a survivor's, renewed every 0.2 s by a thread through
  :meth:`~hogwild_plugins.ps.etcd.Etcd.keepalive` with ``keepalive_s`` and its bounded
  re-asks, as a replicated server renews); stops the leader; reads the key every 20 ms through
  the members in the order follower, stopped leader, follower, until it is gone; then
  continues the leader and waits until every member answers.

Per stop it records, from the stop: ``lease_gone_s`` (the first read that found the key
gone ended), ``read_back_s`` (the first read begun after the stop that was answered ended: the
election as a reader sees it), ``slowest_read_s``, and the survivor's keepalives:
``survivor_keepalive_max_s`` (the slowest one), ``survivor_keepalive_failed`` (how many raised)
and ``survivor_lease_kept`` (whether its lease still had time left after the stop window).
A stop that never saw the key go within ``--window-s`` records ``lease_gone_s`` null.

``python bench/figures/etcd_election.py --out bench/results/etcd_election.json`` prints one
JSON line (per election timeout: every stop, their medians, the idle CPU; the machine and
versions), in about a minute and a half with the defaults. The figures mean something only on
a quiet machine: the record's ``machine`` says the load average when it ended.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.support.record import measured_and_emitted

READ_EVERY_S = 0.02
RENEW_EVERY_S = 0.2  # a 1 s lease's renewals (the lease clock renews every TTL/5)
READY_WITHIN_S = 30.0
LEASE_S = 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bench/figures/etcd_election.py", description=__doc__
    )
    add = parser.add_argument
    add("--elections", default="500,200,100", help="election timeouts, ms (default 500,200,100)")
    add("--stops", type=int, default=2, help="leader stops per election timeout (default 2)")
    add("--idle-s", type=float, default=10.0, help="idle CPU window, s (default 10)")
    add("--window-s", type=float, default=6.0, help="longest wait for the lease to go (6 s)")
    add("--quick", action="store_true", help="200 ms only, one stop, 3 s idle: a smoke run")
    add("--out", metavar="FILE", help="also write the JSON line to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.elections, args.stops, args.idle_s = "200", 1, 3.0
    try:
        args.elections = [int(ms) for ms in args.elections.split(",")]
    except ValueError:
        parser.error(f"--elections {args.elections!r}: expected milliseconds like 500,200,100")
    if not all(10 <= ms <= 666 for ms in args.elections):
        parser.error("--elections: each from 10 to 666 ms (1 s leases need at most 666)")
    if args.stops < 1 or args.idle_s <= 0 or args.window_s <= 0:
        parser.error("--stops must be at least 1, --idle-s and --window-s above 0")
    return args


def _status(member: str) -> tuple[int, int]:
    """``(member id, leader id)`` as ``member`` says."""
    import requests

    reply = requests.post(f"http://{member}/v3/maintenance/status", json={}, timeout=1.0).json()
    return int(reply["header"]["member_id"]), int(reply.get("leader", 0))


def _leader(members: list[str]) -> int:
    """The index of the member every member names leader; waits (bounded) for one."""
    deadline = time.monotonic() + READY_WITHIN_S
    while True:
        try:
            said = [_status(member) for member in members]
            ids = {member_id: i for i, (member_id, _) in enumerate(said)}
            leaders = {leader for _, leader in said}
            if len(leaders) == 1 and leaders <= ids.keys():
                return ids[leaders.pop()]
        except (OSError, ValueError, KeyError):
            pass  # a member still starting or rejoining
        if time.monotonic() > deadline:
            raise RuntimeError(f"etcd members {members}: no agreed leader in {READY_WITHIN_S} s")
        time.sleep(0.1)


def _cpu_s(pids: list[int]) -> float:
    import psutil

    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)


def _keep_renewing(client, lease: int, stop: threading.Event, record: dict) -> None:
    """A survivor's heartbeat: renew ``lease`` every 0.2 s, noting the slowest and failures."""
    from hogwild.errors import HogwildError

    while not stop.wait(RENEW_EVERY_S):
        started = time.monotonic()
        try:
            record["left"] = client.keepalive(lease)
        except HogwildError:
            record["failed"] += 1
        record["slowest"] = max(record["slowest"], time.monotonic() - started)


def one_stop(cluster, window_s: float) -> dict:
    """Stop the leader once, as the module docstring says; the leader continued on every exit."""
    from hogwild_plugins.ps.etcd import Etcd, keepalive_s

    members = cluster.address.split(",")
    leader = _leader(members)
    follower, other = (i for i in range(3) if i != leader)
    order = ",".join(members[i] for i in (follower, leader, other))
    prefix = "/bench-etcd-election/"
    owner = Etcd(members[leader], prefix=prefix)
    survivor = Etcd(members[follower], prefix=prefix, keepalive_s=keepalive_s(LEASE_S))
    reader = Etcd(order, prefix=prefix)
    stop_renewing, renewals = threading.Event(), {"failed": 0, "slowest": 0.0, "left": 0}
    renewing = None
    stopped = cluster.members[leader].process
    try:
        lease = owner.grant(LEASE_S)
        owner.put("owner", {"v": 1}, lease=lease)
        kept = survivor.grant(LEASE_S)
        renewing = threading.Thread(
            target=_keep_renewing, args=(survivor, kept, stop_renewing, renewals), daemon=True
        )
        renewing.start()
        for _ in range(3):  # the owner renews through its leader until the stop
            owner.keepalive(lease)
            time.sleep(RENEW_EVERY_S)
        os.kill(stopped.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        gone = back = None
        slowest = 0.0
        while time.monotonic() - t0 < window_s and gone is None:
            began = time.monotonic()
            try:
                value, _ = reader.get("owner")
            except Exception:  # noqa: BLE001 - unanswered: the election not over yet
                value = "unanswered"
            ended = time.monotonic()
            slowest = max(slowest, ended - began)
            if value != "unanswered" and back is None:
                back = ended - t0
            if value is None:
                gone = ended - t0
            time.sleep(READ_EVERY_S)
        stop_renewing.set()
        renewing.join(10.0)
        left = survivor.keepalive(kept)  # after the window: did the survivor's lease live?
    finally:
        stop_renewing.set()
        os.kill(stopped.pid, signal.SIGCONT)
        for client in (owner, survivor, reader):
            client.close()
    _leader(members)  # every member answers again before the next stop
    return {
        "lease_gone_s": None if gone is None else round(gone, 3),
        "read_back_s": None if back is None else round(back, 3),
        "slowest_read_s": round(slowest, 3),
        "survivor_keepalive_max_s": round(renewals["slowest"], 3),
        "survivor_keepalive_failed": renewals["failed"],
        "survivor_lease_kept": left > 0,
    }


def _median(stops: list[dict], field: str) -> float | None:
    values = [stop[field] for stop in stops if stop[field] is not None]
    return round(statistics.median(values), 3) if values else None


def measure_election(election_ms: int, args: argparse.Namespace) -> dict:
    from hogwild_plugins.ps.etcd_process import EtcdCluster

    with EtcdCluster(3, election_ms=election_ms) as cluster:
        _leader(cluster.address.split(","))
        pids = [member.process.pid for member in cluster.members]
        cpu, wall = _cpu_s(pids), time.monotonic()
        time.sleep(args.idle_s)
        idle = (_cpu_s(pids) - cpu) / (time.monotonic() - wall)
        stops = [one_stop(cluster, args.window_s) for _ in range(args.stops)]
    fields = ("lease_gone_s", "read_back_s", "slowest_read_s", "survivor_keepalive_max_s")
    return {
        "election_ms": election_ms,
        "idle_cpu_s_per_s": round(idle, 4),
        **{f"median_{field}": _median(stops, field) for field in fields},
        "survivor_leases_kept": sum(stop["survivor_lease_kept"] for stop in stops),
        "stops": stops,
    }


def measure(args: argparse.Namespace) -> dict:
    return {
        "benchmark": "etcd_election",
        "lease_s": LEASE_S,
        "elections": [measure_election(ms, args) for ms in args.elections],
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    return measured_and_emitted(__file__, argv, lambda: measure(args), args.out)


if __name__ == "__main__":
    sys.exit(main())
