"""The threads of a server's replication: they carry out what the state machines decide.

A :class:`Replication` owns the machines (every bucket's
:class:`~hogwild_plugins.ps.replication.bucket_role.BucketRole`, the primary's
:class:`~hogwild_plugins.ps.replication.commit_round.CommitRound`, the copy's
:class:`~hogwild_plugins.ps.replication.copy_side.CopySide`) and the shard logs they share, and
decides nothing itself:

* the **heartbeat** (:mod:`~hogwild_plugins.ps.replication.membership`) keeps the server's etcd
  lease;
* the **replication thread** reads the map from etcd whenever it changes (a watch) and feeds it to
  each bucket's role (:mod:`~hogwild_plugins.ps.replication.map_reads`: the reads, and the
  ``MapRead`` each role is told), carries out what the roles return (campaigns, in-sync writes and
  hand-overs as etcd transactions, snapshots to copies, commits of what was prepared), and runs
  the commit rounds of the client updates of the buckets this server is primary of: it admits
  them, applies them here (the update engine), exchanges the prepares and commits with the
  copies and answers the clients, as the round says. Updates that arrive together go together:
  one round of prepares and one of commits per batch. Both are carried out by the executor the
  simulator runs too (:mod:`~hogwild_plugins.ps.replication.executor`): this class gives it the
  bucket roles' effects, :mod:`~hogwild_plugins.ps.replication.primary_round` a round's;
* the **snapshot thread** (:mod:`~hogwild_plugins.ps.replication.snapshot_sender`) sends the
  snapshots the replication thread took for a role's ``Sync`` (the engine's barrier and the copy
  of every shard of the bucket are taken there, on the replication thread:
  :mod:`~hogwild_plugins.ps.replication.sync_parcels`) and waits for the copy's answers, one
  parcel at a time, in order: a bucket whose copy needs a snapshot waits behind the parcels
  queued before its own, a frozen copy's too. The replication thread tells the role what came
  of each at its next turn, and runs the other buckets' rounds meanwhile
  (the synced bucket serves neither reads nor writes until then). An error on that thread fails
  the server over, as one on the replication thread does;
* the **network thread** (the server's router) hands a primary's ``PREPARE``, ``COMMIT`` and
  ``SNAPSHOT`` to the copy side and answers with what it returns
  (:mod:`~hogwild_plugins.ps.replication.copy_adapter`; a message whose record must be read
  again from etcd goes to that adapter's refresher thread: the network thread never waits on
  etcd); it answers client pulls and reductions of a bucket it is the serving primary of, past
  a takeover's wait for reads (those inside it are refused ``READS_WAITING``: the client sends
  them here again after a pause), and refuses the rest with ``NOT_PRIMARY`` (the client
  re-reads the map): those answers are :mod:`~hogwild_plugins.ps.replication.admission`'s.

The primary's messages to its copies go through
:mod:`~hogwild_plugins.ps.replication.peer_link`, work queued on this server's own update engine
through :mod:`~hogwild_plugins.ps.replication.local`.

Every write is replicated this way: parameter updates and assignments, pushes into named
vectors and vector operations that write (``axpy``, ``scale``, ``copy``, ``mul``, ``fill``); each
takes the shard's next version. Reductions (``dot``, ``asum``, ``amax``) are answered by the
serving primary alone, like pulls. A snapshot carries a shard's values, the rule's state, its
named vectors and its request table (:mod:`~hogwild_plugins.ps.replication.frames`): a client
that re-sends an unacknowledged update to a new primary gets the version it already has instead
of a second application.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator

from hogwild_plugins.ps.etcd import Etcd, keepalive_s
from hogwild_plugins.ps.etcd_cas import write_retry_s
from hogwild_plugins.ps.etcd_process import ELECTION_MS
from hogwild_plugins.ps.failover import LeaseClock, lease_now
from hogwild_plugins.ps.replication.admission import Admitting
from hogwild_plugins.ps.replication.bucket_role import BucketRole
from hogwild_plugins.ps.replication.bucket_role_events import (
    Campaign,
    HandOver,
    Remembered,
    Stopped,
    Sync,
)
from hogwild_plugins.ps.replication.commit_round import CommitRound
from hogwild_plugins.ps.replication.commit_round_events import Update
from hogwild_plugins.ps.replication.copy_adapter import CopyAdapter
from hogwild_plugins.ps.replication.copy_side import CopySide, commit_log
from hogwild_plugins.ps.replication.executor import carry_out, run, run_round
from hogwild_plugins.ps.replication.local import LocalApplier
from hogwild_plugins.ps.replication.map_reads import EtcdMap, map_read
from hogwild_plugins.ps.replication.marks import BucketMarks
from hogwild_plugins.ps.replication.membership import Membership, unlisted_and_unrecorded
from hogwild_plugins.ps.replication.peer_link import PEER_SENDER, PeerLink
from hogwild_plugins.ps.replication.primary_round import Pending, PrimaryRound
from hogwild_plugins.ps.replication.start_asks import ask_at_start
from hogwild_plugins.ps.replication.sync_parcels import SyncParcels
from hogwild_plugins.ps.replication.takeover_times import TakeoverTimes
from hogwild_plugins.ps.routes import etcd_prefix, write_record
from hogwild_plugins.ps.shard_log import ShardLog

from hogwild.errors import HogwildError
from hogwild.net.router import Incoming, Reply, error_reply

__all__ = ["PEER_SENDER", "Replication", "auto_min_copies"]

POLL_S = 0.5  # the map is read at least this often, watch or not
MAP_TIMEOUT_S = 2.0  # each map client's requests, read-backs included (the etcd client's default)
FAILOVER_POLL_S = 0.05  # the watch's safety polls while its stream is up (see start())
MAX_BATCH = 256
SETTLE_S = 5.0  # a bucket's first primary waits this long for every server to register


def auto_min_copies(copies: int) -> int:
    """``ps.min_copies = 0``: half the copies, rounded up (2 of 3, as Kafka's usual
    ``min.insync.replicas`` with three replicas; 1 of 2, so that one server's loss leaves a
    two-copy job writable)."""
    return (copies + 1) // 2


class Replication(Admitting):
    """One server's replication (see the module docstring).

    Args:
        server: The :class:`~hogwild_plugins.ps.serving.server.ParameterServer` (its layout, shards,
            book, engine and router; it holds every shard).
        etcd: ``HOST:PORT`` of the job's etcd.
        copies: Copies of every bucket (2 or more; at most the number of servers).
        lease_s: TTL of the server's etcd lease: how long a dead server goes unnoticed.
    """

    def __init__(
        self, server, etcd: str, copies: int, lease_s: int = 2, min_copies: int = 0
    ) -> None:
        options = server.options
        if not 2 <= copies:
            raise HogwildError(f"copies = {copies}: replication needs 2 or more")
        min_copies = min_copies or auto_min_copies(copies)
        if not 1 <= min_copies <= copies:
            raise HogwildError(
                f"ps.min_copies = {min_copies} must be in [1, copies = {copies}] (0: automatic)"
            )
        if copies > len(options.servers):
            raise HogwildError(
                f"copies = {copies} needs at least as many parameter servers "
                f"({len(options.servers)} listed)"
            )
        self.server, self.etcd_address = server, etcd
        self.copies, self.lease_s = copies, int(lease_s)
        self.me, self.n_servers = options.index, len(options.servers)
        layout = server.layout
        self.layout = layout
        self.bucket_shards = {b: [] for b in range(layout.n_buckets)}
        for shard in range(layout.n_shards):
            self.bucket_shards[layout.bucket_of(shard)].append(shard)
        self.min_copies = min_copies
        self.roles = {
            b: BucketRole(
                b, self.me, copies, min_copies, empty=not self.bucket_shards[b], lease_ttl=lease_s
            )
            for b in range(layout.n_buckets)
        }
        self.logs = {s: ShardLog(committed=server.book.version(s)) for s in range(layout.n_shards)}
        # the logs, and a role's observe against what the network thread (a copy's side) changes
        # in it (a snapshot's restore, a refreshed record): network and replication threads
        self.lock = threading.Lock()
        self._stimuli = itertools.count()
        # the newest epoch of each bucket's record seen, in the server's store if it has one:
        # a process started on it never takes a missing record for a new bucket
        self.marks = BucketMarks(server.store, layout.n_buckets, self.n_servers)
        for bucket, (epoch, primary, lease) in self.marks.remembered.items():
            self.roles[bucket].handle(
                Remembered(epoch, primary, lease, stimulus_id=self._stimulus("store"))
            )
        self.clock = LeaseClock()  # the membership's, once started
        self.membership: Membership | None = None
        self.queue: queue.SimpleQueue[Pending] = queue.SimpleQueue()
        self._stopping: queue.SimpleQueue[int] = queue.SimpleQueue()  # buckets for their roles
        self.changed = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._etcd: Etcd | None = None  # the replication thread's
        self._net_etcd: Etcd | None = None  # the network thread's (refreshing a record)
        self._watch = None
        # the map's reads, the job's nonce as the last one found it
        self.map = EtcdMap(self.n_servers, layout.n_buckets, self.roles, self.lock, self.marks)
        self.replier = None
        self.copy_side = CopySide(self.me, self.roles, self.logs, self.bucket_shards)
        self.commit_round = CommitRound(self.me, self.roles, self.logs)
        self.local = LocalApplier(server)
        # the lease read when a message goes out: the membership's clock, once started
        self.link = PeerLink(
            server.job, layout, self.roles, lambda: self.clock.lease, self._stimulus
        )
        self.copy_adapter = CopyAdapter(
            server,
            self.copy_side,
            self.roles,
            self.lock,
            self.local,
            lambda bucket: self.map.record(self._net_etcd, bucket),
            self.changed.set,
            self._stimulus,
            self.commit_round.applying,
            lambda: self.failure,  # set before the replication thread stops this server
        )
        self.counters = {
            "snapshots_sent": 0,
            "copies_caught_up": 0,  # shards a copy was found to hold already: no snapshot
            "not_primary": 0,
            "too_few_copies": 0,
            "reads_waiting": 0,  # pulls refused while a takeover waits out its predecessor
            "campaigns_won": 0,
            "handed_over": 0,
        }
        self.syncs = SyncParcels(
            server,
            self.roles,
            self.logs,
            self.bucket_shards,
            self.lock,
            self.local,
            self.commit_round,
            lambda: self.clock.lease,
            self._stimulus,
            self.counters,
            self._snapshot_thread_failed,
            self.changed.set,
        )
        self.failure: str | None = None
        self.etcd_errors = 0
        self.last_etcd_error: str | None = None
        self.takeovers = TakeoverTimes()  # the last takeovers: bucket, epoch, wall-clock times

    # ------------------------------------------------------------------ lifecycle

    def start(self, stopping: Callable[[], bool] = lambda: False) -> None:
        """Read the job's nonce and register with etcd (a lease, ``members/<index>``), each asked
        again while etcd does not answer (``stopping()``: a stop asked for meanwhile, which ends
        those retries), start the heartbeat and the replication thread. Call after the server's
        router and engine started."""
        prefix = etcd_prefix(self.server.options.job, self.server.options.etcd_group)
        tls = self.server.options.etcd_tls
        # its own host's etcd member first, if it has one: a cut of another host never makes
        # this server wait on that host's member (a keepalive stuck there outlasts the lease)
        near = self.server.address.host
        # a map write (a copy dropped, a takeover) forwarded to a leader that is gone is lost
        # unanswered: it is read back after two election timeouts (the members' own, where the
        # job set them: cluster.etcd_election_ms; at most a third of the 2 s, leaving the
        # read-back its asks) and asked again if it did not apply, not waited on for the whole
        # 2 s (etcd_cas)
        retry = write_retry_s(self.server.options.etcd_election_ms or ELECTION_MS, MAP_TIMEOUT_S)
        self._etcd = Etcd(self.etcd_address, prefix=prefix, tls=tls, near=near,
                          timeout_s=MAP_TIMEOUT_S, write_retry_s=retry)  # fmt: skip
        self._net_etcd = Etcd(self.etcd_address, prefix=prefix, tls=tls, near=near,
                              timeout_s=MAP_TIMEOUT_S, write_retry_s=retry)  # fmt: skip
        # its keepalives are asked again (hedged) after a quarter of the lease, the first kept
        # open: a follower forwarding one to its cut leader would hold it past the lease
        self._keeper_etcd = Etcd(
            self.etcd_address, prefix=prefix, tls=tls, near=near,
            keepalive_s=keepalive_s(self.lease_s),
        )  # fmt: skip
        ask_at_start(
            lambda: self.map.start(self._etcd), "first read of the map", self.me, stopping=stopping
        )
        servers, keys = list(self.server.options.servers), self.server.options.keys
        self.link.open(servers, self.me, keys)
        self.replier = self.server.router.replier()
        self.started_at = lease_now()  # (the clock of _observe's settled)
        self.membership = Membership(
            self._keeper_etcd,
            self.me,
            str(self.server.address),
            self.lease_s,
            self.changed.set,
            lambda: sorted(b for b, role in self.roles.items() if role.seen),
        )
        self.clock = self.membership.clock
        self.membership.start(stopping=stopping)
        # The failover waits on this watch: it keeps the 50 ms safety polls beside the stream.
        # With the default 0.5 s, ten cuts of a primary's host (bench/figures/partitions.py
        # --kinds cut_primary) were taken over 0.6-0.7 s later (median) than with 50 ms polls:
        # the stream did not hear the lapsed leases in time there, cause not found yet.
        self._watch = self._etcd.watch("", self.changed.set, slow_interval_s=FAILOVER_POLL_S)
        self.copy_adapter.start(self.server.router.replier)
        self.syncs.start(servers, self.me, keys)
        thread = threading.Thread(target=self._run, name="hogwild-replicate", daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        """Stop the threads and give the lease back (the others take over at once)."""
        self._stop.set()
        if self.membership is not None:
            self.membership.stop()
        for thread in self._threads:
            thread.join(timeout=10)
        self.syncs.stop()
        self.copy_adapter.stop()
        if self._watch is not None:
            self._watch.cancel()
        if self.membership is not None:
            self.membership.revoke()  # the others take over at once
        for etcd in (self._etcd, self._net_etcd, self._keeper_etcd):
            if etcd is not None:
                etcd.close()
        if self.replier is not None:
            self.replier.close()
            self.replier = None
        self.link.close()
        self.syncs.close()

    _keeper_etcd: Etcd | None = None

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    # ------------------------------------------------------------------ network thread

    def bucket_stopped(self, bucket: int) -> None:
        """A write failed to apply to ``bucket`` after its acknowledgement or commit (any
        thread): its role hears of it on the replication thread, which carries out the
        hand-over (etcd I/O, never on an update thread)."""
        self._stopping.put(bucket)
        self.changed.set()

    def handle_peer(self, request: Incoming) -> Reply:
        """A primary's ``PREPARE``, ``COMMIT`` or ``SNAPSHOT`` to this copy (the network
        thread: :class:`~hogwild_plugins.ps.replication.copy_adapter.CopyAdapter`)."""
        return self.copy_adapter.handle_peer(request)

    # ------------------------------------------------------------------ replication thread

    def _run(self) -> None:
        last_read = 0.0
        try:
            while not self._stop.is_set():
                if self.failure is not None:  # the snapshot thread failed, or we were replaced
                    self._fail_over()
                    return
                now = time.monotonic()
                if self.changed.is_set() or now - last_read > POLL_S:
                    self.changed.clear()
                    last_read = now
                    try:
                        self._stop_buckets()
                        self._observe()
                    except HogwildError as exc:  # etcd unreachable or slow, a bad record:
                        self.etcd_errors += 1  # the lease lapses by the clock; read again
                        self.last_etcd_error = str(exc)
                        self.changed.set()
                        time.sleep(0.05)
                    if self.failure is not None:  # the read found this server replaced: stop
                        continue  # now, taking no batch and finishing no restore first
                batch = self._take(0.02)
                if batch:
                    self._process(batch)
                self.syncs.tell_roles(self, self._carry_out)
                self.copy_adapter.finish_restores(self._send, self._stop_buckets)
        except Exception as exc:  # noqa: BLE001 - a bug: hand every bucket to the others
            self._decide_to_stop(f"{type(exc).__name__}: {exc}")
            self._fail_over()
            raise

    def _decide_to_stop(self, why: str) -> None:
        """This server stops (``why``: the driver replaced it, or its replication failed): from
        now on it is not valid (it serves nothing), and the replication thread fails it over
        at its next turn. :attr:`failure` is set under :attr:`lock`, the lock every step of a
        primary's message through the copy side is taken under, which checks it there: each
        message is taken whole before this decision or refused ``REPLACED`` after it."""
        with self.lock:
            if self.failure is None:  # the first reason stands (a failing fail-over adds one)
                self.failure = why

    def _fail_over(self) -> None:
        """This server failed (:attr:`failure`): stop, hand every bucket to the others, and
        answer the client updates still queued ``NOT_PRIMARY`` (none was acknowledged): their
        clients re-read the map at once instead of waiting out their timeout and a retry."""
        self._stop.set()
        # answered first: the lease's revoke below is an etcd call that can take seconds, past
        # the clients' timeout; an update admitted just before the decision and queued after
        # this drain still waits out its timeout (admission refuses every later one: not
        # writable once failure is set), and so does every queued one if the server's stop
        # closes its router before the replies leave (the answer is a shortcut, not a promise)
        while True:
            try:
                pending = self.queue.get_nowait()
            except queue.Empty:
                break
            refusal = self.not_primary(pending.header, pending.shard)
            self._send(error_reply(pending.header, refusal.code, str(refusal)))
        self.membership.halt()  # this server's lease goes, the others take over
        try:
            self._etcd.revoke(self.clock.lease)
        except HogwildError:
            pass

    def _snapshot_thread_failed(self, reason: str) -> None:
        """The snapshot thread ended on an error (that thread calls this): the server stops
        (:meth:`_decide_to_stop`), as on an error of the replication thread."""
        self._decide_to_stop(f"snapshot thread: {reason}")
        self.changed.set()

    def _send(self, reply: Reply) -> None:
        """A reply from the replication thread (through its own replier)."""
        self.replier.send(reply.header, reply.frames)

    def _take(self, wait_s: float) -> list[Pending]:
        try:
            batch = [self.queue.get(timeout=wait_s)]
        except queue.Empty:
            return []
        while len(batch) < MAX_BATCH:
            try:
                batch.append(self.queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _stop_buckets(self) -> None:
        """Tell the roles of the buckets stopped since the last turn (:class:`Stopped`)."""
        while True:
            try:
                bucket = self._stopping.get_nowait()
            except queue.Empty:
                return
            if not self.server.stops.stopped(bucket):
                continue  # lifted already by a snapshot that replaced it: nothing to tell
            with self.lock:
                sid = self._stimulus("stopped")
                actions = self.roles[bucket].handle(Stopped(stimulus_id=sid))
            self._carry_out(actions)

    def _observe(self) -> None:
        """Read the map (:mod:`~hogwild_plugins.ps.replication.map_reads`), tell every bucket's
        role, and carry out what each asks."""
        view, members = self.map.read(self._etcd, self.me, self.membership.held)
        if view.replaced is not None:
            # the driver counted this process lost and starts another as this server: stop
            # (before any role hears of this read), so that it can bind this address; from
            # now on the copy side refuses every primary's message (REPLACED): what this
            # process would take dies with it
            self._decide_to_stop(
                f"the job's driver ended this server's lease {view.replaced:#x} early "
                f"(etcd key revoked/{self.me}): it counts this process lost and starts another "
                f"as server {self.me}; this one stops"
            )
            return
        now = lease_now()
        valid = self.clock.valid(now)
        settled = len(view.live) == self.n_servers or now - self.started_at > SETTLE_S
        for bucket, role in self.roles.items():
            sid = self._stimulus("map")
            with self.lock:
                actions = role.handle(
                    map_read(view, bucket, self.clock.lease, valid, settled, now, sid)
                )
            self._carry_out(actions)
        # this server's key as etcd has it (not as last written: the job's keys may have been
        # deleted under live leases, and a key that is gone tells no one what it had seen)
        mine = members.get(self.me)
        listed = None if mine is None else sorted(mine.seen)
        if (mine is None and valid) or unlisted_and_unrecorded(self.roles, listed or ()):
            self.membership.refresh(self._etcd, listed)  # the others hold back from those too

    def _carry_out(self, actions: list) -> None:
        run(carry_out(actions, self.roles, self))
        self.takeovers.note_serving(lambda bucket: self.roles[bucket].serving)

    # ------------------------------------------------------------------ the executor's effects
    # (plugins/ps/replication/executor.py: the loops the simulator runs too; none blocks here
    # by yielding: each does its I/O in place)

    def stimulus(self, what: str) -> str:
        return self._stimulus(what)

    def replace_record(self, action) -> Iterator[str]:
        yield from ()
        # the nonce compared too: decided from a read of an etcd since restarted empty (its
        # revisions counted again from 1), it never lands on a key of the new history
        done = write_record(
            self._etcd, action.bucket, action.record, action.expected, self.map.nonce
        )
        return done, self.map.record(self._etcd, action.bucket)

    def record_written(self, action, done: bool) -> None:
        if isinstance(action, Campaign):
            self.counters["campaigns_won"] += bool(done)
            if done and action.expected:  # a takeover (not a bucket's first primary)
                self.takeovers.won(action.bucket, action.record.epoch)
        elif isinstance(action, HandOver):
            # The role no longer serves (NOT_PRIMARY to every request from now on, queued ones
            # included), and this thread runs no batch meanwhile: everything this side
            # acknowledged is committed on the successor, an in-sync copy.
            self.counters["handed_over"] += bool(done)

    def etcd_failed(self, exc: Exception) -> None:
        self._etcd_failed(exc)

    def send_snapshot(self, action: Sync) -> Iterator[str]:
        return self.syncs.send(action)

    def commit_prepared(self, bucket: int) -> None:
        self._commit_prepared(bucket)

    def stopped_here(self, bucket: int) -> bool:
        return self.server.stops.stopped(bucket)

    def _stimulus(self, what: str) -> str:
        """A new stimulus id: what happened, this server, a number (for the machines' stories)."""
        return f"{what}-{self.me}-{next(self._stimuli)}"

    def _etcd_failed(self, exc: Exception) -> None:
        self.etcd_errors += 1
        self.last_etcd_error = str(exc)
        self.changed.set()  # read the map again on the next turn

    def _commit_prepared(self, bucket: int) -> None:
        """Just won: what was prepared under the old primary is committed here, in order."""
        items = []
        with self.lock:
            for shard in self.bucket_shards[bucket]:
                log = self.logs[shard]
                epoch = self.roles[bucket].epoch
                items += [work for _, _, work in commit_log(log, log.last, epoch)]
        self.local.apply_and_wait(items, f"bucket {bucket}: the prepared updates")
        for shard in self.bucket_shards[bucket]:
            self.server.book.set_version(shard, self.logs[shard].committed)

    def _process(self, batch: list[Pending]) -> None:
        """Run one commit round for ``batch`` (see
        :mod:`~hogwild_plugins.ps.replication.commit_round`) through the executor, its effects
        :class:`~hogwild_plugins.ps.replication.primary_round.PrimaryRound`'s."""
        updates = tuple(
            Update(p.header.sender, p.header.seq, p.shard, self.layout.bucket_of(p.shard))
            for p in batch
        )
        run(run_round(updates, self.roles, PrimaryRound(self, batch)))

    def valid(self) -> bool:
        """This server's lease is valid by its own clock, and its replication has not failed."""
        return self.failure is None and self.clock.valid(lease_now())

    def acknowledged(self, shard: int) -> None:
        """An update of ``shard`` was acknowledged (the end of a failover, if it is the first
        after a takeover of its bucket)."""
        if self.takeovers.awaiting_ack:
            self.takeovers.acknowledged(self.layout.bucket_of(shard))

    # ------------------------------------------------------------------ status

    def status(self) -> dict:
        return {
            "copies": self.copies,
            "min_copies": self.min_copies,
            "lease": self.clock.lease,
            "lease_valid": self.clock.valid(lease_now()),
            "roles": {
                str(b): {
                    "role": r.role.value,
                    "epoch": r.epoch,
                    "known_epoch": r.known_epoch,  # the newest seen (or its store remembered)
                    "current": r.current,
                    "record_lost": r.record_lost,
                    "stopped": r.stopped,
                    "in_sync": list(r.record.in_sync) if r.record else [],
                    "confirmed": r.confirmed_copies(),
                }
                for b, r in self.roles.items()
            },
            **self.counters,
            **self.copy_side.counters,
            "deferred_for_etcd": self.copy_adapter.deferred,
            **self.syncs.status(),
            **self.commit_round.counters,
            "leases_lost": self.membership.leases_lost if self.membership else 0,
            "buckets_remembered": len(self.marks.remembered),  # marks the store held at start
            "marks_written": self.marks.writes,
            "etcd_errors": self.etcd_errors,
            "last_etcd_error": self.last_etcd_error,
            "takeovers": list(self.takeovers.records),
            "failure": self.failure,
        }
