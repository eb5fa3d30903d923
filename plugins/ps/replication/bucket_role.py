"""One server's part in one bucket of the replicated parameter server: a state machine.

No I/O here (after dask's worker state machine): a :class:`BucketRole` changes only through its one
entry, :meth:`BucketRole.handle`, which takes a stimulus (the records of
:mod:`~hogwild_plugins.ps.replication.bucket_role_events`: the map read, a campaign's, an
``in_sync`` write's or a hand-over's answer, a snapshot delivered, a copy unreachable or fencing,
...; each names itself with a ``stimulus_id``), records the transition in its
:meth:`~BucketRole.story` and returns what to do (a campaign, an ``in_sync`` write, a snapshot
to send, a hand-over, the commit of what was prepared) for
:mod:`~hogwild_plugins.ps.replication.executor` to carry out against etcd and the other servers;
what comes back is the next stimulus. :meth:`~BucketRole.validate_state` checks its invariants (a
primary is the record's and in its ``in_sync``, only a primary has a primary's work open, only a
server holding the bucket's state campaigns, serves or hands over; a stopped bucket is neither
served nor campaigned for). The protocol it plays its part in is described in
:mod:`~hogwild_plugins.ps.failover`. What the role knows of the bucket's history in etcd (the
newest epoch seen, its holder, a loss), against which every record it is given is judged, is a
:class:`~hogwild_plugins.ps.replication.known_history.KnownHistory`.

A snapshot's answer may come late (the real server sends snapshots beside its other work:
:mod:`~hogwild_plugins.ps.replication.snapshot_sender`): each :class:`Sync` carries a ticket its
answer names, and an answer to a Sync the role no longer waits for (deposed or elected again
since, the copy dropped and asked for again) is no news; one delivered to a copy that registered
under a new lease since is a copy unreachable.

A bucket stops on a server (``Stopped``, :mod:`~hogwild_plugins.ps.stops`) when a write this
server acknowledged or committed failed to apply here: its memory no longer holds the bucket's
acknowledged state. As primary it hands the bucket to a live in-sync copy caught up in this
epoch (any, not only the preferred one: the copies committed the write), or, with none, steps
down; as a copy it is no longer current (it never campaigns), and its copy side refuses its
primary's prepares and commits until snapshots have replaced the shards that failed
(``StopLifted``), after which a primary's ``Restored`` makes it current again.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from hogwild_plugins.ps.failover import BucketRecord, desired_copies
from hogwild_plugins.ps.replication.bucket_role_events import (
    Campaign,
    CampaignAnswered,
    CommitPrepared,
    CopyUnreachable,
    Fenced,
    HandOver,
    HandOverAnswered,
    InSyncWritten,
    MapRead,
    RecordRefreshed,
    Remembered,
    Restored,
    RoleStimulus,
    SnapshotDelivered,
    StepDown,
    StopLifted,
    Stopped,
    Sync,
    WriteInSync,
)
from hogwild_plugins.ps.replication.known_history import KnownHistory
from hogwild_plugins.ps.replication.reads_gate import ReadsGate, takeover_wait

__all__ = ["BucketRole", "Role"]

STORY_LENGTH = 1024  # transitions a role remembers (:meth:`BucketRole.story`)
AWAY = 0  # as a copy's lease in ``copy_leases``: away when the primary won (etcd grants none 0)


# --------------------------------------------------------------------------- bucket role


class Role(Enum):
    FOLLOWER = "follower"  # a copy (in sync or catching up) or not holding the bucket
    CANDIDATE = "candidate"  # campaigning
    PRIMARY = "primary"
    DEPOSED = "deposed"  # was primary and is no longer: serves nothing until the map moves on
    HANDING = "handing"  # was primary, handing the bucket to its preferred copy: serves nothing


@dataclass
class BucketRole:
    """One server's view of, and part in, one bucket.

    Args:
        bucket: The bucket.
        me: This server's index.
        copies: Copies per bucket.
        min_copies: ``ps.min_copies``: the live in-sync copies (this one included) a write
            needs to be acknowledged; with fewer the bucket refuses writes (it still serves
            reads) until a copy catches up.
        empty: The bucket holds no shard (a layout with more buckets than shards): every copy
            holds its whole state, none, so it is always current (catching a copy up sends it
            nothing, so no :class:`Restored` ever tells it so).
        lease_ttl: This server's lease TTL, in the clock's units of :class:`CampaignAnswered`'s
            ``at``: a primary that took back a record naming it that it did not win in this
            life waits at least this long for reads (:meth:`reads_open`; after a revocation,
            the revoked holders' TTLs, which the map's read brings). Required (keyword), with
            no default: a host that left it out would silently answer reads at once.
    """

    bucket: int
    me: int
    copies: int
    min_copies: int = 1
    empty: bool = False
    lease_ttl: float = field(kw_only=True)  # required: 0.0 would mean no wait for reads
    role: Role = Role.FOLLOWER
    record: BucketRecord | None = None
    members: Mapping[int, int] = field(default_factory=dict)  # live server -> its lease
    current: bool = False  # holds the bucket's acknowledged state (a snapshot, or first primary)
    # the newest epoch whose primary's snapshot made this copy current (a bucket of several
    # shards: each shard's; current counts for campaigns only with this copy in in_sync, where
    # a primary puts it once every shard's snapshot arrived)
    restored_epoch: int = 0
    # what this side knows of the bucket's history in etcd: a record of another is never followed
    history: KnownHistory = field(default_factory=KnownHistory)
    # a write applied here failed after it was acknowledged or committed: this side's memory is
    # not the bucket's state until a primary's snapshot replaces it (:class:`Stopped`)
    stopped: bool = False
    copy_leases: dict[int, int] = field(default_factory=dict)  # as primary: copy -> lease synced
    confirmed: set[int] = field(default_factory=set)  # as primary: copies caught up this epoch
    syncing: set[int] = field(default_factory=set)  # as primary: snapshots under way
    # as primary: the ticket of each copy's Sync (its answer names it); the last one given
    sync_tickets: dict[int, int] = field(default_factory=dict)
    tickets: int = 0
    first_ticket: int = 1  # the first ticket of this primaryship's Syncs
    sync_leases: dict[int, int] = field(default_factory=dict)  # the copy's lease at its Sync
    writing: bool = False  # as primary: a WriteInSync under way
    behind: set[int] = field(default_factory=set)  # as primary: caught up, to add to in_sync
    dropping: set[int] = field(default_factory=set)  # as primary: to remove from in_sync
    campaign: BucketRecord | None = None  # as candidate: the record its campaign writes
    won_epoch: int = 0  # the epoch of the last campaign this side won
    # the wait for reads after a takeover: decided when campaigning, opened from the answer
    reads: ReadsGate = field(default_factory=ReadsGate)
    transitions: deque = field(
        default_factory=lambda: deque(maxlen=STORY_LENGTH), repr=False, compare=False
    )

    def handle(self, stimulus: RoleStimulus) -> list:
        """The role's one entry: take ``stimulus``, return the actions to carry out (each of
        which comes back as a stimulus). Every transition goes into :meth:`story`."""
        before = self.role
        match stimulus:
            case MapRead():
                actions = self._observe(
                    stimulus.record,
                    stimulus.members,
                    stimulus.lease,
                    stimulus.lease_valid,
                    stimulus.settled,
                    stimulus.blank,
                    stimulus.revoked_ttl,
                    stimulus.at,
                )
            case CampaignAnswered():
                actions = self._campaigned(stimulus.won, stimulus.record, stimulus.at)
            case InSyncWritten():
                actions = self._written(stimulus.ok, stimulus.record)
            case HandOverAnswered():
                actions = self._handed(stimulus.ok, stimulus.record)
            case SnapshotDelivered():
                stale = self._stale(stimulus.ticket, stimulus.server)
                server = stimulus.server
                if stale:
                    actions = []
                elif stimulus.ticket is not None and self._restarted_since(server):
                    actions = self._unreachable(server)  # delivered to the process gone since
                else:
                    actions = self._synced(server)
            case CopyUnreachable():
                stale = self._stale(stimulus.ticket, stimulus.server)
                actions = [] if stale else self._unreachable(stimulus.server)
            case Fenced():
                actions = [] if self._stale(stimulus.ticket) else self._fenced()
            case Restored():
                self._restored(stimulus.epoch)
                actions = []
            case StepDown():
                actions = self._step_down(stimulus.record)
            case RecordRefreshed():
                self._refreshed(stimulus.record)
                actions = []
            case Stopped():
                actions = self._stopped()
            case StopLifted():
                self.stopped = False
                actions = []
            case Remembered():
                self.history.know(stimulus.epoch, (stimulus.primary, stimulus.lease))
                actions = []
            case _:
                raise TypeError(f"bucket role: not a stimulus: {stimulus!r}")
        if self.record is not None:
            self.history.know(self.record.epoch, (self.record.primary, self.record.lease))
        self.transitions.append(
            (stimulus.stimulus_id, type(stimulus).__name__, before, self.role, tuple(actions))
        )
        return actions

    def __post_init__(self) -> None:
        if self.empty:
            self.current = True

    def story(self) -> list[tuple]:
        """The last transitions, oldest first: ``(stimulus_id, stimulus, role before, role
        after, actions)``."""
        return list(self.transitions)

    def validate_state(self) -> None:
        """Check the role's invariants (tests call it after every stimulus).

        Raises:
            AssertionError: An invariant broken, with the last transitions.
        """

        def check(ok: bool, what: str) -> None:
            if not ok:  # (the message is formatted only then: the simulator checks every step)
                raise AssertionError(
                    f"bucket {self.bucket} on {self.me}: {what.format(role=self.role)}; "
                    f"{self.story()[-5:]}"
                )

        primary = self.role is Role.PRIMARY
        check(isinstance(self.role, Role), "role {role!r}")
        check(not self.serving or primary, "serving, not as primary")
        check(
            primary or not (self.syncing or self.behind or self.dropping or self.writing),
            "{role.value} with primary's work open",
        )
        check(self.syncing <= set(self.sync_tickets), "syncing a copy with no Sync's ticket")
        if primary:
            check(self.record is not None and self.record.primary == self.me, "primary, not named")
            check(self.me in self.record.in_sync, "primary, not in in_sync")
            check(self.me not in self.syncing | self.dropping, "primary syncing or dropping itself")
        if self.role in (Role.PRIMARY, Role.CANDIDATE, Role.HANDING):
            check(self.current, "{role.value} without the bucket's state")
        check(not self.empty or self.current, "a bucket without shards, not current")
        check(
            self.record is None or self.history.lost or not self.foreign(self.record),
            "following a record of another history",
        )
        if self.stopped:
            check(self.role not in (Role.PRIMARY, Role.CANDIDATE), "stopped, as {role.value}")
            check(self.role is Role.HANDING or not self.current, "stopped, and current")

    @property
    def serving(self) -> bool:
        """As primary, with every live in-sync copy caught up in this epoch: takes client
        requests (an acknowledged update is then on every copy a successor may come from)."""
        if self.role is not Role.PRIMARY or self.syncing or self.writing:
            return False
        return all(s in self.confirmed for s in self.record.in_sync if s in self.members)

    def reads_open(self, now: float) -> bool:
        """Serving, and past the wait for reads at ``now`` (the clock of
        :class:`CampaignAnswered`'s ``at``): answers pulls. How long a takeover waits, and why,
        is :mod:`~hogwild_plugins.ps.replication.reads_gate`'s."""
        return self.serving and self.reads.open(now)

    @property
    def reads_from(self) -> float:
        """As primary: from when (the clock of :class:`CampaignAnswered`'s ``at``) it answers
        reads (``math.inf``: once a map read holds no ``revoked/<i>`` marker naming no TTL)."""
        return math.inf if self.reads.held_since is not None else self.reads.opens_at

    @property
    def holders(self) -> int:
        """The live in-sync copies, this one included (each caught up while it serves)."""
        return sum(1 for s in self.record.in_sync if s in self.members) if self.record else 0

    @property
    def writable(self) -> bool:
        """Serving, with at least ``min_copies`` live in-sync copies: takes client writes."""
        return self.serving and self.holders >= self.min_copies

    @property
    def seen(self) -> bool:
        """This side saw a record of the bucket, met a member that had, or its store remembers
        one (``members/<me>`` lists the bucket in ``seen``)."""
        return self.history.seen

    @property
    def known_epoch(self) -> int:
        """The newest epoch of a record this side has seen (or its store remembered)."""
        return self.history.epoch

    @property
    def record_lost(self) -> bool:
        """etcd's record was found not to be this side's history: the bucket serves nothing."""
        return self.history.lost

    def foreign(self, record: BucketRecord | None) -> bool:
        """Whether ``record`` (None: missing) is not the bucket's history this side knows
        (:meth:`KnownHistory.foreign`). Read by the hosts, which mark only this side's history
        in the server's store."""
        return self.history.foreign(record)

    @property
    def epoch(self) -> int:
        return self.record.epoch if self.record else 0

    def _observe(
        self,
        record: BucketRecord | None,
        members: Mapping[int, int],
        lease: int,
        lease_valid: bool,
        settled: bool = True,
        blank: bool = True,
        revoked_ttl: float = 0.0,
        at: float | None = None,
    ) -> list:
        """The map as etcd has it now (the record, the live members and their leases); this
        server's lease.
        ``settled``: every server has registered, or long enough has passed since the start
        (only then is a bucket's very first primary chosen, so that the first primaries are
        spread over every server rather than taken by the first one up)."""
        self.members = members
        self.reads.seen(at, revoked_ttl)  # may end a wait held by a marker naming no TTL
        if not blank:
            self.history.started = True
        refreshed, self.history.refreshed = self.history.refreshed, False
        if self.foreign(record):
            if refreshed:
                # read before the record the copy side refreshed meanwhile (the host reads the
                # map once for every bucket, and its network thread reads a record whenever a
                # newer epoch's message arrives): no news; the next read tells a loss
                return []
            # etcd lost the bucket's state: step down and wait; nothing here decides who holds
            # every acknowledged update (an operator restarts the job from a checkpoint)
            return self._lose_record()
        if (
            record is not None
            and self.record is not None
            and record.revision < self.record.revision
        ):
            record = self.record  # an older read than one this side already wrote or saw
        if self.role is Role.PRIMARY:
            mine = record is not None and record.primary == self.me and record.lease == lease
            if not lease_valid or not mine:
                return self._step_down(record)
            self.record = record
            return self._reconcile() or self._hand_back(at)
        self.record = record
        if self.role is Role.DEPOSED and (record is None or record.primary != self.me):
            self.role = Role.FOLLOWER
            if (
                record is not None
                and self.me not in record.in_sync
                and record.epoch > self.restored_epoch
                and not self.empty
            ):
                # A newer primary left it out: its memory may hold updates it applied as
                # primary and nobody acknowledged. Not so if that primary's snapshot replaced
                # it already: the snapshot can come before the write adding it to ``in_sync``
                # does, and a copy that forgot it is current would strand the bucket once
                # handed it (named primary, it would wait for a copy holding its state).
                self.current = False
        if self.role not in (Role.FOLLOWER, Role.DEPOSED) or not lease_valid:
            return []
        if members.get(self.me) != lease:
            return []
        if record is None:
            if not settled or self.history.started or self.role is not Role.FOLLOWER:
                return []  # a first primary only of a bucket no server has seen a record of
            first = desired_copies(self.bucket, members, self.copies)
            if first and first[0] == self.me:  # the very first primary of the bucket
                self.current = True  # nothing acknowledged yet: every server starts the same
                return self._campaign(BucketRecord(1, self.me, lease, (self.me,)), 0)
            return []
        if record.primary == self.me:
            # Named primary and not serving: a late heartbeat (the same lease), a lease lost and
            # taken anew, or a campaign whose answer was lost. As the bucket's last primary this
            # side holds every acknowledged update, if it still has its memory (``current``);
            # a new process does not, and the bucket waits for the one that had it.
            return self._take(record, members, lease, revoked_ttl) if self.current else []
        alive = members.get(record.primary) == record.lease  # a restarted one has a new lease
        if not alive and self.current and self.me in record.in_sync:
            return self._take(record, members, lease, revoked_ttl)
        return []

    def _take(
        self,
        record: BucketRecord,
        members: Mapping[int, int],
        lease: int,
        revoked_ttl: float = 0.0,
    ) -> list:
        """Campaign for the bucket under the next epoch. The other live in-sync copies stay in
        ``in_sync``: they hold every acknowledged update, so one of them may still succeed this
        side if it dies before it serves; it serves only once each has its snapshot.

        How long its reads wait once it wins (:meth:`reads_open`) is decided here, by what the
        record replaced says of the servers that may still answer the bucket's reads, and by
        ``revoked_ttl``, the longest TTL among the ``revoked/<i>`` markers of the same read (0:
        none): :func:`~hogwild_plugins.ps.replication.reads_gate.takeover_wait`."""
        others = tuple(s for s in record.in_sync if s != self.me and s in members)
        # and, to keep ``min_copies`` in it, in-sync copies away now (paused past their lease,
        # say): they missed nothing acknowledged, and one that returns with its memory may
        # still succeed this side (it is caught up, or written out, once it registers again)
        away = [s for s in record.in_sync if s != self.me and s not in members]
        others += tuple(away[: max(0, self.min_copies - 1 - len(others))])
        return self._campaign(
            BucketRecord(record.epoch + 1, self.me, lease, (self.me, *others)),
            record.revision,
            reads_wait=takeover_wait(record, self.me, self.won_epoch, self.lease_ttl, revoked_ttl),
        )

    def _campaign(self, record: BucketRecord, expected: int, reads_wait: float = 0.0) -> list:
        self.role, self.campaign = Role.CANDIDATE, record
        self.reads.campaigning(reads_wait)
        return [Campaign(self.bucket, record, expected)]

    def _campaigned(self, won: bool, record: BucketRecord | None, at: float = 0.0) -> list:
        """The campaign's transaction came back at ``at``: ``record`` is what ``sync/<b>``
        holds now."""
        if self.role is not Role.CANDIDATE:
            return []
        campaign, self.campaign = self.campaign, None
        if won and (record is None or record.primary != self.me or record.epoch != campaign.epoch):
            # written, then another campaign won before the read back (this side's lease
            # lapsed in between): that record is the bucket's, not this side's
            won = False
        if not won:
            self.role = Role.FOLLOWER
            if self.history.disowns(record):
                return self._lost()  # another history won: never followed
            self.record = record or self.record
            return []
        self.role, self.record, self.current = Role.PRIMARY, record, True
        # reads wait out whoever may still answer them (decided when campaigning); a wait still
        # owed is never shortened: taking back its own record inside the wait it owes another
        # (its own lease lost meanwhile) leaves that one's clock running as before
        self.reads.won(at)
        self.won_epoch = record.epoch
        self.first_ticket = self.tickets + 1
        self.history.refreshed = False  # a refresh seen while campaigning: older than this
        # an in-sync copy kept while away (``_take``: not registered, paused past its lease)
        # has been caught up by nobody: it counts as gone (AWAY is no lease), written out of
        # in_sync once that leaves min_copies (a prepare of this epoch must never reach a log
        # that a deposed primary's round left diverged), caught up when it registers again
        self.copy_leases = {s: self.members.get(s, AWAY) for s in record.in_sync}
        self.confirmed = {self.me}
        self.syncing, self.behind, self.dropping, self.writing = set(), set(), set(), False
        return [CommitPrepared(self.bucket), *self._reconcile()]

    def _reconcile(self) -> list:
        """As primary: catch up the live copies that should hold the bucket and do not."""
        wanted = set(desired_copies(self.bucket, self.members, self.copies)) | {self.me}
        in_sync = set(self.record.in_sync)
        gone = {  # dead, or restarted since it was caught up (a new lease: its memory is new)
            s for s in in_sync if s != self.me and self.members.get(s) != self.copy_leases.get(s)
        }
        self.confirmed -= gone  # caught up again (under its new lease) once it answers
        for s in sorted(gone - self.dropping):
            if self._droppable(s):
                self.dropping.add(s)
        if gone & self.dropping:
            return [] if self.writing else self._write(self._next_in_sync())
        todo = ((wanted | in_sync) - self.confirmed - self.syncing) & set(self.members)
        self.syncing |= todo
        syncs = []
        for s in sorted(todo):
            self.tickets += 1
            self.sync_tickets[s] = self.tickets
            self.sync_leases[s] = self.members[s]
            syncs.append(Sync(self.bucket, s, self.epoch, self.tickets))
        return syncs

    def successor(self) -> int | None:
        """As serving primary, the copy to hand the bucket to: the bucket's preferred primary
        (the first of :func:`desired_copies` over the live members) when it is not this server
        and is live, in ``in_sync`` and caught up in this epoch under its present lease."""
        if not self.serving or self.dropping or self.behind:
            return None
        preferred = desired_copies(self.bucket, self.members, self.copies)
        if not preferred or preferred[0] == self.me:
            return None
        s = preferred[0]
        if s not in self.record.in_sync or s not in self.confirmed:
            return None
        lease = self.members.get(s)
        return s if lease is not None and self.copy_leases.get(s) == lease else None

    def _hand_back(self, at: float | None) -> list:
        """Hand the bucket to its preferred primary (:meth:`successor`), once this side's own
        reads are open at ``at`` (the map's read): the handed record is then marked ``handed``
        and the successor answers reads at once. Not told the time (``at`` None), it hands
        over unmarked: the successor waits out a lease for reads."""
        successor = self.successor()
        if successor is None or (at is not None and not self.reads_open(at)):
            return []
        return self._hand_to(successor, handed=at is not None)

    def _hand_to(self, successor: int, handed: bool = False) -> list:
        self.role = Role.HANDING  # serves nothing from now on: no acknowledgement after this
        # a primary's work still open (a stopped primary hands over whatever it was doing: a copy
        # being dropped or synced) is the successor's to redo under its epoch
        self.syncing, self.behind, self.dropping, self.writing = set(), set(), set(), False
        record = self.record
        in_sync = (successor, *(s for s in record.in_sync if s != successor))
        new = BucketRecord(
            record.epoch + 1, successor, self.members[successor], in_sync, handed=handed
        )
        return [HandOver(self.bucket, new, record.revision)]

    def _handed(self, ok: bool, record: BucketRecord | None) -> list:
        """A :class:`HandOver` came back; ``record`` is what ``sync/<b>`` holds now (None: not
        known). Won: a follower (still current: it holds every acknowledged update, and stays in
        ``in_sync``). Lost or not known: deposed, and the next read of the map decides (a record
        that still names this server is taken back under the next epoch)."""
        if self.role is not Role.HANDING:
            return []
        self.syncing, self.behind, self.dropping, self.writing = set(), set(), set(), False
        if self.stopped:
            self.current = False  # handed for want of the state: never take it back
        if self.history.disowns(record):
            return self._lost()  # another history: deposed, never followed
        self.role = Role.FOLLOWER if ok and record is not None else Role.DEPOSED
        if record is not None and (self.record is None or record.revision >= self.record.revision):
            self.record = record
        return []

    def _droppable(self, server: int) -> bool:
        """Whether ``server`` may be written out of ``in_sync``: not if that left fewer than
        ``min_copies`` in it. Kept, not caught up, it blocks writes (and reads while it is live)
        until it is caught up again; it missed only updates nobody acknowledged, so, paused
        rather than dead, it may still succeed this primary (a restarted process holds no
        state and never campaigns)."""
        kept = [s for s in self.record.in_sync if s != server and s not in self.dropping]
        return len(kept) >= self.min_copies

    def _next_in_sync(self) -> tuple[int, ...]:
        kept = [s for s in self.record.in_sync if s not in self.dropping]
        return tuple(kept + sorted(self.behind - self.dropping - set(kept)))

    def _write(self, in_sync: tuple[int, ...]) -> list:
        self.writing = True
        new = BucketRecord(self.record.epoch, self.me, self.record.lease, in_sync)
        return [WriteInSync(self.bucket, new, self.record.revision)]

    def _stale(self, ticket: int | None, server: int | None = None) -> bool:
        """Whether an answer to the :class:`Sync` of ``ticket`` (None: answered at once) is no
        news: the role no longer waits for that Sync (deposed or elected again since, the copy
        dropped meanwhile, or another Sync of it asked for since: the snapshot that Sync took
        may be older than what the bucket acknowledged after)."""
        if ticket is None:
            return False
        if self.role is not Role.PRIMARY:
            return True
        if server is None:  # a fence of this primaryship's Sync deposes it, awaited or not
            return ticket < self.first_ticket
        return server not in self.syncing or self.sync_tickets.get(server) != ticket

    def _restarted_since(self, server: int) -> bool:
        """Whether ``server`` registered under another lease (a new process, its memory new)
        since its awaited Sync was asked for: an answer that came later may be the old one's."""
        return self.members.get(server) != self.sync_leases.get(server)

    def awaits(self, sync: Sync) -> bool:
        """Whether the role still waits for ``sync``'s answer (a host may look before it sends
        the snapshot; the role decides on the answer)."""
        return not self._stale(sync.ticket, sync.server)

    def _synced(self, server: int) -> list:
        """A snapshot reached ``server``: it joins ``in_sync``."""
        self.syncing.discard(server)
        if self.role is not Role.PRIMARY:
            return []
        if server not in self.members:  # it left while its snapshot was on the way
            return self._unreachable(server)
        self.copy_leases[server] = self.members[server]
        self.confirmed.add(server)
        if server in self.record.in_sync and server not in self.dropping:
            return []
        self.behind.add(server)  # (back) into in_sync, after a removal under way if any
        self.dropping.discard(server)
        return [] if self.writing else self._write(self._next_in_sync())

    def _unreachable(self, server: int) -> list:
        """``server`` did not answer a prepare, commit or snapshot, or reported a gap: it leaves
        ``in_sync`` (and is caught up again once it answers)."""
        self.syncing.discard(server)
        self.behind.discard(server)
        self.confirmed.discard(server)
        if self.role is not Role.PRIMARY or server == self.me:
            return []
        if server in self.record.in_sync and not self._droppable(server):
            return []
        self.dropping.add(server)
        if server not in self.record.in_sync or self.writing:
            return []  # not in it, or the write under way is followed by another (written)
        return self._write(self._next_in_sync())

    def _written(self, ok: bool, record: BucketRecord | None) -> list:
        """A :class:`WriteInSync` came back; ``record`` is what etcd holds now. Changes asked for
        while it was under way go out next."""
        self.writing = False
        if self.role is not Role.PRIMARY:
            return []
        if not ok:
            return self._step_down(record)  # someone else wrote: a newer primary
        if record is None or self.history.disowns(record):
            # written, then gone before it was read back (etcd lost the job's keys), or another
            # history's since: the loss a map read would find
            return self._lose_record()
        if record.primary != self.me or record.epoch != self.record.epoch:
            return self._step_down(record)  # a newer primary won between the write and the read
        self.record = record
        self.behind -= set(record.in_sync)
        self.dropping &= set(record.in_sync)
        if self.behind or self.dropping:
            return self._write(self._next_in_sync())
        return self._reconcile()

    def _fenced(self) -> list:
        """A copy refused this primary's message as coming from an old epoch."""
        return self._step_down(None) if self.role is Role.PRIMARY else []

    def _restored(self, epoch: int) -> None:
        """A snapshot of the bucket arrived from its primary of ``epoch``: this copy is current
        (its own memory, diverged or not, is replaced by that primary's), unless this side read
        meanwhile a newer epoch's record that leaves it out of ``in_sync`` (the snapshot may lack
        what that primary acknowledged; one that keeps it in acknowledged nothing it lacks: a
        primary serves only once every live in-sync copy is confirmed)."""
        record = self.record
        if record is not None and epoch < record.epoch and self.me not in record.in_sync:
            return
        if self.stopped:  # a shard's snapshot came before its failure: not the state yet
            return
        self.current = True
        self.restored_epoch = max(self.restored_epoch, epoch)

    def _stopped(self) -> list:
        """A write failed to apply here after it was acknowledged or committed (see the module
        docstring): as primary, hand the bucket to a caught-up in-sync copy, or step down; as
        anything else, no longer current."""
        if self.stopped:
            return []
        self.stopped = True
        if self.role is Role.PRIMARY:
            successor = self._any_successor()
            if successor is not None:
                return self._hand_to(successor)
            self._step_down(None)
        elif self.role is Role.CANDIDATE:
            self.role = Role.DEPOSED  # its campaign's answer decides nothing any more
        if self.role is not Role.HANDING:
            self.current = False
        return []

    def _any_successor(self) -> int | None:
        """As primary, a live in-sync copy caught up in this epoch under its present lease (the
        lowest-numbered), or None."""
        for s in sorted(self.record.in_sync):
            lease = self.members.get(s)
            if (
                s != self.me
                and s in self.confirmed
                and s not in self.dropping
                and lease is not None
                and self.copy_leases.get(s) == lease
            ):
                return s
        return None

    def _refreshed(self, record: BucketRecord) -> None:
        """A primary's record changes through its own reads only (it may be deposed); a record
        older than one seen is etcd's lost state, never followed (the next read says so)."""
        if self.foreign(record):
            return
        if self.role is not Role.PRIMARY and (
            self.record is None or record.revision > self.record.revision
        ):
            self.record = record
            self.history.refreshed = True

    def _lose_record(self) -> list:
        """etcd's record is not this side's history (see :meth:`foreign`): never followed."""
        self.history.lost = True
        return self._lost()

    def _lost(self) -> list:
        """The bucket's record vanished or went back (see :class:`KnownHistory`): serve nothing,
        hold on to this side's state, campaign for nothing."""
        if self.role is Role.PRIMARY:
            self._step_down(None)
        elif self.role in (Role.CANDIDATE, Role.HANDING):
            self.role = Role.DEPOSED
        return []

    def _step_down(self, record: BucketRecord | None) -> list:
        if self.role is Role.PRIMARY:
            self.role = Role.DEPOSED  # its memory stays current until a newer primary shows
        self.syncing, self.behind, self.dropping, self.writing = set(), set(), set(), False
        if record is not None and not self.history.disowns(record):
            self.record = record  # (another history's is never followed)
        return []
