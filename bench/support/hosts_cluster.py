"""The hosts of ``bench/figures/partitions.py``: a replicated ledger job, an etcd cluster and the
training job, on four network-namespace hosts, and the handles the fault injector works through.

:class:`HostsCluster` puts one member of a three-member etcd cluster and one ``hogwild ps serve
--copies 3`` of the *ledger* job on each of hosts 1 to 3 (bound to the host's address, under CURVE
keys it makes), the ledger client (:mod:`bench.support.ledger_client`) on host 4, and, with the Ray
launcher, a Ray head without CPUs on host 4 and a node of ``RAY_CPUS`` on each of hosts 1 to 3. It
keeps every process of the run it ever saw (:attr:`HostsCluster.seen`, counted for leaks once the
hosts close) and every role process of each training job (:attr:`HostsCluster.job_processes`),
names a training role's host, stops and continues process groups (whatever a stall stopped is
continued on every exit path: :meth:`HostsCluster.continue_stalled`), restarts etcd members and
ledger servers, and reads the bucket map the ledger client publishes to tell when the next fault
may start (:meth:`HostsCluster.wait_ready`). The hosts themselves
(:class:`tests.hosts.harness.Hosts`) are its caller's: it closes nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from hogwild_plugins.ps.serving.options import DEFAULT_LEASE_S

from bench.support.cluster_run import ClusterRun
from tests.hosts.harness import Hosts
from tests.hosts.ray_nodes import (
    ETCD_PORT,
    start_etcd_cluster,
    start_etcd_member,
    start_ray,
    wait_listening,
)

SERVER_HOSTS = [1, 2, 3]
CLIENT_HOST = 4
PS_PORT = 7100
LEASE_S = DEFAULT_LEASE_S  # the ledger servers' etcd lease: ``ps serve``'s default (2 s), the one
# the training job beside them gets from this given etcd too; --lease-s 1 (this etcd cluster's
# timers honour it) made a cut primary's failover about 1.8 s shorter (docs/benchmarks.md)
LEDGER_JOB = "ledger"  # the ledger servers' job name in etcd (the training job's differs)
READY_WITHIN_S = 120.0
RAY_CPUS = 4  # logical CPUs of each role node: two nodes take every role while one is lost
STALL_S = 90.0  # no ready map for this long (or twice the servers' measured start): stuck
ROOT = Path(__file__).resolve().parents[2]


class HostsCluster:
    """Servers and etcd members on hosts 1 to 3, the ledger client on host 4."""

    def __init__(self, hosts: Hosts, folder: Path, launcher: str) -> None:
        self.hosts, self.folder = hosts, folder
        self.seen: dict[int, psutil.Process] = {}  # every process of the run, kept as seen
        self.servers: dict[int, subprocess.Popen] = {}
        self.job: ClusterRun | None = None  # the training job under the faults
        self.job_processes: dict[str, dict[int, psutil.Process]] = {}  # job -> its roles seen
        self.servers_start_s = 0.0  # what the ledger servers took to listen, measured
        self.stall_s = STALL_S  # (--stuck-s)
        self.lease_s = LEASE_S  # the ledger servers' (--lease-s)
        self.stalled: list[tuple[int, bool]] = []  # (pid, its process group?) SIGSTOPped now
        self.keys = folder / "keys"
        subprocess.run([_hogwild(), "ps", "keys", str(self.keys)], check=True,
                       capture_output=True, timeout=60)  # fmt: skip
        self.etcd = start_etcd_cluster(hosts, SERVER_HOSTS)
        self._note_etcd()
        self.addresses = [f"{hosts.address(h)}:{PS_PORT}" for h in SERVER_HOSTS]
        self.ray_address = ""  # the Ray cluster's GCS: its head in host 4, without CPUs
        if launcher == "ray":  # (no role there), a node of RAY_CPUS in each of hosts 1 to 3
            self.ray_address = start_ray(hosts, [CLIENT_HOST, *SERVER_HOSTS], RAY_CPUS, 0)

    def start_ledger(self, seed: int, push_every_s: float) -> None:
        """The ledger servers on hosts 1 to 3, the ledger client on host 4."""
        hosts, folder = self.hosts, self.folder
        started = time.monotonic()
        for h in SERVER_HOSTS:
            self.start_server(h)
        within_s = max(READY_WITHIN_S, self.stall_s)
        for h in SERVER_HOSTS:
            wait_listening(hosts, h, hosts.address(h), PS_PORT, within_s=within_s)
        self.servers_start_s = time.monotonic() - started
        self.client_dir = folder / "client"
        self.client_dir.mkdir()
        argv = [sys.executable, "-m", "bench.support.ledger_client", "--servers",
                ",".join(self.addresses), "--etcd", self.etcd, "--keys", str(self.keys),
                "--dir", str(self.client_dir), "--seed", str(seed),
                "--job", LEDGER_JOB, "--push-every-s", str(push_every_s)]  # fmt: skip
        with open(folder / "client.log", "ab") as log:
            self.client = hosts.run(
                CLIENT_HOST, argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
            )
        self._note(self.client.pid)

    def start_server(self, host: int) -> None:
        argv = [_hogwild(), "ps", "serve", "--bind", self.hosts.address(host), "--port",
                str(PS_PORT), "--servers", ",".join(self.addresses), "--index", str(host - 1),
                "--copies", "3", "--etcd", self.etcd, "--lease-s", str(self.lease_s), "--threads",
                "1", "--keys", str(self.keys), "--job", LEDGER_JOB]  # fmt: skip
        with open(self.folder / f"ps{host}.log", "ab") as log:
            process = self.hosts.run(host, argv, stdout=log, stderr=subprocess.STDOUT)
        self.servers[host] = process
        self._note(process.pid)

    def _note(self, pid: int) -> None:
        """Keep the process, not its pid: after it ends the pid may be another's, and its
        start time (kept by psutil) tells which segments were its."""
        try:
            self.seen.setdefault(pid, psutil.Process(pid))
        except psutil.Error:
            pass  # gone before it was seen: nothing of it can be told apart

    def job_roles(self, host: int | None = None) -> list[tuple[str, int]]:
        """The training job's live roles now (those in host ``host``): (name, pid)."""
        if self.job is None or not self.job.running():
            return []
        self.note_job_roles(self.job)
        roles = self.job.roles_file().get("roles", [])
        names = [r["name"] for r in roles if host is None or self.host_of(r) == host]
        return [(n, pid) for n in names if (pid := self.job.pid_of(n)) is not None]

    def host_of(self, role: dict) -> int:
        """The host a role of the training job runs in (the local launcher's: the client's)."""
        where = role.get("host")
        for h in SERVER_HOSTS:
            if where == self.hosts.address(h):
                return h
        return CLIENT_HOST

    def note_job_roles(self, run: ClusterRun) -> None:
        """Keep every role process of ``run`` seen (they are counted when it ends)."""
        seen = self.job_processes.setdefault(run.job_name, {})
        for role in run.roles_file().get("roles", []):
            pid = role.get("pid")
            if pid and pid not in seen:
                try:
                    seen[pid] = psutil.Process(pid)
                except psutil.Error:
                    pass  # gone already: its driver saw to it

    def continue_stalled(self) -> None:
        """SIGCONT to whatever a stall left stopped (a stall cut short by a signal or an
        error must not leave servers stopped behind it)."""
        while self.stalled:
            pid, group = self.stalled.pop()
            if group:
                self.stop_group(pid, signal.SIGCONT)
            else:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass

    def stop_group(self, pid: int, signum: int) -> None:
        """``signum`` to a training role's process group (a role leads its own)."""
        try:
            os.killpg(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass  # it died meanwhile (its driver restarts it)

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
                self._note(pid)

    def restart_etcd(self, host: int) -> None:
        start_etcd_member(self.hosts, host, SERVER_HOSTS, state="existing")
        wait_listening(self.hosts, host, self.hosts.address(host), ETCD_PORT)
        self._note_etcd()

    def read_map(self) -> dict | None:
        try:
            return json.loads((self.client_dir / "map.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def ready_within_s(self) -> float:
        """How long a wait for a ready map may last before the run is stuck: ``STALL_S``, or
        twice what the ledger servers took to start in this run if more (a server a fault
        restarts starts as slowly, then catches up; on a loaded machine a start took 75 s)."""
        return max(self.stall_s, 2 * self.servers_start_s)

    def wait_ready(self, since: float, least: int = 2) -> dict | None:
        """The first map read after ``since`` in which every bucket has a live primary and
        ``least`` in-sync copies and a push was acknowledged after ``since`` (so that each
        fault starts on updates that flow, and a gap is the fault's own); None after
        :meth:`ready_within_s`, or once the client died."""
        deadline = time.monotonic() + self.ready_within_s()
        while time.monotonic() < deadline and self.client.poll() is None:
            seen = self.read_map()
            if (
                seen
                and seen["at"] > since
                and (seen.get("last_ack") or 0.0) > since
                and all(
                    b["primary"] is not None and len(b["in_sync"]) >= least
                    for b in seen["buckets"].values()
                )
            ):
                return seen
            time.sleep(0.1)
        return None

    def stuck_report(self, since: float, least: int = 2) -> dict:
        """Why a :meth:`wait_ready` from ``since`` for ``least`` copies ended without a ready
        map: the last map the client published (its age, the buckets short of a primary or of
        copies, the last acknowledgement's age), which processes are alive, and the tails of the
        client's, the ledger servers' and the etcd members' logs (the run's folder and the
        hosts' homes are gone once it ends, so the record keeps them)."""
        now, seen = time.time(), self.read_map()
        last_map = None
        if seen is not None:
            last_ack = seen.get("last_ack")
            last_map = {
                "age_s": round(now - seen["at"], 1),
                "last_ack_age_s": None if last_ack is None else round(now - last_ack, 1),
                "acknowledged_since_wait": (last_ack or 0.0) > since,
                "pushes": seen.get("pushes"),
                "members": seen.get("members"),
                "etcd_leader": seen.get("etcd_leader"),
                "buckets_short": sorted(
                    b
                    for b, v in seen["buckets"].items()
                    if v["primary"] is None or len(v["in_sync"]) < least
                ),
                "buckets": {  # every bucket's primary, in-sync copies and epoch
                    b: [v["primary"], v["in_sync"], v.get("epoch")]
                    for b, v in seen["buckets"].items()
                },
                "roles": seen.get("roles"),  # each server's word, by bucket
            }
        logs = {"client": log_tail(self.folder / "client.log")}
        for h in SERVER_HOSTS:
            logs[f"ps{h}"] = log_tail(self.folder / f"ps{h}.log")
            logs[f"etcd{h}"] = log_tail(self.hosts.home(h) / "etcd.log")
        return {
            "least": least,
            "waited_s": round(now - since, 1),
            "map": last_map,
            "client_alive": self.client.poll() is None,
            "servers_alive": {h: p.poll() is None for h, p in self.servers.items()},
            "etcd_alive": {h: self.etcd_pid(h) is not None for h in SERVER_HOSTS},
            "logs": logs,
        }


LOG_TAIL_CHARS = 1500  # of each log in a stuck report: its last lines, where a wait ended


def log_tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str | None:
    """The last ``chars`` bytes of the log at ``path``, as text (None: not there)."""
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - chars))
            return log.read().decode("utf-8", "replace")
    except OSError:
        return None  # not written (a process that never started), or its host's home gone


def stuck_brief(report: dict) -> str:
    """A :meth:`HostsCluster.stuck_report` in a line (its log tails are in the record)."""
    seen = report["map"]
    if seen is None:
        where = "no map published"
    else:
        short = [f"{b} {seen['buckets'][b]}" for b in seen["buckets_short"]]  # [primary,
        ack = seen["last_ack_age_s"]  # in-sync copies, epoch]
        where = (
            f"last map {seen['age_s']} s old, buckets short of a primary or {report['least']} "
            f"in-sync servers: {', '.join(short) or 'none'}, last acknowledgement "
            + ("never" if ack is None else f"{ack} s ago")
        )
    return (
        f"{where}; alive: client {report['client_alive']}, ledger servers "
        f"{report['servers_alive']}, etcd members {report['etcd_alive']}"
    )


def _hogwild() -> str:
    return str(Path(sys.executable).with_name("hogwild"))
