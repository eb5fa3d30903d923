"""Watching replicated parameter servers from outside: the bucket map, the takeovers, failovers.

:class:`ServerWatch` is what ``bench/figures/chaos_cluster.py`` (and its ledger phase) knows about a
job's replicated parameter servers (``copies > 1``, plugins/ps/replication/):

- the **map**, read from the job's etcd (``members/<i>``, ``sync/<b>``): each bucket's primary,
  epoch and the copies that really are in sync (:meth:`ServerWatch.buckets` says how a killed
  or restarted server is told from a live one);
- the **takeovers** every server reports in its status (``replication.takeovers``: bucket,
  epoch, ``won_at``, ``serving_at`` (its copies caught up) and ``first_ack_at``, wall-clock
  ``time.time()``), polled with a raw
  ``STATUS`` request per server every ``interval_s`` (a dead server just does not answer) and
  accumulated by ``(bucket, epoch)``: a server keeps only its last takeovers and forgets them
  all when it is killed, so the record of a winner killed later survives here.
  Call :meth:`ServerWatch.poll` right before killing a server, so that nothing it won is lost.

:meth:`ServerWatch.failover` turns a kill into figures: for a bucket whose primary was killed at
epoch ``e`` (the map read just before ``os.kill``), the failover ends at the first update
acknowledged after any takeover of a later epoch (``first_ack_at``), the takeover itself at its
``won_at``. Only buckets that hold shards are watched (the others never see an update).
"""

from __future__ import annotations

import json
import statistics
import threading
import time

from hogwild_plugins.ps.etcd import Etcd, EtcdUnavailable
from hogwild_plugins.ps.failover import BucketRecord
from hogwild_plugins.ps.routes import etcd_prefix

from hogwild.errors import HogwildError
from hogwild.net.channel import Peers, Request
from hogwild.net.wire import Header, MsgType, job_id

STATUS_TIMEOUT_S = 0.5  # a server that does not answer a STATUS within this is skipped


COPY_SIDE_COUNTERS = (
    "caught_up", "snapshots_received", "outdated_snapshots", "fenced", "not_caught_up",
    "catch_up_while_applying", "catch_up_while_restoring",
)  # fmt: skip


