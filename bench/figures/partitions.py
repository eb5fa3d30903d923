"""Partitions, stalls, lost hosts and etcd faults under replicated parameter servers on real hosts.

Four network-namespace hosts (:class:`tests.hosts.harness.Hosts`): hosts 1 to 3 each run one
``hogwild ps serve --copies 3`` (the bundled job's model and layout, bound to the host's
address under CURVE keys) and one member of a three-member etcd cluster; host 4 runs the ledger
client (:mod:`bench.support.ledger_client`), which pushes non-negative integer deltas and sums
every acknowledged one. This process, outside the hosts' network, injects a seeded schedule of
faults, one at a time, each once every bucket has a primary and another in-sync copy again (read
from the map the client publishes):

- ``cut_primary``: the host of a random bucket's primary is taken off the network (its switch
  port down: both sides stay alive) for ``--cut-s`` seconds, then put back;
- ``stall_copy``: a server that is an in-sync copy (not primary) of some bucket is stopped
  (SIGSTOP) for ``--stall-s`` seconds, then continued;
- ``lose_host``: a whole host is lost (every process in it SIGKILLed, its link down); after
  ``--down-s`` it comes back as a new machine: its etcd member rejoins from its data directory,
  its server starts empty. Three hosts survive one lost (etcd keeps a quorum of two, every
  bucket a copy);
- ``kill_etcd``: an etcd member is SIGKILLed and restarted after ``--down-s``;
- ``kill_role``: a parameter server is SIGKILLed and restarted at once (its lease lapses).

At the end the client stops, waits for three in-sync copies, pulls and compares:
``acknowledged_lost`` and ``applied_twice`` count parameters (see the client's docstring).
``failover_s``: for each ``cut_primary``, seconds from the cut to the first acknowledgement of a
push sent after it (a push touches every bucket, so the cut primary's buckets were served by
then: taken over, or, if the cut ended first, served by it again; compare with ``--cut-s``).
``unavailable_s``: per kind, the longest time without an acknowledgement that overlaps the
fault's window (from its start to its end plus ``SETTLE_S``, or to the next fault's start),
median and max.

The training job's accuracy under these faults is not measured here yet (``test_accuracy`` and
``fault_free_test_accuracy`` are null, and ``accuracy`` says so): the roles of ``hogwild
cluster`` cannot yet be placed per host by anything but the Ray launcher.

Run: ``python bench/figures/partitions.py --out bench/results/partitions.json`` (``--quick``: one
fault of each kind with short pauses, a smoke run). One JSON line; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

import psutil

from bench.support.leaks import LeakCheck
from bench.support.machine import describe_machine, versions
from bench.support.ps_watch import spread
from bench.support.record import emit_record, stamp
from tests.hosts import harness
from tests.hosts.harness import Hosts
from tests.hosts.ray_nodes import ETCD_PORT, start_etcd_cluster, start_etcd_member, wait_listening

KINDS = ["cut_primary", "stall_copy", "lose_host", "kill_etcd", "kill_role"]
SERVER_HOSTS = [1, 2, 3]
CLIENT_HOST = 4
PS_PORT = 7100
LEASE_S = 2
SETTLE_S = 3.0
READY_WITHIN_S = 120.0
STALL_S = 90.0  # no map with a primary and a copy per bucket for this long: stuck
TARGETS = {"acknowledged_lost": 0, "applied_twice": 0, "faults": 100, "failover_max_s": 3.0,
           "accuracy_points": 0.3}  # fmt: skip
ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python bench/figures/partitions.py", description=__doc__)
    add = parser.add_argument
    add("--faults", type=int, default=None, help="how many faults (default 100; --quick 5)")
    add("--cut-s", type=float, default=None, help="seconds a primary's host is cut off (10)")
    add("--stall-s", type=float, default=0.7, help="seconds a copy is stopped (0.7)")
    add("--down-s", type=float, default=None, help="seconds a lost host/etcd member is down (3)")
    add("--gap-s", type=float, default=None, help="mean seconds between faults (2)")
    add("--seed", type=int, default=0)
    add("--quick", action="store_true", help="one fault of each kind: a smoke test")
    add("--out", metavar="FILE", help="also write the JSON line to this file")
    args = parser.parse_args(argv)
    defaults = {"faults": 5, "cut_s": 3.0, "down_s": 1.0, "gap_s": 0.5} if args.quick else {
        "faults": 100, "cut_s": 10.0, "down_s": 3.0, "gap_s": 2.0}  # fmt: skip
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def _log(text: str) -> None:
    print(f"partitions: {text}", file=sys.stderr, flush=True)


def schedule(rng: random.Random, n: int, quick: bool) -> list[str]:
    """The kinds of the ``n`` faults: every kind once in each block of five, shuffled."""
    kinds: list[str] = []
    while len(kinds) < n:
        block = list(KINDS)
        if not quick:
            rng.shuffle(block)
        kinds += block
    return kinds[:n]


class Cluster:
    """Servers and etcd members on hosts 1 to 3, the ledger client on host 4."""

    def __init__(self, hosts: Hosts, folder: Path, seed: int) -> None:
        self.hosts, self.folder = hosts, folder
        self.seen_pids: set[int] = set()
        self.servers: dict[int, subprocess.Popen] = {}
        self.keys = folder / "keys"
        subprocess.run([_hogwild(), "ps", "keys", str(self.keys)], check=True,
                       capture_output=True, timeout=60)  # fmt: skip
        self.etcd = start_etcd_cluster(hosts, SERVER_HOSTS)
        self._note_etcd()
        self.addresses = [f"{hosts.address(h)}:{PS_PORT}" for h in SERVER_HOSTS]
        for h in SERVER_HOSTS:
            self.start_server(h)
        for h in SERVER_HOSTS:
            wait_listening(hosts, h, hosts.address(h), PS_PORT, within_s=READY_WITHIN_S)
        self.client_dir = folder / "client"
        self.client_dir.mkdir()
        argv = [sys.executable, "-m", "bench.support.ledger_client", "--servers",
                ",".join(self.addresses), "--etcd", self.etcd, "--keys", str(self.keys),
                "--dir", str(self.client_dir), "--seed", str(seed)]  # fmt: skip
        with open(folder / "client.log", "ab") as log:
            self.client = hosts.run(
                CLIENT_HOST, argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
            )
        self.seen_pids.add(self.client.pid)

    def start_server(self, host: int) -> None:
        argv = [_hogwild(), "ps", "serve", "--bind", self.hosts.address(host), "--port",
                str(PS_PORT), "--servers", ",".join(self.addresses), "--index", str(host - 1),
                "--copies", "3", "--etcd", self.etcd, "--lease-s", str(LEASE_S), "--threads",
                "1", "--keys", str(self.keys)]  # fmt: skip
        with open(self.folder / f"ps{host}.log", "ab") as log:
            process = self.hosts.run(host, argv, stdout=log, stderr=subprocess.STDOUT)
        self.servers[host] = process
        self.seen_pids.add(process.pid)

    def etcd_pid(self, host: int) -> int | None:
        for pid in self.hosts.pids(host):
            try:
                if Path(psutil.Process(pid).exe()).name == "etcd":
                    return pid
            except psutil.Error:
                continue
        return None

    def _note_etcd(self) -> None:
        for h in SERVER_HOSTS:
            if (pid := self.etcd_pid(h)) is not None:
                self.seen_pids.add(pid)

    def restart_etcd(self, host: int) -> None:
        start_etcd_member(self.hosts, host, SERVER_HOSTS, state="existing")
        wait_listening(self.hosts, host, self.hosts.address(host), ETCD_PORT)
        self._note_etcd()

    def read_map(self) -> dict | None:
        try:
            return json.loads((self.client_dir / "map.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def wait_ready(self, since: float, least: int = 2) -> dict | None:
        """The first map read after ``since`` in which every bucket has a live primary and
        ``least`` in-sync copies (None after ``STALL_S``, or once the client died)."""
        deadline = time.monotonic() + STALL_S
        while time.monotonic() < deadline and self.client.poll() is None:
            seen = self.read_map()
            if (
                seen
                and seen["at"] > since
                and all(
                    b["primary"] is not None and len(b["in_sync"]) >= least
                    for b in seen["buckets"].values()
                )
            ):
                return seen
            time.sleep(0.1)
        return None


def _hogwild() -> str:
    return str(Path(sys.executable).with_name("hogwild"))


def inject(cluster: Cluster, kind: str, rng: random.Random, args, seen: dict) -> dict:
    """One fault of ``kind``, undone before it returns; what was done, and when."""
    hosts, buckets = cluster.hosts, seen["buckets"]
    at = time.time()
    if kind == "cut_primary":
        bucket = rng.choice(sorted(buckets))
        host = buckets[bucket]["primary"] + 1
        held = sorted(b for b, v in buckets.items() if v["primary"] == host - 1)
        at = time.time()
        hosts.cut(host)
        time.sleep(args.cut_s)
        hosts.heal(host)
        return {"kind": kind, "host": host, "primary_of": held, "at": at, "until": time.time()}
    if kind == "stall_copy":
        copies = sorted({s for v in buckets.values() for s in v["in_sync"][1:]})
        host = rng.choice(copies) + 1
        process = cluster.servers[host]
        at = time.time()
        os.kill(process.pid, signal.SIGSTOP)
        time.sleep(args.stall_s)
        os.kill(process.pid, signal.SIGCONT)
        return {"kind": kind, "host": host, "at": at, "until": time.time()}
    host = rng.choice(SERVER_HOSTS)
    if kind == "lose_host":
        at = time.time()
        hosts.lose(host)
        time.sleep(args.down_s)
        hosts.heal(host)
        cluster.restart_etcd(host)
        cluster.start_server(host)
    elif kind == "kill_etcd":
        pid = cluster.etcd_pid(host)
        at = time.time()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        time.sleep(args.down_s)
        cluster.restart_etcd(host)
    elif kind == "kill_role":
        at = time.time()
        cluster.servers[host].kill()
        cluster.servers[host].wait(10)
        cluster.start_server(host)
    else:
        raise ValueError(f"fault kind {kind!r}: expected one of {KINDS}")
    return {"kind": kind, "host": host, "at": at, "until": time.time()}


def longest_gap(acks: list[list[float]], start: float, end: float) -> float | None:
    """The longest time without an acknowledgement that overlaps ``[start, end]``: between two
    acknowledgements, or from the last one before ``start``; None if none came after."""
    times = sorted(acked for _, acked in acks)
    later = [t for t in times if t > start]
    if not later:
        return None
    before = [t for t in times if t <= start]
    times = ([before[-1]] if before else [start]) + later
    gaps = [b - a for a, b in zip(times, times[1:], strict=False) if a <= end]
    return round(max(gaps), 3) if gaps else None


def first_fresh_ack(acks: list[list[float]], at: float) -> float | None:
    """Seconds from ``at`` to the first acknowledgement of a push sent after ``at``."""
    fresh = [acked for sent, acked in acks if sent >= at]
    return round(min(fresh) - at, 3) if fresh else None


def measure(args) -> dict:
    rng = random.Random(args.seed)
    check = LeakCheck()
    started = time.monotonic()
    kinds = schedule(rng, args.faults, args.quick)
    events: list[dict] = []
    problems: list[str] = []
    result: dict = {}

    with tempfile.TemporaryDirectory(prefix="bench-partitions-") as tmp:
        folder = Path(tmp)
        hosts = Hosts(CLIENT_HOST)
        tag = hosts.tag
        cluster = None
        try:
            cluster = Cluster(hosts, folder, args.seed)
            _log(f"servers {cluster.addresses}, etcd {cluster.etcd}")
            since = 0.0
            for kind in kinds:
                seen = cluster.wait_ready(since)
                if seen is None:
                    problems.append(
                        f"stuck before fault {len(events) + 1} ({kind}): no map with a primary "
                        f"and a copy per bucket in {STALL_S:.0f} s"
                    )
                    break
                time.sleep(args.gap_s * rng.uniform(0.5, 1.5))
                event = inject(cluster, kind, rng, args, seen)
                event["pushes_before"] = seen.get("pushes")
                events.append(event)
                _log(f"{kind} on host {event['host']} ({len(events)}/{len(kinds)})")
                since = time.time()
            if cluster.wait_ready(since, least=3) is None:
                problems.append("the copies did not come back to three after the last fault")
            (cluster.client_dir / "stop").touch()
            try:
                cluster.client.wait(STALL_S + 60)
            except subprocess.TimeoutExpired:
                problems.append("the ledger client did not finish")
            try:
                result = json.loads((cluster.client_dir / "result.json").read_text())
            except (FileNotFoundError, json.JSONDecodeError) as exc:
                log = (folder / "client.log").read_text()[-2000:]
                problems.append(f"no ledger result ({exc!r}); client log: {log}")
        finally:
            pids = set(cluster.seen_pids) if cluster else set()
            hosts.close()
        processes = []
        for pid in pids:
            try:
                processes.append(psutil.Process(pid))
            except psutil.Error:
                continue
        leaked = check.count(processes, set())
        leaked["namespaces"] = sum(n.startswith(tag) for n in harness.namespaces())
    acks = result.get("acks", [])
    for e, following in zip(events, [*events[1:], None], strict=True):
        end = e["until"] + SETTLE_S
        if following is not None:  # a gap the next fault opened is that fault's
            end = min(end, following["at"])
        e["unavailable_s"] = longest_gap(acks, e["at"], end)
        if e["kind"] == "cut_primary":
            e["failover_s"] = first_fresh_ack(acks, e["at"])
    counts = {k: sum(e["kind"] == k for e in events) for k in KINDS}
    failover = spread([e.get("failover_s") for e in events if e["kind"] == "cut_primary"])
    lost, twice = result.get("acknowledged_lost"), result.get("applied_twice")
    problems += result.get("problems", [])
    leak_total = sum(leaked[k] for k in ("segments", "processes", "namespaces"))
    return {
        "benchmark": "partitions",
        "faults": counts | {"total": len(events)},
        "acknowledged_lost": lost,
        "applied_twice": twice,
        "failover_s": failover,
        "unavailable_s": {
            k: spread([e["unavailable_s"] for e in events if e["kind"] == k]) for k in KINDS
        },
        "test_accuracy": None,
        "fault_free_test_accuracy": None,
        "accuracy": "not measured: the training job's roles cannot yet be placed per host "
        "without the Ray launcher; the ledger client stands in for the job",
        "leaked": {k: leaked[k] for k in ("namespaces", "processes", "segments")}
        | {"detail": leaked["detail"]},
        "pushes": result.get("pushes"),
        "unknown_pushes": result.get("unknown_pushes"),
        "push_errors": result.get("errors", []),
        "problems": problems,
        "targets": {
            **TARGETS,
            "lost_met": lost == 0,
            "applied_twice_met": twice == 0,
            "faults_met": len(events) >= TARGETS["faults"],
            "failover_met": failover["max"] is not None
            and failover["max"] <= TARGETS["failover_max_s"]
            and not failover["unfinished"],
            "accuracy_met": None,
            "leaks_met": leak_total == 0,
        },
        "events": events,
        "settings": {
            "seed": args.seed,
            "quick": args.quick,
            "cut_s": args.cut_s,
            "stall_s": args.stall_s,
            "down_s": args.down_s,
            "gap_s": args.gap_s,
            "lease_s": LEASE_S,
            "hosts": "servers and etcd members on hosts 1-3, the ledger client on host 4",
        },
        "wall_s": round(time.monotonic() - started, 1),
        "machine": describe_machine(),
        "versions": versions(),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    why = harness.unavailable()
    if why is not None:
        print(f"python bench/figures/partitions.py: error: no namespace hosts: {why}",
              file=sys.stderr)  # fmt: skip
        return 2
    started = time.perf_counter()
    try:
        record = measure(args)
    except (RuntimeError, OSError, json.JSONDecodeError, subprocess.SubprocessError) as exc:
        print(f"python bench/figures/partitions.py: error: {exc}", file=sys.stderr)
        return 2
    emit_record(stamp(record, __file__, argv, started), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
