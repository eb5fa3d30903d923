"""A parameter server's part in keeping three copies of every bucket (Adam 3.3.3), with etcd.

With ``copies > 1`` a :class:`~hogwild_plugins.ps.server.ParameterServer` holds every shard and
owns a :class:`Replication`: the I/O around the state machines of
:mod:`~hogwild_plugins.ps.failover` (read that module's docstring for the protocol).

Threads:

* the **heartbeat** renews the server's etcd lease every fifth of its TTL and, when it was lost
  (the process was paused past it), takes a new one and registers again as a member;
* the **replication thread** reads the map from etcd whenever it changes (a watch) and feeds it to
  each bucket's :class:`~hogwild_plugins.ps.failover.BucketRole`, carries out what they return
  (campaigns, in-sync writes and hand-overs to a bucket's preferred primary as etcd
  transactions, snapshots to copies, commits of what was prepared), and runs every client update
  of the buckets this server is primary of: it gives the update its version, applies it here
  (the update engine), sends it to the other in-sync copies (``PREPARE``), commits it on each
  (``COMMIT``) and only then acknowledges the client. Updates that arrive together go together:
  one round of prepares and one of commits per batch;
* the **network thread** (the server's router) answers a primary's ``PREPARE``, ``COMMIT`` and
  ``SNAPSHOT`` as a copy, through :func:`~hogwild_plugins.ps.failover.gate` (epoch and lease) and
  the shard's :class:`~hogwild_plugins.ps.shard_log.ShardLog`; client pulls and reductions of a
  bucket it is the serving primary of; and refuses the rest with ``NOT_PRIMARY`` (the client
  re-reads the map).

Every write is replicated this way: parameter updates and assignments, pushes into named
vectors and vector operations that write (``axpy``, ``scale``, ``copy``, ``mul``, ``fill``); each
takes the shard's next version. Reductions (``dot``, ``asum``, ``amax``) are answered by the
serving primary alone, like pulls. A snapshot carries a shard's values, the rule's state, its
named vectors and its request table; a copy's restore replaces all four, unless the snapshot is
older than what the copy has since committed from the same primary (a late message of an
exchange that primary gave up on, :meth:`~hogwild_plugins.ps.shard_log.ShardLog.outdated`): that
one is dropped and refused (``NEED_SYNC``, never an acknowledgement), counted as
``outdated_snapshots``.

Each shard's log also remembers which client requests ``(sender, seq)`` it holds, and snapshots
carry that table: a client that re-sends an unacknowledged update to a new primary gets the
version it already has instead of a second application.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import numpy as np
from hogwild_plugins.ps import checks
from hogwild_plugins.ps.etcd import Etcd, EtcdUnavailable, LeaseExpired
from hogwild_plugins.ps.failover import (
    BucketRecord,
    BucketRole,
    Campaign,
    CommitPrepared,
    Gate,
    HandOver,
    LeaseClock,
    Role,
    Sync,
    WriteInSync,
    gate,
)
from hogwild_plugins.ps.routes import etcd_prefix, read_map
from hogwild_plugins.ps.shard_log import ShardLog
from hogwild_plugins.ps.work import Barrier, Kind, Restore, Work

from hogwild.errors import HogwildError
from hogwild.net.channel import Peers, PeerUnreachableError, Request
from hogwild.net.router import Incoming, Reply, error_reply
from hogwild.net.wire import (
    DType,
    ErrorCode,
    Header,
    MsgType,
    WireError,
    frame_array,
    pack_header,
    unpack_header,
)

__all__ = ["PEER_SENDER", "Replication"]

PEER_SENDER = 0xFFFF0000  # a server's sender id towards its peers (+ its index; 32 bits)
PEER_TIMEOUT_S = 0.3  # a copy that does not answer a prepare within this (and a retry) is dropped
POLL_S = 0.5  # the map is read at least this often, watch or not
MAX_BATCH = 256
MAX_TAKEOVERS = 64
SETTLE_S = 5.0  # a bucket's first primary waits this long for every server to register
LOCAL_APPLY_S = 30.0
REPLICATED_TYPES = frozenset(
    {MsgType.PUSH_DELTAS, MsgType.PUSH_VECTORS, MsgType.ASSIGN, MsgType.VECTOR_OP}
)


@dataclass
class Pending:
    """A client's update waiting for the replication thread."""

    header: Header
    shard: int
    work: Work
    frames: list
    epoch: int = 0  # the bucket's epoch when this primary versioned it


