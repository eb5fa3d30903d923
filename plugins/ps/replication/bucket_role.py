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

Its transitions fall in three parts besides the machine's own (its state, its entry, its story,
its invariants, and what ends or suspends a primaryship: a fence, a step down, a lost record, a
stop): a map read and a campaign (:mod:`~hogwild_plugins.ps.replication.bucket_role_map_read`),
a primary catching its copies up and keeping ``in_sync`` true, Syncs answered late included
(:mod:`~hogwild_plugins.ps.replication.bucket_role_in_sync`), and a hand-over
(:mod:`~hogwild_plugins.ps.replication.bucket_role_hand_over`). They are mixins of this one
machine, not machines: no state, no entry and no story of their own. The roles it moves between
(:class:`Role`) are named with its stimuli and actions.

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

from hogwild_plugins.ps.failover import BucketRecord
from hogwild_plugins.ps.replication.bucket_role_events import (
    CampaignAnswered,
    CopyUnreachable,
    Fenced,
    HandOverAnswered,
    InSyncWritten,
    MapRead,
    RecordRefreshed,
    Remembered,
    Restored,
    Role,
    RoleStimulus,
    SnapshotDelivered,
    StepDown,
    StopLifted,
    Stopped,
)
from hogwild_plugins.ps.replication.bucket_role_hand_over import HandingOver
from hogwild_plugins.ps.replication.bucket_role_in_sync import KeepingInSync
from hogwild_plugins.ps.replication.bucket_role_map_read import Campaigning
from hogwild_plugins.ps.replication.known_history import KnownHistory
from hogwild_plugins.ps.replication.reads_gate import ReadsGate

__all__ = ["BucketRole", "Role"]

STORY_LENGTH = 1024  # transitions a role remembers (:meth:`BucketRole.story`)


@dataclass
class BucketRole(Campaigning, KeepingInSync, HandingOver):
    """One server's view of, and part in, one bucket: one machine, whose transitions on a map
    read and a campaign's answer (:class:`Campaigning`), on a primary's copies
    (:class:`KeepingInSync`) and on a hand-over (:class:`HandingOver`) are parts of their own.

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

    # -- what ends or suspends a primaryship, and a copy's state ---------------------------------

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