class ServerWatch:
    """A job's replicated parameter servers, seen from outside (see the module docstring).

    Args:
        servers: Every server's ``HOST:PORT``, by index.
        etcd: ``HOST:PORT`` of the job's etcd.
        job: The job's name.
        interval_s: Seconds between two polls of the statuses (:meth:`start`).
        alive: ``alive(index)``: whether server ``index``'s process runs (None: trust etcd).
        keys: CURVE key directory (servers beyond loopback).
    """

    def __init__(
        self,
        servers: list[str],
        etcd: str,
        job: str,
        interval_s: float = 0.3,
        alive=None,
        keys: str | None = None,
    ) -> None:
        self.servers, self.interval_s, self.alive = list(servers), interval_s, alive
        self.job_id = job_id(job)  # a server tells its status only to those naming its job
        self.etcd = Etcd(etcd, prefix=etcd_prefix(job))
        self.peers = Peers(self.servers, sender=0, timeout_s=STATUS_TIMEOUT_S, retries=0, keys=keys)
        self.takeovers: dict[tuple[int, int], dict] = {}
        self.n_buckets = 0
        self.shard_buckets: list[int] = []  # the buckets that hold shards
        self.polls = 0
        self.last: dict[int, dict] = {}  # each server's last status, in brief
        self.versions: dict[int, int] = {}  # shard -> highest version any server reported
        self.moved_at: dict[int, float] = {}  # shard -> when that version last went up
        self.members: list[int] = []  # the servers ``members/<i>`` named at the last map read
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- statuses --------------------------------------------------------------------------------

    def poll(self) -> int:
        """One round of STATUS requests; how many servers answered."""
        answers: dict[int, dict] = {}

        def keep(i: int):
            def on_reply(header, frames) -> None:
                if header.type == MsgType.JSON and frames:
                    try:
                        answers[i] = json.loads(bytes(memoryview(frames[0])).decode())
                    except (UnicodeDecodeError, json.JSONDecodeError):
                        pass

            return on_reply

        with self._lock:
            try:
                requests = [Request(i, Header(MsgType.STATUS, job=self.job_id), (), keep(i))
                            for i in range(len(self.servers))]  # fmt: skip
                self.peers.exchange(requests)
            except HogwildError:  # a dead server: the others' answers are kept
                pass
            for i, status in answers.items():
                self._take(i, status)
            self.polls += 1
        return len(answers)

    def _take(self, server: int, status: dict) -> None:
        if not self.n_buckets:
            self.n_buckets = int(status["n_buckets"])
            self.shard_buckets = sorted({s % self.n_buckets for s in range(status["n_shards"])})
        now = time.monotonic()
        for shard in status.get("shards", []):
            index, version = int(shard["shard"]), int(shard["version"])
            if version > self.versions.get(index, -1):
                self.versions[index], self.moved_at[index] = version, now
        replication = status.get("replication") or {}
        self.last[server] = {
            "uptime_s": status.get("uptime_s"),
            "roles": {b: replication.get("roles", {}).get(str(b)) for b in self.shard_buckets},
            "versions": {s["shard"]: s["version"] for s in status.get("shards", [])},
            # updates its memory took, by shard (restores aside): a double apply's fingerprint
            "applied": {s["shard"]: s.get("applied") for s in status.get("shards", [])},
            "campaigns_won": replication.get("campaigns_won"),
            "failure": replication.get("failure"),
            # how its copy side was caught up and what it refused (a fault run's post-mortem)
            "copy_side": {k: replication.get(k) for k in COPY_SIDE_COUNTERS},
        }
        for entry in replication.get("takeovers", []):
            key = (int(entry["bucket"]), int(entry["epoch"]))
            known = self.takeovers.setdefault(key, {"server": server, **entry})
            for moment in ("serving_at", "first_ack_at"):  # (a server before serving_at: none)
                if known.get(moment) is None and entry.get(moment) is not None:
                    known[moment] = entry[moment]

    def start(self) -> ServerWatch:
        """Poll in a background thread until :meth:`stop`."""
        deadline = time.monotonic() + 120
        while not self.shard_buckets:  # the layout comes with the first answer
            if self.poll() == 0 and time.monotonic() > deadline:
                raise RuntimeError(f"no parameter server of {self.servers} answers STATUS")
            time.sleep(0.05)
        self._thread = threading.Thread(target=self._run, name="bench-ps-watch", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        with self._lock:
            self.peers.close()
        self.etcd.close()

    def snapshot(self) -> dict:
        """Each server's last status in brief (roles of the buckets holding shards, versions),
        polled now: what a report of a stuck map quotes."""
        self.poll()
        with self._lock:
            return {i: dict(v) for i, v in self.last.items()}

    # -- the map ---------------------------------------------------------------------------------

    def buckets(self) -> dict[int, dict]:
        """For each bucket holding shards: ``primary`` (None: none live), ``epoch`` and
        ``in_sync``, the copies that hold every acknowledged update now.

        A server counts only while ``alive(index)`` (when given) and ``members/<i>`` name it: a
        killed server stays a member until its lease ends. The primary must hold the record's
        lease. Another copy counts only if it registered before the record was last written, or
        the primary's last STATUS (in the record's epoch) says it caught that copy up under the
        lease the copy holds now: one restarted since (its memory is new) stays in ``in_sync``
        until the primary writes it out and, once caught up, back in; one the primary could not
        write out (that would leave fewer than its minimum of copies) is caught up again without
        a write, and only the primary can tell.
        """
        entries, _ = self.etcd.get_prefix("")
        members: dict[int, tuple[int, int]] = {}  # server -> (its lease, its key's revision)
        records: dict[int, BucketRecord] = {}
        for key, (value, revision) in entries.items():
            kind, _, index = key.partition("/")
            if kind == "members" and index.isdigit():
                members[int(index)] = (value.get("lease"), revision)
            elif kind == "sync" and index.isdigit() and int(index) in self.shard_buckets:
                where = f"etcd key {key}"
                records[int(index)] = BucketRecord.parse(value, revision, len(self.servers), where)
        live = {s for s in members if self.alive is None or self.alive(s)}
        self.members = sorted(members)
        out = {}
        for b in self.shard_buckets:
            record = records.get(b)
            if record is None:
                out[b] = {"primary": None, "epoch": 0, "in_sync": []}
                continue
            primary = record.primary
            if primary not in live or members[primary][0] != record.lease:
                primary = None
            confirmed = self._confirmed_by(primary, b, record.epoch)
            copies = [s for s in record.in_sync if s != record.primary and s in live
                      and (members[s][1] < record.revision
                           or (members[s][0] is not None
                               and confirmed.get(str(s)) == members[s][0]))]  # fmt: skip
            out[b] = {
                "primary": primary,
                "epoch": record.epoch,
                "in_sync": ([primary] if primary is not None else []) + copies,
            }
        return out

    def _confirmed_by(self, primary: int | None, bucket: int, epoch: int) -> dict[str, int]:
        """The copies ``primary``'s last STATUS said it caught up as ``bucket``'s primary in
        ``epoch``, each with the lease it was caught up under (none known: empty)."""
        if primary is None:
            return {}
        role = (self.last.get(primary) or {}).get("roles", {}).get(bucket) or {}
        if role.get("role") != "primary" or role.get("epoch") != epoch:
            return {}
        return role.get("confirmed") or {}

    def wait_copies(self, least: int, timeout_s: float, alive=None) -> tuple[float, dict | None]:
        """Until every bucket holding shards has a live primary and ``least`` live in-sync
        copies: (seconds waited, the map then; None if ``timeout_s`` passed first, or
        ``alive()`` said the job is over)."""
        started = time.monotonic()
        while alive is None or alive():
            try:
                seen = self.buckets()
            except (EtcdUnavailable, HogwildError):
                seen = None
            ready = seen is not None and all(
                v["primary"] is not None and len(v["in_sync"]) >= least for v in seen.values()
            )
            waited = time.monotonic() - started
            if ready:
                return waited, seen
            if waited > timeout_s:
                return waited, None
            time.sleep(0.05)
        return time.monotonic() - started, None

    def wait_flowing(self, timeout_s: float, alive=None) -> tuple[float, bool]:
        """Until every shard's version went up (updates are being acknowledged): (seconds
        waited, whether they were; False after ``timeout_s`` or once ``alive()`` is False)."""
        started = time.monotonic()
        while alive is None or alive():
            with self._lock:
                moved = [self.moved_at.get(s, 0.0) for s in self.versions] or [0.0]
            waited = time.monotonic() - started
            if min(moved) > started:
                return waited, True
            if waited > timeout_s:
                return waited, False
            time.sleep(0.05)
        return time.monotonic() - started, False

    # -- figures ---------------------------------------------------------------------------------

    def failover(self, killed_at: float, bucket: int, epoch: int) -> dict:
        """Seconds from a kill of ``bucket``'s primary (at ``epoch``) to the next takeover's win
        and to its first acknowledged update (None: not seen)."""
        with self._lock:
            later = [t for (b, e), t in self.takeovers.items() if b == bucket and e > epoch]
        won = [t["won_at"] for t in later]
        acked = [t["first_ack_at"] for t in later if t["first_ack_at"] is not None]
        return {
            "bucket": bucket,
            "epoch": epoch,
            "takeover_s": round(min(won) - killed_at, 3) if won else None,
            "failover_s": round(min(acked) - killed_at, 3) if acked else None,
            "later_takeovers": len(later),
        }


def spread(values: list[float | None]) -> dict:
    """``{"median", "max", "n"}`` of the measured values, and how many were never measured."""
    seen = [v for v in values if v is not None]
    return {
        "median": round(statistics.median(seen), 3) if seen else None,
        "max": round(max(seen), 3) if seen else None,
        "n": len(seen),
        "unfinished": len(values) - len(seen),
    }
