"""The replicated parameter server's state machines (Adam 3.3.3): lease, bucket role, a copy's gate.

No I/O here (after dask's worker state machine): a :class:`BucketRole` changes only through its
one entry, :meth:`BucketRole.handle`, which takes a stimulus (:class:`MapRead`,
:class:`CampaignAnswered`, :class:`InSyncWritten`, :class:`HandOverAnswered`,
:class:`SnapshotDelivered`, :class:`CopyUnreachable`, :class:`Fenced`, :class:`Restored`,
:class:`StepDown`, :class:`RecordRefreshed`; each names itself with a ``stimulus_id``), records
the transition in its :meth:`~BucketRole.story` and returns what to do (:class:`Campaign`,
:class:`WriteInSync`, :class:`Sync`, :class:`CommitPrepared`, :class:`HandOver`) for
:mod:`~hogwild_plugins.ps.replication` to carry out against etcd and the other servers; what
comes back is the next stimulus. :meth:`~BucketRole.validate_state` checks its invariants.

The protocol, for one bucket ``b`` with ``copies`` copies:

* Every server holds a session lease in etcd and registers ``members/<i>`` under it; its
  heartbeat renews the lease. A server whose heartbeat stops (killed, paused, cut off) drops out
  of the members when the lease lapses.
* ``sync/<b>`` (no lease: it outlives every server) is the bucket's record: ``epoch``, the
  ``primary`` and its ``lease``, and ``in_sync``, the copies holding every acknowledged update.
  Only the primary changes it (to add a copy that caught up, or drop one that stopped answering),
  by a transaction that compares the revision it last wrote: a primary that was replaced cannot.
* A primary applies an update, sends it to every other in-sync copy (``PREPARE``: each checks that
  the message carries the current epoch and lease, and that its version is the next one), then
  commits it on each (``COMMIT``), and only then acknowledges the client. A copy that does not
  answer, or reports a gap, is dropped from ``in_sync`` (the primary waits for that write to
  etcd before it acknowledges) and caught up later from a snapshot.
* When the primary is no longer a member, each live in-sync copy campaigns: a transaction that
  replaces ``sync/<b>`` only if it is still the revision the candidate read (the previous primary's
  lease is in it), with ``epoch + 1``, itself as primary and the other live in-sync copies kept in
  ``in_sync`` (each holds every acknowledged update, so one of them can still succeed the winner
  if it dies before it serves). One candidate wins; the others see the new record and follow. The
  winner commits what it had prepared (it may be committed elsewhere; the client's re-send is then
  answered as a duplicate), sends every in-sync and every other desired live copy a snapshot,
  adds the new ones to ``in_sync`` and only then serves: every acknowledged update lives on
  every live in-sync copy.
* A server the record names as primary that is not serving it (a heartbeat late past its own
  clock's margin, a lease lost and taken anew, a campaign whose answer was lost) campaigns for
  the next epoch itself, if it still holds the bucket's state; a new process in its place does
  not, and the bucket waits for a copy that holds its acknowledged updates.
* A primary that loses its lease (its own clock says so: a SIGSTOP-ed process wakes up past it),
  sees a newer epoch, or gets ``FENCED`` from a copy, steps down at once and serves nothing of
  that bucket. Its late ``PREPARE`` s carry an old epoch and are refused: no split brain. Once
  a newer primary's record leaves it out of ``in_sync``, its memory counts as diverged (it may
  hold updates it applied and nobody acknowledged), unless that primary's snapshot replaced it
  already: the snapshot can arrive before the write that adds the copy to ``in_sync``.
* Hand-back: a serving primary that is not the bucket's preferred primary (the first of
  :func:`desired_copies` over the live members), while the preferred one is live, in ``in_sync``
  and caught up this epoch under its present lease, hands the bucket over (:class:`HandOver`). It
  stops serving first (clients get ``NOT_PRIMARY`` and re-send, with their numbers, to the map's
  primary); everything it acknowledged is already committed on every in-sync copy, the successor
  among them. It then replaces ``sync/<b>`` by the same compare-and-swap with ``epoch + 1``, the
  successor as primary under the successor's lease and ``in_sync`` kept, and follows. The
  successor, named primary and not serving, takes the bucket by the rule above (the next epoch
  again; it holds the bucket's state) and serves once its copies have their snapshots. A
  hand-over that loses its transaction deposes the old primary (the next read decides); a
  successor that dies before it serves is replaced like any dead primary. For a fixed membership
  the preferred primary is fixed and never hands over: no ping-pong.

Which servers should hold a bucket (:func:`desired_copies`) is rendezvous hashing over the live
members, so a server's death or return moves only the buckets it holds or should hold, and the
hand-back brings a returning server's primaries back to it: every server is the preferred
primary of about ``1 / n`` of the buckets.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

__all__ = [
    "BucketRecord",
    "BucketRole",
    "Campaign",
    "CampaignAnswered",
    "CommitPrepared",
    "CopyUnreachable",
    "Fenced",
    "Gate",
    "HandOver",
    "HandOverAnswered",
    "InSyncWritten",
    "LeaseClock",
    "MapRead",
    "RecordRefreshed",
    "Restored",
    "Role",
    "RoleStimulus",
    "SnapshotDelivered",
    "StepDown",
    "Sync",
    "WriteInSync",
    "desired_copies",
]


def desired_copies(bucket: int, members: Iterable[int], copies: int) -> list[int]:
    """The ``copies`` live servers that should hold ``bucket``, best first (rendezvous hashing)."""

    def weight(server: int) -> bytes:
        return hashlib.blake2b(f"{bucket}/{server}".encode(), digest_size=8).digest()

    return sorted(members, key=weight, reverse=True)[:copies]


@dataclass(frozen=True)
class BucketRecord:
    """``sync/<b>`` in etcd, read back: who is primary, under which lease and epoch, and which
    copies hold every acknowledged update. ``revision`` is the key's mod revision (0: absent)."""

    epoch: int
    primary: int
    lease: int
    in_sync: tuple[int, ...]
    revision: int = 0

    def value(self) -> dict:
        return {
            "epoch": self.epoch,
            "primary": self.primary,
            "lease": self.lease,
            "in_sync": list(self.in_sync),
        }

    @classmethod
    def parse(cls, value: object, revision: int, n_servers: int, where: str) -> BucketRecord:
        """Check every field of a value read from etcd.

        Raises:
            ValueError: A missing field, or one of the wrong type or range (naming ``where``).
        """

        def integer(key: str, lo: int, hi: int) -> int:
            v = value.get(key) if isinstance(value, dict) else None
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v < hi:
                raise ValueError(f"{where}: {key!r} must be an integer in [{lo}, {hi})")
            return v

        epoch = integer("epoch", 1, 2**32)  # it travels in a 32-bit header field
        primary = integer("primary", 0, n_servers)
        lease = integer("lease", 0, 2**63)
        in_sync = value.get("in_sync")
        if (
            not isinstance(in_sync, list)
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in in_sync)
            or not all(0 <= s < n_servers for s in in_sync)
            or len(set(in_sync)) != len(in_sync)
            or primary not in in_sync
        ):
            raise ValueError(
                f"{where}: 'in_sync' must list distinct servers, the primary among them"
            )
        return cls(epoch, primary, lease, tuple(in_sync), revision)


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class Campaign:
    """Replace ``sync/<bucket>`` by ``record`` if its revision is still ``expected`` (0: absent)."""

    bucket: int
    record: BucketRecord
    expected: int