class _Countdown:
    """Waits until ``n`` local applications finished (the engine calls :meth:`done`)."""

    def __init__(self, n: int) -> None:
        self.left, self.cond = n, threading.Condition()

    def done(self) -> None:
        with self.cond:
            self.left -= 1
            if self.left <= 0:
                self.cond.notify_all()

    def wait(self, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.left <= 0, timeout)


class Replication:
    """One server's replication (see the module docstring).

    Args:
        server: The :class:`~hogwild_plugins.ps.server.ParameterServer` (its layout, shards,
            book, engine and router; it holds every shard).
        etcd: ``HOST:PORT`` of the job's etcd.
        copies: Copies of every bucket (2 or more; at most the number of servers).
        lease_s: TTL of the server's etcd lease: how long a dead server goes unnoticed.
    """

    def __init__(self, server, etcd: str, copies: int, lease_s: int = 2) -> None:
        options = server.options
        if not 2 <= copies:
            raise HogwildError(f"copies = {copies}: replication needs 2 or more")
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
        self.roles = {b: BucketRole(b, self.me, copies) for b in range(layout.n_buckets)}
        for bucket, shards in self.bucket_shards.items():
            self.roles[bucket].current = not shards  # nothing to hold: every copy is current
        self.logs = {s: ShardLog(committed=server.book.version(s)) for s in range(layout.n_shards)}
        # the logs, and a role's observe against what the network thread (a copy's side) changes
        # in it (a snapshot's restore, a refreshed record): network and replication threads
        self.lock = threading.Lock()
        self.clock = LeaseClock()
        self.queue: queue.SimpleQueue[Pending] = queue.SimpleQueue()
        self.changed = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._etcd: Etcd | None = None  # the replication thread's
        self._net_etcd: Etcd | None = None  # the network thread's (refreshing a record)
        self._watch = None
        self.peers: Peers | None = None
        self.replier = None
        self.counters = {
            "prepared": 0,
            "committed": 0,
            "snapshots_sent": 0,
            "snapshots_received": 0,
            "outdated_snapshots": 0,
            "fenced": 0,
            "duplicates": 0,
            "not_primary": 0,
            "campaigns_won": 0,
            "handed_over": 0,
            "dropped_copies": 0,
            "leases_lost": 0,
        }
        self.failure: str | None = None
        self.etcd_errors = 0
        self.last_etcd_error: str | None = None
        self.takeovers: list[dict] = []  # the last takeovers: bucket, epoch, wall-clock times
        self._awaiting_ack: dict[int, dict] = {}

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Register with etcd (a lease, ``members/<index>``), start the heartbeat and the
        replication thread. Call after the server's router and engine started."""
        prefix = etcd_prefix(self.server.options.job)
        self._etcd = Etcd(self.etcd_address, prefix=prefix)
        self._net_etcd = Etcd(self.etcd_address, prefix=prefix)
        self._keeper_etcd = Etcd(self.etcd_address, prefix=prefix)
        self.peers = Peers(
            list(self.server.options.servers),
            sender=PEER_SENDER + self.me,
            timeout_s=PEER_TIMEOUT_S,
            retries=1,
            keys=self.server.options.keys,
        )
        self.replier = self.server.router.replier()
        self.started_at = time.monotonic()
        self._register(self._keeper_etcd)
        self._watch = self._etcd.watch("", self.changed.set)
        for target, name in ((self._heartbeat, "hogwild-lease"), (self._run, "hogwild-replicate")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _register(self, etcd: Etcd) -> None:
        sent = time.monotonic()
        lease = etcd.grant(self.lease_s)
        etcd.put(
            f"members/{self.me}",
            {"address": str(self.server.address), "lease": lease, "lease_s": self.lease_s},
            lease=lease,
        )
        self.clock.granted(lease, self.lease_s, sent)
        self.changed.set()

    def stop(self) -> None:
        """Stop the threads and give the lease back (the others take over at once)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        if self._watch is not None:
            self._watch.cancel()
        if self._keeper_etcd is not None and self.clock.lease:
            try:
                self._keeper_etcd.revoke(self.clock.lease)
            except HogwildError:
                pass  # etcd is gone too: the lease lapses by itself
        for etcd in (self._etcd, self._net_etcd, self._keeper_etcd):
            if etcd is not None:
                etcd.close()
        if self.replier is not None:
            self.replier.close()
            self.replier = None
        if self.peers is not None:
            self.peers.close()
            self.peers = None

    _keeper_etcd: Etcd | None = None

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _heartbeat(self) -> None:
        last = 0.0
        while not self._stop.wait(0.05):
            now = time.monotonic()
            if not self.clock.renew_due(now, last):
                continue
            last = now
            try:
                try:
                    remaining = self._keeper_etcd.keepalive(self.clock.lease)
                except LeaseExpired:
                    remaining = 0
                if not self.clock.renewed(remaining, now):
                    self.counters["leases_lost"] += 1
                    self.changed.set()  # step down from every bucket now
                    self._register(self._keeper_etcd)
            except HogwildError:
                pass  # etcd unreachable: the lease lapses by the clock, the map decides

    # ------------------------------------------------------------------ network thread

    def serving(self, shard: int) -> bool:
        role = self.roles[self.layout.bucket_of(shard)]
        return role.serving and self.failure is None and self.clock.valid(time.monotonic())

    def not_primary(self, header: Header, shard: int) -> WireError:
        self.counters["not_primary"] += 1
        role = self.roles[self.layout.bucket_of(shard)]
        primary = role.record.primary if role.record else None
        return WireError(
            f"server {self.me} is not the serving primary of bucket {self.layout.bucket_of(shard)}"
            f" (it is {role.role.value}; the map names server {primary}): re-read the map",
            ErrorCode.NOT_PRIMARY,
        )

    def submit(self, header: Header, shard: int, work: Work, frames: list) -> None:
        """A client's update of ``shard`` (checked): for the replication thread."""
        if not self.serving(shard):
            raise self.not_primary(header, shard)
        self.queue.put(Pending(header, shard, work, list(frames)))

    def handle_peer(self, request: Incoming) -> Reply:
        """A primary's ``PREPARE``, ``COMMIT`` or ``SNAPSHOT`` to this copy."""
        header = request.header
        shard = self.server._check(header)
        bucket = self.layout.bucket_of(shard)
        sender = header.sender - PEER_SENDER
        verdict = gate(self.roles[bucket], header.aux, header.lease, sender)
        if verdict is Gate.REFRESH:
            self._refresh_record(bucket)
            verdict = gate(self.roles[bucket], header.aux, header.lease, sender)
        if verdict is not Gate.ACCEPT:
            self.counters["fenced"] += 1
            raise WireError(
                f"server {self.me}: bucket {bucket} is at epoch {self.roles[bucket].epoch}, "
                f"primary {getattr(self.roles[bucket].record, 'primary', None)}; a message of "
                f"epoch {header.aux} from server {sender} is refused",
                ErrorCode.FENCED if verdict is Gate.FENCED else ErrorCode.BUSY,
            )
        if header.type == MsgType.PREPARE:
            return self._prepare(header, shard, request.frames)
        if header.type == MsgType.COMMIT:
            return self._commit(header, shard)
        return self._restore(header, shard, request.frames)

    def _refresh_record(self, bucket: int) -> None:
        try:
            record = self._read(bucket, self._net_etcd)
        except EtcdUnavailable:
            raise
        except HogwildError:  # not a record: the gate decides on what this side knew
            return
        if record is None:
            return
        role = self.roles[bucket]
        with self.lock:  # not in the middle of the replication thread's observe
            if role.role is not Role.PRIMARY and (
                role.record is None or record.revision > role.record.revision
            ):  # a primary's record changes on the replication thread only (it may be deposed)
                role.record = record
        self.changed.set()

    def _prepare(self, header: Header, shard: int, frames: list) -> Reply:
        if len(frames) < 1:
            raise WireError("PREPARE needs the client's header frame", ErrorCode.BAD_FRAMES)
        client = unpack_header(memoryview(frames[0]))
        if client.target != shard or client.type not in REPLICATED_TYPES:
            raise WireError(
                "PREPARE carries an update of another shard or kind", ErrorCode.BAD_FRAMES
            )
        if client.frames != len(frames) - 1:
            raise WireError(
                "PREPARE: the client's frames do not match its header", ErrorCode.BAD_FRAMES
            )
        self.server._check(client)
        work = self.server._work(client, shard, self.server.local[shard], frames[1:])
        if not self.server._replicated(work):
            raise WireError("PREPARE carries a reduction (it writes nothing)", ErrorCode.BAD_FRAMES)
        work.version = header.version
        self.server._decide(work, client, header.a)
        work.keep = frames
        with self.lock:
            ok = self.logs[shard].prepare(header.version, (client.sender, client.seq, work))
        if not ok:
            raise WireError(
                f"shard {shard}: version {header.version} does not follow "
                f"{self.logs[shard].last} here",
                ErrorCode.NEED_SYNC,
            )
        self.counters["prepared"] += 1
        return Reply(header.reply(MsgType.ACK, version=header.version))

    def _commit(self, header: Header, shard: int) -> Reply:
        log = self.logs[shard]
        with self.lock:
            if header.version > log.last:
                raise WireError(
                    f"shard {shard}: commit up to {header.version}, prepared only to {log.last}",
                    ErrorCode.NEED_SYNC,
                )
            items = _commit(log, header.version, header.aux)  # aux: the primary's epoch
        self._apply(items)
        self.server.book.set_version(shard, max(log.committed, self.server.book.version(shard)))
        self.counters["committed"] += len(items)
        return Reply(header.reply(MsgType.ACK, version=log.committed))

    def _apply(self, items: list, countdown: _Countdown | None = None) -> None:
        """Queue committed work on the engine, in order (waiting for free slots)."""
        engine = self.server.engine
        for item in items:
            work = item[2] if isinstance(item, tuple) else item
            work.acked = True  # the replication answers, not the engine
            if countdown is not None:
                chained = work.free
                work.free = (
                    countdown.done
                    if chained is None
                    else (lambda c=chained: (c(), countdown.done()))
                )
            deadline = time.monotonic() + LOCAL_APPLY_S
            slot = engine.reserve()
            while slot is None:
                if time.monotonic() > deadline:
                    raise WireError("the update engine's queues stayed full", ErrorCode.BUSY)
                time.sleep(0.001)
                slot = engine.reserve()
            engine.put(slot, work)

    def _restore(self, header: Header, shard: int, frames: list) -> Reply:
        size = self.layout.shard_size(shard)
        if header.dtype != DType.FLOAT32 or header.shape != (size,) or len(frames) != 5:
            raise WireError(
                f"SNAPSHOT of shard {shard}: expected values, state, a request table, the "
                f"named vectors' names and their values ({size} floats each)",
                ErrorCode.BAD_FRAMES,
            )
        vectors = _parse_vectors(frames[3], frames[4], size)
        values = frame_array(frames[0], DType.FLOAT32, (size,), "values")
        state_size = self.server.shards[self.server.local[shard]].state.size
        state = frame_array(frames[1], DType.FLOAT32, (state_size,), "state")
        raw = memoryview(frames[2])
        if raw.nbytes % 24:
            raise WireError("SNAPSHOT: the request table is not (sender, seq, version) triples")
        table = frame_array(frames[2], DType.UINT64, (raw.nbytes // 8,), "requests")
        triples = [tuple(int(x) for x in t) for t in table.reshape(-1, 3)]
        work = Restore(
            self.server.local[shard],
            version=header.version,
            keep=frames,
            values=values,
            state=state,
            vectors=vectors,
        )
        with self.lock:
            log = self.logs[shard]
            if log.outdated(header.version, header.aux):  # aux: the epoch
                self.counters["outdated_snapshots"] += 1  # applied nowhere: nothing to undo
                # not an acknowledgement: a primary must never take this copy as synced by it
                raise WireError(
                    f"shard {shard}: a snapshot at version {header.version} of epoch "
                    f"{header.aux} is older than version {log.committed} committed here from the "
                    "same primary; dropped",
                    ErrorCode.NEED_SYNC,
                )
            log.restore(header.version, triples, header.aux)
        self._apply_and_wait([work], f"shard {shard}: the snapshot")
        self.server.book.set_version(shard, header.version)
        # only now does this copy hold the state: a restore that failed must not let it campaign
        with self.lock:
            self.roles[self.layout.bucket_of(shard)].restored(header.aux)  # aux: the epoch
        self.counters["snapshots_received"] += 1
        return Reply(header.reply(MsgType.ACK, version=header.version))

    # ------------------------------------------------------------------ replication thread

    def _run(self) -> None:
        last_read = 0.0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if self.changed.is_set() or now - last_read > POLL_S:
                    self.changed.clear()
                    last_read = now
                    try:
                        self._observe()
                    except HogwildError as exc:  # etcd unreachable or slow, a bad record:
                        self.etcd_errors += 1  # the lease lapses by the clock; read again
                        self.last_etcd_error = str(exc)
                        self.changed.set()
                        time.sleep(0.05)
                batch = self._take(0.02)
                if batch:
                    self._process(batch)
        except Exception as exc:  # noqa: BLE001 - a bug: hand every bucket to the others
            self.failure = f"{type(exc).__name__}: {exc}"
            self._stop.set()  # the heartbeat too: this server's lease goes, the others take over
            try:
                self._etcd.revoke(self.clock.lease)
            except HogwildError:
                pass
            raise

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

    def _observe(self) -> None:
        members, records = read_map(self._etcd, self.n_servers, self.layout.n_buckets)
        live = {i: m.get("lease") for i, m in members.items()}
        now = time.monotonic()
        valid = self.clock.valid(now)
        settled = len(live) == self.n_servers or now - self.started_at > SETTLE_S
        for bucket, role in self.roles.items():
            with self.lock:
                actions = role.observe(records[bucket], live, self.clock.lease, valid, settled)
            self._carry_out(actions)

    def _carry_out(self, actions: list) -> None:
        while actions:
            action = actions.pop(0)
            role = self.roles[action.bucket]
            key = f"sync/{action.bucket}"
            if isinstance(action, Campaign):
                value = action.record.value()
                try:
                    won = self._etcd.replace(key, value, action.expected)
                    record = self._read(action.bucket)
                except HogwildError as exc:
                    self._etcd_failed(exc)
                    role.campaigned(False, None)  # a follower again: the next read decides
                    continue
                self.counters["campaigns_won"] += bool(won)
                if won and action.expected:  # a takeover (not a bucket's first primary)
                    self._takeover(action.bucket, action.record.epoch)
                actions += role.campaigned(won and record is not None, record)
            elif isinstance(action, WriteInSync):
                try:
                    ok = self._etcd.replace(key, action.record.value(), action.expected)
                    record = self._read(action.bucket)
                except HogwildError as exc:
                    self._etcd_failed(exc)
                    role.written(False, None)  # not knowing is losing: step down (and retake)
                    continue
                actions += role.written(ok, record)
            elif isinstance(action, HandOver):
                # The role no longer serves (NOT_PRIMARY to every request from now on, queued
                # ones included), and this thread runs no batch meanwhile: everything this side
                # acknowledged is committed on the successor, an in-sync copy.
                try:
                    ok = self._etcd.replace(key, action.record.value(), action.expected)
                    record = self._read(action.bucket)
                except HogwildError as exc:
                    self._etcd_failed(exc)
                    role.handed(False, None)  # not knowing is losing: deposed, the map decides
                    continue
                self.counters["handed_over"] += bool(ok)
                actions += role.handed(ok, record)
            elif isinstance(action, Sync):
                ok = self._send_snapshot(action.bucket, action.server)
                actions += role.synced(action.server) if ok else role.unreachable(action.server)
            elif isinstance(action, CommitPrepared):
                self._commit_prepared(action.bucket)

    def _etcd_failed(self, exc: Exception) -> None:
        self.etcd_errors += 1
        self.last_etcd_error = str(exc)
        self.changed.set()  # read the map again on the next turn

    def _read(self, bucket: int, etcd: Etcd | None = None) -> BucketRecord | None:
        """``sync/<bucket>`` (None: absent), through ``etcd`` (default: this thread's).

        Raises:
            HogwildError: A value that is not a record (naming the key); EtcdUnavailable.
        """
        key = f"sync/{bucket}"
        value, revision = (etcd or self._etcd).get(key)
        if value is None:
            return None
        try:
            return BucketRecord.parse(value, revision, self.n_servers, f"etcd key {key}")
        except ValueError as exc:
            raise HogwildError(str(exc)) from exc

    def _apply_and_wait(self, works: list, what: str) -> None:
        """Queue ``works`` on the engine and wait until each is applied."""
        done = _Countdown(len(works))
        self._apply(works, done)
        if not done.wait(LOCAL_APPLY_S):
            raise HogwildError(f"{what}: not applied within {LOCAL_APPLY_S:g} s")

    def _commit_prepared(self, bucket: int) -> None:
        """Just won: what was prepared under the old primary is committed here, in order."""
        items = []
        with self.lock:
            for shard in self.bucket_shards[bucket]:
                log = self.logs[shard]
                items += [work for _, _, work in _commit(log, log.last, self.roles[bucket].epoch)]
        self._apply_and_wait(items, f"bucket {bucket}: the prepared updates")
        for shard in self.bucket_shards[bucket]:
            self.server.book.set_version(shard, self.logs[shard].committed)

    def _barrier(self, shards: list[int]) -> None:
        """Wait until the update engine applied everything queued for ``shards`` (a copy just
        promoted may still have commits queued by the network thread)."""
        works = [Barrier(self.server.local[s]) for s in shards]
        self._apply_and_wait(works, f"shards {shards}: the queued updates")

    def _send_snapshot(self, bucket: int, server: int) -> bool:
        role = self.roles[bucket]
        requests = []
        self._barrier(self.bucket_shards[bucket])
        for shard in self.bucket_shards[bucket]:
            held = self.server.shards[self.server.local[shard]]
            with self.lock:
                log = self.logs[shard]
                table = np.array(log.table(), np.uint64).reshape(-1)
                version = log.committed
            values, state = held.values.copy(), held.state.copy()
            named = sorted(list(held.vectors.items()), key=lambda item: item[0])
            names = ",".join(n for n, _ in named).encode("ascii")
            stacked = np.empty((len(named), values.size), np.float32)
            for row, (_, vec) in zip(stacked, named, strict=True):
                row[:] = vec
            header = self._peer_header(
                MsgType.SNAPSHOT,
                shard,
                version,
                role,
                dtype=DType.FLOAT32,
                shape=(values.size,),
                frames=5,
            )
            frames = [values, state, table, np.frombuffer(names, np.uint8), stacked.reshape(-1)]
            requests.append(Request(server, header, frames))
        ok = self._exchange(requests)
        self.counters["snapshots_sent"] += sum(ok)
        return all(ok)

    def _peer_header(
        self, kind: MsgType, shard: int, version: int, role: BucketRole, **fields
    ) -> Header:
        """A message of this primary to a copy: the bucket's epoch and this server's lease,
        which the copy's gate checks."""
        return Header(
            kind,
            job=self.server.job,
            target=shard,
            version=version,
            lease=self.clock.lease,
            aux=role.epoch,
            **fields,
        )

    def _exchange(self, requests: list[Request]) -> list[bool]:
        """Send ``requests`` to the copies; True for each acknowledged. A copy that does not
        answer fails all of its requests; one that answers ``FENCED`` deposes its bucket here."""
        ok = [False] * len(requests)
        answered = [False] * len(requests)
        for i, req in enumerate(requests):

            def on_reply(h: Header, frames: list, i=i, req=req) -> None:
                answered[i] = True
                if h.type == MsgType.ACK:
                    ok[i] = True
                elif h.type == MsgType.ERROR and h.code == ErrorCode.FENCED:
                    bucket = self.layout.bucket_of(req.header.target)
                    self.roles[bucket].fenced()

            req.on_reply = on_reply
        todo, dead = list(requests), set()
        while todo:
            try:
                self.peers.exchange(todo)
                break
            except PeerUnreachableError as exc:
                named = {i for i, a in enumerate(self.peers.addresses) if str(a) == exc.address}
                if not named:  # cannot tell whom: give up on everything still unanswered
                    break
                dead |= named
                todo = [
                    r for i, r in enumerate(requests) if not answered[i] and r.server not in dead
                ]
                for r in todo:
                    r.attempts = 0
        return ok

    def _process(self, batch: list[Pending]) -> None:
        """Version, apply here, prepare and commit on the copies, acknowledge (see the module
        docstring)."""
        accepted: list[Pending] = []
        for p in batch:
            if not self.serving(p.shard):
                self._error(p.header, self.not_primary(p.header, p.shard))
                continue
            seen = self.logs[p.shard].seen(p.header.sender, p.header.seq)
            if seen is not None:
                self.counters["duplicates"] += 1
                self.replier.send(p.header.reply(MsgType.ACK, version=seen))
                continue
            try:
                self.server._admit(p.header, p.shard, p.work)
            except WireError as exc:
                self._error(p.header, exc)
                continue
            p.epoch = self.roles[self.layout.bucket_of(p.shard)].epoch
            accepted.append(p)
        if not accepted:
            return
        done = _Countdown(len(accepted))
        self._apply([p.work for p in accepted], done)
        prepares = []
        for p in accepted:
            role = self.roles[self.layout.bucket_of(p.shard)]
            head = pack_header(p.header)
            for copy in role.record.in_sync:
                if copy == self.me:
                    continue
                header = self._peer_header(
                    MsgType.PREPARE,
                    p.shard,
                    p.work.version,
                    role,
                    a=self._coef(p),
                    frames=1 + len(p.frames),
                )
                prepares.append(Request(copy, header, [head, *p.frames]))
        failed = self._failures(prepares, self._exchange(prepares))
        commits, upto = [], {}
        for p in accepted:
            upto[p.shard] = max(upto.get(p.shard, 0), p.work.version)
        for shard, version in upto.items():
            role = self.roles[self.layout.bucket_of(shard)]
            for copy in role.record.in_sync:
                if copy != self.me and (role.bucket, copy) not in failed:
                    header = self._peer_header(MsgType.COMMIT, shard, version, role)
                    commits.append(Request(copy, header))
        failed |= self._failures(commits, self._exchange(commits))
        for bucket, copy in sorted(failed):
            self.counters["dropped_copies"] += 1
            self._carry_out(self.roles[bucket].unreachable(copy))
        if not done.wait(LOCAL_APPLY_S):
            raise HogwildError("local updates were not applied within 30 s")
        valid = self.clock.valid(time.monotonic())
        for p in accepted:
            role = self.roles[self.layout.bucket_of(p.shard)]
            log = self.logs[p.shard]
            with self.lock:  # applied here: a re-send is answered, never applied again
                log.applied(p.header.sender, p.header.seq, p.work.version, p.epoch)
            lost = [c for c in role.record.in_sync if (role.bucket, c) in failed]
            if role.role is not Role.PRIMARY or not valid or lost:
                self._error(p.header, self.not_primary(p.header, p.shard))
                continue
            self.replier.send(p.header.reply(MsgType.ACK, version=p.work.version, a=p.work.result))
            if self._awaiting_ack:
                self._acknowledged(role.bucket)

    def _takeover(self, bucket: int, epoch: int) -> None:
        self.takeovers.append(
            {"bucket": bucket, "epoch": epoch, "won_at": time.time(), "first_ack_at": None}
        )
        del self.takeovers[:-MAX_TAKEOVERS]
        self._awaiting_ack[bucket] = self.takeovers[-1]

    def _acknowledged(self, bucket: int) -> None:
        """The first update acknowledged after a takeover: the end of that failover."""
        entry = self._awaiting_ack.pop(bucket, None)
        if entry is not None:
            entry["first_ack_at"] = time.time()

    @staticmethod
    def _coef(p: Pending) -> float:
        """The staleness coefficient the primary gave the update (copies apply the same)."""
        if p.work.kind == Kind.VECTORS:
            return -p.work.coef / p.header.a if p.header.a else 0.0
        return float(p.work.coef)

    def _failures(self, requests: list[Request], ok: list[bool]) -> set[tuple[int, int]]:
        out = set()
        for req, good in zip(requests, ok, strict=True):
            if not good:
                out.add((self.layout.bucket_of(req.header.target), req.server))
        return out

    def _error(self, header: Header, exc: WireError) -> None:
        reply = error_reply(header, exc.code, str(exc))
        self.replier.send(reply.header, reply.frames)

    # ------------------------------------------------------------------ status

    def status(self) -> dict:
        return {
            "copies": self.copies,
            "lease": self.clock.lease,
            "lease_valid": self.clock.valid(time.monotonic()),
            "roles": {
                str(b): {
                    "role": r.role.value,
                    "epoch": r.epoch,
                    "current": r.current,
                    "in_sync": list(r.record.in_sync) if r.record else [],
                }
                for b, r in self.roles.items()
            },
            **self.counters,
            "etcd_errors": self.etcd_errors,
            "last_etcd_error": self.last_etcd_error,
            "takeovers": list(self.takeovers),
            "failure": self.failure,
        }


def _parse_vectors(names_frame, values_frame, size: int) -> dict[str, np.ndarray]:
    """A snapshot's named vectors: their names (ASCII, joined by commas; none: empty) and their
    values, one row of ``size`` floats per name, checked.

    Raises:
        WireError: ``BAD_NAME`` (a name outside checks' rules, ``params``, a repeated name),
            ``BAD_FRAMES`` (values that are not one row per name).
    """
    raw = bytes(memoryview(names_frame))
    names = [] if not raw else [checks.parse_name(n.encode("ascii")) for n in _split(raw)]
    if len(set(names)) != len(names):
        raise WireError(f"SNAPSHOT: a vector name is repeated in {raw[:80]!r}", ErrorCode.BAD_NAME)
    nbytes = memoryview(values_frame).nbytes
    if nbytes != 4 * size * len(names):
        raise WireError(
            f"SNAPSHOT: {nbytes} bytes of named vectors for {len(names)} name(s) of {size} floats",
            ErrorCode.BAD_FRAMES,
        )
    stacked = frame_array(values_frame, DType.FLOAT32, (len(names) * size,), "vectors")
    return {name: stacked[i * size : (i + 1) * size] for i, name in enumerate(names)}


def _split(raw: bytes) -> list[str]:
    try:
        return raw.decode("ascii").split(",")
    except UnicodeDecodeError:
        raise WireError("SNAPSHOT: vector names must be ASCII", ErrorCode.BAD_NAME) from None


def _commit(log: ShardLog, upto: int, epoch: int) -> list:
    """``log``'s prepared updates up to ``upto``, committed by the primary of ``epoch``, each
    client request recorded (a re-send is then answered, not applied again)."""
    items = log.commit(upto, epoch)
    for sender, seq, work in items:
        log.record(sender, seq, work.version)
    return items
