"""One simulated parameter server: the real replication state machines, carried out without I/O.

A :class:`SimServer` holds what a replicated
:class:`~hogwild_plugins.ps.serving.server.ParameterServer` holds (every bucket's
:class:`~hogwild_plugins.ps.replication.bucket_role.BucketRole`, the
:class:`~hogwild_plugins.ps.replication.commit_round.CommitRound`, the
:class:`~hogwild_plugins.ps.replication.copy_side.CopySide`, the shard logs, the shard book) and
carries out their actions through the executor the real server runs
(:mod:`~hogwild_plugins.ps.replication.executor`), against the
:class:`~hogwild_plugins.ps.simulation.etcd.SimEtcd` and the world's network. A shard's values are
the list of the client updates applied to it, ``(sender, seq)`` in order: what a real shard's
floats sum up, made checkable (applied twice, missing, more than its version says).

Its one concept is one server process as its threads see it, each a part of this class as the
real server's are of :mod:`~hogwild_plugins.ps.replication.adapter`: its membership (lease,
heartbeat, its clock's validity), its network thread (a client's request checked and queued, a
primary's message handed to the copy side, a copy's answer to this primary's exchange) and its
replication thread (the map read, the roles' actions, the commit rounds). The executor's hosts
are beside it, as the real server's are: this class for the bucket roles' effects,
:mod:`~hogwild_plugins.ps.simulation.primary_round` for one commit round's,
:mod:`~hogwild_plugins.ps.simulation.copy_host` for the copy side's,
:mod:`~hogwild_plugins.ps.simulation.snapshot_thread` for the snapshot thread.

The replication thread is a generator: it yields wherever the real thread blocks (an etcd call,
an exchange with the copies), and the world decides what happens before it goes on. So is the
snapshot thread's work (:mod:`~hogwild_plugins.ps.simulation.snapshot_thread`, as the real
server's): a role's ``Sync`` takes its parcel at once and leaves its exchanges to that thread,
whose steps the world interleaves with the replication thread's, and whose outcome the
replication thread tells the role at a later turn. The network
thread's work (a client's update into the queue, a primary's message through the copy side) is
one atomic step, as the real one holds the replication lock for it, except where the real thread
lets the lock go: between a primary's message's gate and its content it reads the message's
frames. The world may draw (``splits``) that this read lasts some of the replication thread's
steps (a thread descheduled, a large snapshot): the message waits half taken (``reading``),
the network thread takes nothing else meanwhile, and the content's step comes after the
replication thread's steps (a record read, a campaign won, the prepared updates committed).
Likewise a record's write and its read back are two etcd requests on the real thread: the
world may draw that the read back is a step of its own (etcd may lose its keys in between).

An application may fail (the world's ``fails``, drawn for each update a server applies: its
own as primary, a commit as copy, what a new primary commits of its predecessor's prepares), as
a real update rule may raise after the write was acknowledged or committed. The server then does
what the real one does: its :class:`~hogwild_plugins.ps.stops.BucketStops` stops the bucket
(requests refused ``STOPPED``), the primary answers that client ``STOPPED`` rather than ``ACK``,
the role hears :class:`~hogwild_plugins.ps.replication.bucket_role_events.Stopped` on the
replication thread's next turn, and a snapshot queued after the failure lifts the stop
(:class:`~hogwild_plugins.ps.replication.bucket_role_events.StopLifted`). The update missing
from the shard's values is kept in ``failed_writes`` for the invariants.

A server may have a store (:class:`~hogwild_plugins.ps.simulation.store.SimStore`: what its
LMDB store keeps of the replication, the newest epoch of each bucket's record it saw,
:mod:`~hogwild_plugins.ps.replication.marks`). The messages it sends and takes are
:mod:`~hogwild_plugins.ps.simulation.messages`. The
world keeps it across the server's kill and hands it to the restarted process, whose roles hear
what it remembers (``Remembered``) before anything else.

A read of the map whose ``revoked/<me>`` marker names a lease this process held
(:func:`~hogwild_plugins.ps.failover.replaced`: the driver counted it lost and starts another as
this server) stops it as the real adapter does (its ``failure``, then exit 2): before any role
hears of that read, it gives its current lease back and sets :attr:`SimServer.stopped`; the
world then takes the process away as it would a dead one, in the same step (the real network
thread refuses every request from the moment the failure is set, and the process exits at the
replication thread's next turn), and a restart is a new incarnation whose leases the marker does
not name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from hogwild_plugins.ps.etcd import EtcdUnavailable
from hogwild_plugins.ps.failover import REVOKED_PREFIX, MemberRecord, replaced
from hogwild_plugins.ps.replication.bucket_role import BucketRole
from hogwild_plugins.ps.replication.bucket_role_events import (
    Fenced,
    Remembered,
    Stopped,
)
from hogwild_plugins.ps.replication.commit_round import CommitRound
from hogwild_plugins.ps.replication.commit_round_events import Update
from hogwild_plugins.ps.replication.copy_side import CopySide, commit_log
from hogwild_plugins.ps.replication.copy_side_events import Acknowledge as CopyAck
from hogwild_plugins.ps.replication.copy_side_events import Refuse
from hogwild_plugins.ps.replication.executor import (
    carry_out,
    receive,
    run,
    run_round,
    snapshot_answered,
)
from hogwild_plugins.ps.replication.map_reads import MapView, map_read
from hogwild_plugins.ps.replication.marks import BucketMarks, followed
from hogwild_plugins.ps.replication.membership import HELD_LEASES, unlisted_and_unrecorded
from hogwild_plugins.ps.shard_log import ShardLog
from hogwild_plugins.ps.simulation.copy_host import SimCopyHost
from hogwild_plugins.ps.simulation.etcd import SimEtcd
from hogwild_plugins.ps.simulation.messages import Exchange, Peer, Reading
from hogwild_plugins.ps.simulation.primary_round import SimPrimaryRound
from hogwild_plugins.ps.simulation.snapshot_thread import SimSnapshotThread
from hogwild_plugins.ps.simulation.store import SimStore
from hogwild_plugins.ps.stops import BucketStops

from hogwild.net.wire import ErrorCode, WireError

__all__ = ["SimServer"]

MAX_BATCH = 8


class SimServer:
    """One incarnation of server ``me`` (a restart is a new one, its memory empty).

    Args:
        me: The server's index.
        incarnation: Which process this is (messages to an older one are lost).
        bucket_shards: Every bucket's shards.
        copies: Copies per bucket.
        min_copies: ``ps.min_copies``.
        etcd: The job's etcd.
        send: ``send(dst, message)``: into the world's network.
        now: The world's clock (ticks).
        ttl: The lease's TTL (ticks).
        settle: Ticks after its start when a server may choose first primaries alone.
        fails: ``fails(what)``: whether the application of ``what`` (an update, described)
            fails here (the world's seeded draw). None: none fails.
        store: The server's store, kept by the world across restarts. None: it has none.
        splits: ``splits(what)``: how many of its replication thread's steps the network thread
            takes to read a primary's message past its gate, or whether a record written is
            read back in a step of its own (the world's seeded draw; 0: neither). None: every
            message is taken, and every record written and read back, in one step.
        unbuilt: ``unbuilt(what)``: whether the parcel of a ``Sync`` cannot be taken (the real
            server's barrier timed out, its engine busy: the copy is answered unreachable under
            the Sync's ticket). None: every parcel is taken.
        stops_when_replaced: Whether a map read whose ``revoked/<me>`` names a lease this
            process held stops it, as the real one (False: it goes on, registering again, as
            the simulator had it before the stop was modelled: ``Config.replaced_stops``).
    """

    def __init__(
        self,
        me: int,
        incarnation: int,
        bucket_shards: dict[int, list[int]],
        copies: int,
        min_copies: int,
        etcd: SimEtcd,
        send: Callable[[int, object], None],
        now: Callable[[], int],
        ttl: int,
        settle: int,
        fails: Callable[[str], bool] | None = None,
        store: SimStore | None = None,
        splits: Callable[[str], int] | None = None,
        unbuilt: Callable[[str], bool] | None = None,
        stops_when_replaced: bool = True,
    ) -> None:
        self.me, self.incarnation, self.copies = me, incarnation, copies
        self.bucket_shards = bucket_shards
        self.bucket_of = {s: b for b, shards in bucket_shards.items() for s in shards}
        self.etcd, self.send, self.now, self.ttl, self.settle = etcd, send, now, ttl, settle
        self.roles = {
            b: BucketRole(b, me, copies, min_copies, lease_ttl=ttl) for b in bucket_shards
        }
        for bucket, shards in bucket_shards.items():
            self.roles[bucket].current = not shards
        self.logs = {s: ShardLog() for s in self.bucket_of}
        self.book = dict.fromkeys(self.bucket_of, 0)
        self.values: dict[int, list[tuple[int, int]]] = {s: [] for s in self.bucket_of}
        self.copy_side = CopySide(me, self.roles, self.logs, bucket_shards)
        self.commit_round = CommitRound(me, self.roles, self.logs)
        self.queue: list[tuple[int, int, int]] = []  # (client sender, seq, shard)
        self.lease = 0
        self.held: list[int] = []  # the last HELD_LEASES leases granted, as Membership.held
        self.stopped: str | None = None  # why it stopped (the driver replaced it): exit 2
        self.stops_when_replaced = stops_when_replaced
        self.nonce: object = None  # the job's nonce as the last read of the map found it
        self.valid_until = -1
        self.last_beat = 0
        self.started = now()
        self.paused = False
        self.cut_off = False  # its host off the network (the world's): every etcd call fails
        self.waiting: Exchange | None = None  # the replication thread's exchange, if any
        self.snapshots = SimSnapshotThread(self)
        self.copy_host = SimCopyHost(self)  # the copy side's effects (the network thread's)
        self.acknowledged: list[tuple[int, int, int, int, int]] = []  # sender, seq, shard, v, ep
        self.n_stimuli = 0
        self.at_top = False  # the thread waits for a reason to read the map again
        self.seen: tuple = ()  # what the last read of the map saw (etcd's revision, the clock)
        self.fails, self.splits, self.unbuilt = fails, splits, unbuilt
        self.reading: Reading | None = None  # a primary's message half taken: its frames read
        self.notes: list[str] = []  # what the server said since the world last took it
        self._stopping: list[int] = []  # stopped buckets whose roles have not heard yet
        self.stops = BucketStops(me, self._stopping.append, self.notes.append)
        # the updates whose application failed here, by shard: committed, not in the values
        self.failed_writes: dict[int, set[tuple[int, int]]] = {s: set() for s in self.bucket_of}
        self.marks = BucketMarks(store, len(bucket_shards))
        for bucket, (epoch, primary, lease) in self.marks.remembered.items():
            self.roles[bucket].handle(
                Remembered(epoch, primary, lease, stimulus_id=self._sid("store"))
            )
        self.listed: frozenset[int] | None = None  # the buckets members/<me> lists
        self.thread = self._run()

    def __getstate__(self) -> dict:
        """A copy is taken only between steps, its thread waiting for news (a generator cannot
        be copied: a fresh one is parked at the same place)."""
        busy = self.snapshots.busy
        if not self.at_top or self.waiting is not None or self.reading is not None or busy:
            raise RuntimeError(f"server {self.me}: copied in the middle of a step")
        return {k: v for k, v in self.__dict__.items() if k != "thread"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.thread = self._run()
        next(self.thread)  # parked where the original waits: before its next read of the map

    # ------------------------------------------------------------------ membership

    def register(self) -> None:
        """Take a lease and put ``members/<me>`` under it (the membership's register)."""
        now = self.now()
        self.lease = self.etcd.grant(self.ttl, now)
        self.held = [*self.held[1 - HELD_LEASES :], self.lease]
        self._put_member()
        self.valid_until = now + self.ttl * 3 // 4  # the lease clock gives up before etcd
        self.last_beat = now

    def _put_member(self) -> None:
        self.listed = frozenset(b for b, role in self.roles.items() if role.seen)
        member = MemberRecord(f"sim:{self.me}", self.lease, self.ttl, self.listed)
        self.etcd.put(f"members/{self.me}", member.value(), lease=self.lease)

    def refresh_member(self) -> None:
        """The membership's refresh: ``members/<me>`` written again under its lease when this
        server learned of a bucket whose record etcd lacks (not once the lease is gone: etcd
        refuses a put under it)."""
        if self.cut_off:
            return  # etcd unreachable: tried again at the next read of the map
        if self.lease in self.etcd.leases and unlisted_and_unrecorded(self.roles, self.listed):
            self._put_member()

    def beat(self) -> None:
        """The heartbeat, once a tick: renew when due; a lease found lost is taken anew."""
        now = self.now()
        if now - self.last_beat < max(1, self.ttl // 5) or self.cut_off:
            return  # cut off: the keepalive fails, and the lease clock runs out
        self.last_beat = now
        remaining = self.etcd.keepalive(self.lease, self.ttl, now)
        if remaining <= 0:
            self.valid_until = -1
            self.register()
        else:
            self.valid_until = max(self.valid_until, now + remaining * 3 // 4)

    def valid(self) -> bool:
        return self.now() < self.valid_until

    def serving(self, shard: int) -> bool:
        """As the real server: the serving primary, under the lease its record names, valid by
        its clock."""
        return self.serves_bucket(self.bucket_of[shard])

    def serves_bucket(self, bucket: int) -> bool:
        """:meth:`serving` for every shard of ``bucket`` (a shard's answer is its bucket's
        role's)."""
        role = self.roles[bucket]
        return role.serving and role.record.lease == self.lease and self.valid()

    def answers_reads(self, shard: int) -> bool:
        """As the real server: :meth:`serving`, and past the role's wait for reads after it
        took the bucket from another server (``BucketRole.reads_open``)."""
        return self.answers_bucket_reads(self.bucket_of[shard])

    def answers_bucket_reads(self, bucket: int) -> bool:
        """:meth:`answers_reads` for every shard of ``bucket`` (a shard's answer is its
        bucket's role's)."""
        return self.serves_bucket(bucket) and self.roles[bucket].reads_open(self.now())

    def lease_time(self) -> int:
        return self.now()

    # ------------------------------------------------------------------ network thread

    def refusal(self, shard: int, what: str) -> str | None:
        """The real network thread's first check of a client's request for ``shard``: the
        ``STOPPED`` code if its bucket is stopped here, else None."""
        if self.stops.buckets:
            try:
                self.stops.check(self.bucket_of[shard], shard, what)
            except WireError as exc:
                return exc.code.name
        return None

    def submit(self, sender: int, seq: int, shard: int) -> str | None:
        """A client's update of ``shard``: queued, or ``STOPPED`` or ``NOT_PRIMARY`` (the
        answer to send)."""
        refused = self.refusal(shard, "PUSH")
        if refused:
            return refused
        if not (self.serving(shard) and self.roles[self.bucket_of[shard]].writable):
            return "NOT_PRIMARY"
        self.queue.append((sender, seq, shard))
        return None

    def applies(self, shard: int, sender: int, seq: int, how: str) -> bool:
        """Whether ``(sender, seq)``'s application to ``shard`` succeeds here; a failure stops
        its bucket, as the real engine's report of a failure after an acknowledgement does."""
        if self.fails is None or not self.fails(f"({sender}, {seq}) of shard {shard} {how}"):
            return True
        self.failed_writes[shard].add((sender, seq))
        reason = f"shard {shard}: ({sender}, {seq}) {how} failed to apply (injected)"
        self.stops.stop(self.bucket_of[shard], shard, reason)
        return False

    def handle_peer(self, m: Peer, reply: Callable[[tuple[str, int]], None]) -> str:
        """A primary's message through the copy side (the executor's :func:`receive`, as the
        real network thread runs it); ``reply`` gets the answer ``(ACK | code, version)``, at
        once or, when the world drew that its frames take a while to read, at the step that
        takes its content (:meth:`step`). What happened, for the schedule."""
        flow = receive(m, self.copy_host)
        try:
            point = next(flow)
        except StopIteration as end:
            answer = self._answer(end.value)
            reply(answer)
            return f" -> {answer}"
        steps = self.copy_host.read_steps
        self.reading = Reading(flow, reply, steps)
        return f" -> past the gate; {point} (over {steps} of its thread's steps)"

    def _take_content(self) -> str:
        """The half-taken message's content step, its answer sent."""
        reading, self.reading = self.reading, None
        answer = self._answer(run(reading.flow))
        reading.reply(answer)
        return f"its network thread takes the message's content -> {answer}"

    @staticmethod
    def _answer(action) -> tuple[str, int]:
        if isinstance(action, Refuse):
            return action.code.name, 0
        assert isinstance(action, CopyAck)
        return "ACK", action.version

    def answered(self, exchange: Exchange, index: int, answer: tuple[str, int]) -> None:
        """A copy's answer to request ``index`` of ``exchange`` (late answers are dropped)."""
        mine = exchange is self.waiting or exchange is self.snapshots.waiting
        if not mine or exchange.done[index]:
            return
        exchange.done[index] = True
        code, _ = answer
        exchange.codes[index] = code
        if code == "ACK":
            exchange.ok[index] = True
        elif code == ErrorCode.FENCED.name and exchange is self.snapshots.waiting:
            self.snapshots.fenced = True  # in the outcome: the snapshot thread tells no role
        elif code == ErrorCode.FENCED.name:
            bucket = exchange.requests[index][1].bucket
            self.roles[bucket].handle(Fenced(stimulus_id=self._sid("fenced")))

    def exchanges(self) -> list[Exchange]:
        """The exchanges out and not complete: the replication thread's, the snapshot
        thread's."""
        exchanges = (self.waiting, self.snapshots.waiting)
        return [e for e in exchanges if e is not None and not e.complete]

    def give_up(self, server: int) -> None:
        """The peer timeout: ``server`` did not answer in time (every exchange waiting on it)."""
        for exchange in self.exchanges():
            exchange.give_up(server)

    # ------------------------------------------------------------------ replication thread

    def runnable(self) -> bool:
        """Whether a step has something to do: a message half taken, the replication thread's
        work (:meth:`thread_runnable`), or the snapshot thread's."""
        return self.reading is not None or self.thread_runnable() or self.snapshots.runnable()

    def thread_runnable(self) -> bool:
        """Whether the replication thread has something to do: an exchange answered, a step
        under way, client updates queued, or the map (or the clock) changed since it was read:
        the real thread reads the map when etcd's watch fires and once per poll."""
        if self.waiting is not None:
            return self.waiting.complete
        return (
            not self.at_top
            or bool(self.queue)
            or bool(self._stopping)
            or bool(self.snapshots.outcomes)
            or self.seen != self._now_seen()
        )

    def _now_seen(self) -> tuple:
        return (self.etcd.revision, self.etcd.wipes, self.now())

    def step(self) -> str:
        """Run the replication thread to its next blocking point (what it blocked on), or, once
        the steps drawn for a half-taken message's read are done (or the thread has nothing to
        do), take that message's content."""
        reading = self.reading
        if reading is not None and (reading.steps == 0 or not self.thread_runnable()):
            return self._take_content()
        if reading is not None:
            reading.steps -= 1
        if self.snapshots.runnable():
            return self.snapshots.step()
        return next(self.thread)

    def _run(self) -> Iterator[str]:
        while True:
            self.at_top = True
            yield "read the map"
            self.at_top = False
            self.seen = self._now_seen()
            yield from self._stop_buckets()
            yield from self._observe()
            batch, self.queue = self.queue[:MAX_BATCH], self.queue[MAX_BATCH:]
            if batch:
                yield from self._process(batch)
            yield from self._snapshots_answered()

    def _snapshots_answered(self) -> Iterator[str]:
        """As the real thread's turn: tell the roles what the snapshot thread's parcels came
        to, and carry out what they ask next."""
        while self.snapshots.outcomes:
            action, delivered, fenced = self.snapshots.outcomes.pop(0)
            actions = snapshot_answered(action, delivered, fenced, self.roles, self)
            yield from self._carry_out(actions)
            if delivered:  # the map read again next turn, as the real thread does
                self.seen = ()

    def _stop_buckets(self) -> Iterator[str]:
        """As the real thread's turn: tell the roles of the buckets stopped since the last one
        (:class:`Stopped`), unless a snapshot lifted the stop meanwhile."""
        while self._stopping:
            bucket = self._stopping.pop(0)
            if self.stops.stopped(bucket):
                actions = self.roles[bucket].handle(Stopped(stimulus_id=self._sid("stopped")))
                yield from self._carry_out(actions)

    def _observe(self) -> Iterator[str]:
        if self.cut_off:  # etcd unreachable: the real thread's read raises, and it goes on to
            yield "read the map: etcd unreachable"  # its batch (the roles hear nothing)
            return
        mine = f"{REVOKED_PREFIX}{self.me}"  # the one marker replaced() reads
        ended = replaced([(mine, self.etcd.get(mine)[0])], self.me, self.held)
        if ended is not None and self.stops_when_replaced:  # replaced: it stops (the adapter's)
            self.stopped = (
                f"the driver ended its lease {ended:#x} early (revoked/{self.me}): exit 2"
            )
            self.etcd.revoke(self.lease)  # the adapter's _fail_over gives its lease back
            self.valid_until = -1
            self.notes.append(f"server {self.me} stops: {self.stopped}")
            while True:  # no role hears of this read; the world takes the process away
                yield "stopped"
        # this read's history (:mod:`~hogwild_plugins.ps.job_nonce`): written if etcd has none
        self.nonce = self.etcd.adopt((self.me, self.incarnation, self.etcd.wipes))
        members = self.etcd.members()
        records = {b: self.etcd.record(b, self.nonce) for b in self.roles}
        self.marks.saw(followed(records, self.roles))
        valid = self.valid()
        settled = len(members) == self.etcd.n_servers or self.now() - self.started >= self.settle
        view = MapView(records, members, self.etcd.seen(), self.etcd.revoked())
        now = self.lease_time()
        for bucket, role in self.roles.items():
            sid = self._sid("map")
            actions = role.handle(map_read(view, bucket, self.lease, valid, settled, now, sid))
            yield from self._carry_out(actions)
        self.refresh_member()

    def _carry_out(self, actions: list) -> Iterator[str]:
        yield from carry_out(actions, self.roles, self)

    # ------------------------------------------------------------------ the executor's effects
    # (plugins/ps/replication/executor.py, the loops the real server runs: each effect that
    # blocks there yields here, where the world decides what happens meanwhile)

    def stimulus(self, what: str) -> str:
        return self._sid(what)

    def replace_record(self, action) -> Iterator[str]:
        yield f"{type(action).__name__} {action.bucket}"
        while self.cut_off:
            # the real request waits (its timeout per etcd member, then the next member's):
            # the thread stays here while the host is cut off, and the request reaches etcd
            # once the link is back (its bytes retransmitted), its answer read as usual
            yield f"{type(action).__name__} {action.bucket}: waits, etcd unreachable"
        key, value = f"sync/{action.bucket}", action.record.value()
        done = self.etcd.replace(key, value, action.expected, self.nonce)
        if self.splits is not None and self.splits(f"sync/{action.bucket} read back"):
            yield f"read sync/{action.bucket} back"  # a request of its own, as the real one's
        record = self.etcd.record(action.bucket, self.nonce)
        self.marks.saw(followed({action.bucket: record}, self.roles))  # before the role hears
        return done, record

    def record_written(self, action, done: bool) -> None:
        pass  # the real server's counters and failover timings: nothing to check here

    def etcd_failed(self, exc: Exception) -> None:
        if not isinstance(exc, EtcdUnavailable):
            raise AssertionError(f"the simulated etcd fails a call only when cut off: {exc}")
        self.notes.append(f"server {self.me}: etcd unreachable ({exc})")

    def send_snapshot(self, action) -> Iterator[str]:
        return self.snapshots.send(action)

    def commit_prepared(self, bucket: int) -> None:
        self._commit_prepared(bucket)

    def stopped_here(self, bucket: int) -> bool:
        return self.stops.stopped(bucket)

    def _commit_prepared(self, bucket: int) -> None:
        for shard in self.bucket_shards[bucket]:
            log = self.logs[shard]
            items = commit_log(log, log.last, self.roles[bucket].epoch)
            self.values[shard] += [
                (w.sender, w.seq)
                for _, _, w in items
                if self.applies(shard, w.sender, w.seq, "prepared, committed by a new primary")
            ]
            self.book[shard] = log.committed

    def exchange(self, requests: list[tuple[int, Peer]]) -> Iterator[str]:
        """Send each ``(copy, message)`` and wait (the replication thread's exchange, the
        world delivering or giving up on every answer); the exchange."""
        exchange = Exchange(requests)
        self.waiting = exchange
        for i, (dst, message) in enumerate(requests):
            self.send(dst, (exchange, i, message))
        while not exchange.complete:
            yield f"exchange {[(d, m.kind, m.shard, m.version) for d, m in requests]}"
        self.waiting = None
        return exchange

    def _process(self, batch: list[tuple[int, int, int]]) -> Iterator[str]:
        """One commit round for ``batch`` (:mod:`~hogwild_plugins.ps.simulation.primary_round`)."""
        updates = tuple(Update(s, q, shard, self.bucket_of[shard]) for s, q, shard in batch)
        yield from run_round(updates, self.roles, SimPrimaryRound(self, updates))

    def open_shards(self) -> set[int]:
        """The shards the commit round has applied here and not recorded yet."""
        return {s for s in self.bucket_of if self.commit_round.applying(s)}

    def _sid(self, what: str) -> str:
        self.n_stimuli += 1
        return f"{what}-{self.me}.{self.incarnation}-{self.n_stimuli}"

    def stories(self) -> str:
        lines = [f"server {self.me} (incarnation {self.incarnation}, lease {self.lease:#x}):"]
        for bucket, role in self.roles.items():
            lines.append(
                f"  bucket {bucket}: {role.role.value} epoch {role.epoch} "
                f"current {role.current} record {role.record}"
            )
            lines += [f"    {t}" for t in role.story()[-12:]]
        lines.append(f"  commit round ({self.commit_round.phase.value}):")
        lines += [f"    {t}" for t in self.commit_round.story()[-12:]]
        lines.append("  copy side:")
        lines += [f"    {t}" for t in self.copy_side.story()[-12:]]
        for shard, log in self.logs.items():
            lines.append(
                f"  shard {shard}: {log.committed=} {log.epoch=} values {self.values[shard]} "
                f"table {log.table()}"
            )
        return "\n".join(lines)