@dataclass(frozen=True)
class WriteInSync:
    """As primary, write ``record`` (a new ``in_sync``) if ``sync/<bucket>`` is still at
    ``expected``."""

    bucket: int
    record: BucketRecord
    expected: int


@dataclass(frozen=True)
class Sync:
    """Send ``server`` a snapshot of every shard of ``bucket``; report :meth:`BucketRole.synced`
    or :meth:`BucketRole.unreachable`."""

    bucket: int
    server: int


@dataclass(frozen=True)
class HandOver:
    """As primary (no longer serving), hand ``bucket`` to its preferred copy: write ``record``
    (the next epoch, the successor as primary under its lease) if ``sync/<bucket>`` is still at
    ``expected``; report :meth:`BucketRole.handed`."""

    bucket: int
    record: BucketRecord
    expected: int


@dataclass(frozen=True)
class CommitPrepared:
    """Just won ``bucket``: commit what was prepared under the previous primary, in order."""

    bucket: int


# --------------------------------------------------------------------------- lease


class LeaseClock:
    """A server's session lease, by its own clock.

    The lease is taken as valid for ``ttl * (1 - margin)`` after the heartbeat that renewed it was
    *sent*: etcd counts from when it received it, later, so this side always gives up first. A
    process paused past that (SIGSTOP) finds, on waking, that its lease is no longer valid before
    it writes anything, whatever etcd did meanwhile.
    """

    def __init__(self, margin: float = 0.25) -> None:
        self.margin = margin
        self.lease = 0
        self.ttl_s = 0.0
        self.valid_until = float("-inf")
        self.lost = False

    def granted(self, lease: int, ttl_s: float, sent_at: float) -> None:
        self.lease, self.ttl_s, self.lost = lease, float(ttl_s), False
        self.valid_until = sent_at + self.ttl_s * (1 - self.margin)

    def renewed(self, remaining_s: float, sent_at: float) -> bool:
        """A heartbeat sent at ``sent_at`` came back with ``remaining_s`` (<= 0: expired).
        False once the lease is lost (it stays lost: a new one must be granted)."""
        if self.lost:
            return False
        if remaining_s <= 0:
            self.lost = True
            self.valid_until = float("-inf")
            return False
        self.valid_until = max(self.valid_until, sent_at + remaining_s * (1 - self.margin))
        return True

    def valid(self, now: float) -> bool:
        return not self.lost and now < self.valid_until

    def renew_due(self, now: float, last_sent: float) -> bool:
        return now - last_sent >= self.ttl_s / 5


# --------------------------------------------------------------------------- stimuli


@dataclass(frozen=True, kw_only=True)
class RoleStimulus:
    """Something that happened to a bucket's role; ``stimulus_id`` names it in the story."""

    stimulus_id: str


@dataclass(frozen=True)
class MapRead(RoleStimulus):
    """The map as etcd has it now: the bucket's ``record``, the live ``members`` and their
    leases; this server's ``lease`` and whether it is ``lease_valid`` by its own clock.
    ``settled``: every server has registered, or long enough has passed since the start (only
    then is a bucket's very first primary chosen, so that the first primaries are spread over
    every server rather than taken by the first one up)."""

    record: BucketRecord | None
    members: Mapping[int, int]
    lease: int
    lease_valid: bool
    settled: bool = True


@dataclass(frozen=True)
class CampaignAnswered(RoleStimulus):
    """A :class:`Campaign`'s transaction came back: ``record`` is what ``sync/<b>`` holds now."""

    won: bool
    record: BucketRecord | None


@dataclass(frozen=True)
class InSyncWritten(RoleStimulus):
    """A :class:`WriteInSync` came back; ``record`` is what etcd holds now (None: not known)."""

    ok: bool
    record: BucketRecord | None


@dataclass(frozen=True)
class HandOverAnswered(RoleStimulus):
    """A :class:`HandOver` came back; ``record`` is what ``sync/<b>`` holds now (None: not
    known)."""

    ok: bool
    record: BucketRecord | None


@dataclass(frozen=True)
class SnapshotDelivered(RoleStimulus):
    """A :class:`Sync`'s snapshot reached ``server`` (every shard of the bucket)."""

    server: int


@dataclass(frozen=True)
class CopyUnreachable(RoleStimulus):
    """``server`` did not answer a prepare, commit or snapshot, or reported a gap."""

    server: int


@dataclass(frozen=True)
class Fenced(RoleStimulus):
    """A copy refused this primary's message as coming from an old epoch."""


@dataclass(frozen=True)
class Restored(RoleStimulus):
    """A snapshot of the bucket arrived here from its primary of ``epoch`` and was applied."""

    epoch: int


@dataclass(frozen=True)
class StepDown(RoleStimulus):
    """Serve nothing of the bucket from now on; ``record``: what etcd holds, if known."""

    record: BucketRecord | None


@dataclass(frozen=True)
class RecordRefreshed(RoleStimulus):
    """The copy side read ``record`` again (a message of a newer epoch than it knew arrived)."""

    record: BucketRecord


STORY_LENGTH = 1024  # transitions a role remembers (:meth:`BucketRole.story`)


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
    """

    bucket: int
    me: int
    copies: int
    role: Role = Role.FOLLOWER
    record: BucketRecord | None = None
    members: Mapping[int, int] = field(default_factory=dict)  # live server -> its lease
    current: bool = False  # holds the bucket's acknowledged state (a snapshot, or first primary)
    # the newest epoch whose primary's snapshot made this copy current (a bucket of several
    # shards: each shard's; current counts for campaigns only with this copy in in_sync, where
    # a primary puts it once every shard's snapshot arrived)
    restored_epoch: int = 0
    copy_leases: dict[int, int] = field(default_factory=dict)  # as primary: copy -> lease synced
    confirmed: set[int] = field(default_factory=set)  # as primary: copies caught up this epoch
    syncing: set[int] = field(default_factory=set)  # as primary: snapshots under way
    writing: bool = False  # as primary: a WriteInSync under way
    behind: set[int] = field(default_factory=set)  # as primary: caught up, to add to in_sync
    dropping: set[int] = field(default_factory=set)  # as primary: to remove from in_sync
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
                )
            case CampaignAnswered():
                actions = self._campaigned(stimulus.won, stimulus.record)
            case InSyncWritten():
                actions = self._written(stimulus.ok, stimulus.record)
            case HandOverAnswered():
                actions = self._handed(stimulus.ok, stimulus.record)
            case SnapshotDelivered():
                actions = self._synced(stimulus.server)
            case CopyUnreachable():
                actions = self._unreachable(stimulus.server)
            case Fenced():
                actions = self._fenced()
            case Restored():
                self._restored(stimulus.epoch)
                actions = []
            case StepDown():
                actions = self._step_down(stimulus.record)
            case RecordRefreshed():
                self._refreshed(stimulus.record)
                actions = []
            case _:
                raise TypeError(f"bucket role: not a stimulus: {stimulus!r}")
        self.transitions.append(
            (stimulus.stimulus_id, type(stimulus).__name__, before, self.role, tuple(actions))
        )
        return actions

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
            if not ok:
                raise AssertionError(
                    f"bucket {self.bucket} on {self.me}: {what}; {self.story()[-5:]}"
                )

        primary = self.role is Role.PRIMARY
        check(isinstance(self.role, Role), f"role {self.role!r}")
        check(not self.serving or primary, "serving, not as primary")
        check(
            primary or not (self.syncing or self.behind or self.dropping or self.writing),
            f"{self.role.value} with primary's work open",
        )
        if primary:
            check(self.record is not None and self.record.primary == self.me, "primary, not named")
            check(self.me in self.record.in_sync, "primary, not in in_sync")
            check(self.me not in self.syncing | self.dropping, "primary syncing or dropping itself")
        if self.role in (Role.PRIMARY, Role.CANDIDATE, Role.HANDING):
            check(self.current, f"{self.role.value} without the bucket's state")

    @property
    def serving(self) -> bool:
        """As primary, with every live in-sync copy caught up in this epoch: takes client
        requests (an acknowledged update is then on every copy a successor may come from)."""
        if self.role is not Role.PRIMARY or self.syncing or self.writing:
            return False
        return all(s in self.confirmed for s in self.record.in_sync if s in self.members)

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
    ) -> list:
        """The map as etcd has it now (the record, the live members and their leases); this
        server's lease.
        ``settled``: every server has registered, or long enough has passed since the start
        (only then is a bucket's very first primary chosen, so that the first primaries are
        spread over every server rather than taken by the first one up)."""
        self.members = members
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
            return self._reconcile() or self._hand_back()
        self.record = record
        if self.role is Role.DEPOSED and (record is None or record.primary != self.me):
            self.role = Role.FOLLOWER
            if (
                record is not None
                and self.me not in record.in_sync
                and record.epoch > self.restored_epoch
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
            if not settled or self.role is not Role.FOLLOWER:
                return []
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
            return self._take(record, members, lease) if self.current else []
        alive = members.get(record.primary) == record.lease  # a restarted one has a new lease
        if not alive and self.current and self.me in record.in_sync:
            return self._take(record, members, lease)
        return []

    def _take(self, record: BucketRecord, members: Mapping[int, int], lease: int) -> list:
        """Campaign for the bucket under the next epoch. The other live in-sync copies stay in
        ``in_sync``: they hold every acknowledged update, so one of them may still succeed this
        side if it dies before it serves; it serves only once each has its snapshot."""
        others = tuple(s for s in record.in_sync if s != self.me and s in members)
        return self._campaign(
            BucketRecord(record.epoch + 1, self.me, lease, (self.me, *others)), record.revision
        )

    def _campaign(self, record: BucketRecord, expected: int) -> list:
        self.role = Role.CANDIDATE
        return [Campaign(self.bucket, record, expected)]

    def _campaigned(self, won: bool, record: BucketRecord | None) -> list:
        """The campaign's transaction came back: ``record`` is what ``sync/<b>`` holds now."""
        if self.role is not Role.CANDIDATE:
            return []
        if not won:
            self.role, self.record = Role.FOLLOWER, record or self.record
            return []
        self.role, self.record, self.current = Role.PRIMARY, record, True
        self.copy_leases = {s: self.members[s] for s in record.in_sync if s in self.members}
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
        if gone:
            self.dropping |= gone
            self.confirmed -= gone  # caught up again (under its new lease) once it answers
            return [] if self.writing else self._write(self._next_in_sync())
        todo = ((wanted | in_sync) - self.confirmed - self.syncing) & set(self.members)
        self.syncing |= todo
        return [Sync(self.bucket, s) for s in sorted(todo)]

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

    def _hand_back(self) -> list:
        successor = self.successor()
        if successor is None:
            return []
        self.role = Role.HANDING  # serves nothing from now on: no acknowledgement after this
        record = self.record
        in_sync = (successor, *(s for s in record.in_sync if s != successor))
        new = BucketRecord(record.epoch + 1, successor, self.members[successor], in_sync)
        return [HandOver(self.bucket, new, record.revision)]

    def _handed(self, ok: bool, record: BucketRecord | None) -> list:
        """A :class:`HandOver` came back; ``record`` is what ``sync/<b>`` holds now (None: not
        known). Won: a follower (still current: it holds every acknowledged update, and stays in
        ``in_sync``). Lost or not known: deposed, and the next read of the map decides (a record
        that still names this server is taken back under the next epoch)."""
        if self.role is not Role.HANDING:
            return []
        self.role = Role.FOLLOWER if ok and record is not None else Role.DEPOSED
        self.syncing, self.behind, self.dropping, self.writing = set(), set(), set(), False
        if record is not None and (self.record is None or record.revision >= self.record.revision):
            self.record = record
        return []

    def _next_in_sync(self) -> tuple[int, ...]:
        kept = [s for s in self.record.in_sync if s not in self.dropping]
        return tuple(kept + sorted(self.behind - self.dropping - set(kept)))

    def _write(self, in_sync: tuple[int, ...]) -> list:
        self.writing = True
        new = BucketRecord(self.record.epoch, self.me, self.record.lease, in_sync)
        return [WriteInSync(self.bucket, new, self.record.revision)]

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
        self.current = True
        self.restored_epoch = max(self.restored_epoch, epoch)

    def _refreshed(self, record: BucketRecord) -> None:
        """A primary's record changes through its own reads only (it may be deposed)."""
        if self.role is not Role.PRIMARY and (
            self.record is None or record.revision > self.record.revision
        ):
            self.record = record

    def _step_down(self, record: BucketRecord | None) -> list:
        if self.role is Role.PRIMARY:
            self.role = Role.DEPOSED  # its memory stays current until a newer primary shows
        self.syncing, self.behind, self.dropping, self.writing = set(), set(), set(), False
        if record is not None:
            self.record = record
        return []


# --------------------------------------------------------------------------- a copy's checks


class Gate(Enum):
    ACCEPT = "accept"
    FENCED = "fenced"  # an older epoch (or lease) than the bucket's: refuse, the sender steps down
    REFRESH = "refresh"  # a newer epoch than this side knows: read the map again, then decide


def gate(role: BucketRole, epoch: int, lease: int, sender: int) -> Gate:
    """May a message from ``sender`` carrying ``epoch`` and ``lease`` change this copy?"""
    record = role.record
    if record is None or epoch > record.epoch:
        return Gate.REFRESH
    if epoch < record.epoch or lease != record.lease or sender != record.primary:
        return Gate.FENCED
    if role.role is Role.PRIMARY and sender != role.me:
        return Gate.FENCED
    if role.role is Role.CANDIDATE:
        return Gate.REFRESH  # campaigning: the sender retries once the map settles
    return Gate.ACCEPT
