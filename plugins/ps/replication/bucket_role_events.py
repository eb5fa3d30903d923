"""What a bucket role hears and what it asks for: the records its machine and executor share.

A :class:`~hogwild_plugins.ps.replication.bucket_role.BucketRole` takes one stimulus at a time
(a :class:`RoleStimulus`, named by its ``stimulus_id`` in the role's story): the map read from
etcd (:class:`MapRead`), a campaign's, an ``in_sync`` write's or a hand-over's answer
(:class:`CampaignAnswered`, :class:`InSyncWritten`, :class:`HandOverAnswered`), a snapshot that
reached a copy or a copy that did not answer (:class:`SnapshotDelivered`,
:class:`CopyUnreachable`), a copy's fence (:class:`Fenced`), a snapshot restored here
(:class:`Restored`), a step down (:class:`StepDown`), a record read again
(:class:`RecordRefreshed`), a write that failed to apply here and the snapshots that replaced it
(:class:`Stopped`, :class:`StopLifted`), the epoch of a record this server's store remembers
(:class:`Remembered`). It answers with actions for
:mod:`~hogwild_plugins.ps.replication.executor` to carry out against etcd and the other servers
(:class:`Campaign`, :class:`WriteInSync`, :class:`Sync`, :class:`HandOver`,
:class:`CommitPrepared`); what comes of each is the next stimulus. The roles it moves between
(:class:`Role`), which its story records, are named here too, so that the machine's parts
(campaign, in-sync, hand-over) share them. Plain frozen records: no decision is taken here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from hogwild_plugins.ps.failover import BucketRecord

__all__ = [
    "Campaign",
    "CampaignAnswered",
    "CommitPrepared",
    "CopyUnreachable",
    "Fenced",
    "HandOver",
    "HandOverAnswered",
    "InSyncWritten",
    "MapRead",
    "RecordRefreshed",
    "Remembered",
    "Restored",
    "Role",
    "RoleStimulus",
    "SnapshotDelivered",
    "StepDown",
    "StopLifted",
    "Stopped",
    "Sync",
    "WriteInSync",
]


# --------------------------------------------------------------------------- roles


class Role(Enum):
    FOLLOWER = "follower"  # a copy (in sync or catching up) or not holding the bucket
    CANDIDATE = "candidate"  # campaigning
    PRIMARY = "primary"
    DEPOSED = "deposed"  # was primary and is no longer: serves nothing until the map moves on
    HANDING = "handing"  # was primary, handing the bucket to its preferred copy: serves nothing


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
    every server rather than taken by the first one up). ``blank``: no live member lists this
    bucket in its ``seen`` (only then may a missing record mean a new bucket). ``revoked_ttl``:
    the longest lease TTL named by the ``revoked/<i>`` markers of the same read, 0 for none
    (:func:`~hogwild_plugins.ps.failover.revoked_ttl`: a lease ended early lately, whose holder
    may still answer reads by its own clock, for up to its own TTL: a takeover's reads wait
    that long; ``math.inf``: a marker names no TTL, and they wait until a later read holds
    none). ``at``:
    when the map was read, in the clock of :class:`CampaignAnswered`'s ``at`` (None: not told;
    the role then hands a bucket back unmarked, and its successor waits for reads)."""

    record: BucketRecord | None
    members: Mapping[int, int]
    lease: int
    lease_valid: bool
    settled: bool = True
    blank: bool = True  # no live member has seen a record of this bucket
    revoked_ttl: float = 0.0  # the longest TTL of the revoked/<i> markers in the same read
    at: float | None = None  # when it was read (the lease clock's units)


@dataclass(frozen=True)
class CampaignAnswered(RoleStimulus):
    """A :class:`Campaign`'s transaction came back: ``record`` is what ``sync/<b>`` holds now;
    ``at``: when the answer came, by this server's clock (the lease clock's units: seconds of
    ``lease_now()`` on a real server, ticks in the simulator)."""

    won: bool
    record: BucketRecord | None
    at: float = 0.0


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
    """A :class:`Sync`'s snapshot reached ``server`` (every shard of the bucket). ``ticket``: the
    :class:`Sync`'s (a host that sends snapshots beside its other work answers later: an answer
    to a Sync the role no longer waits for is no news); None: answered at once."""

    server: int
    ticket: int | None = None


@dataclass(frozen=True)
class CopyUnreachable(RoleStimulus):
    """``server`` did not answer a prepare, commit or snapshot, or reported a gap. ``ticket``: a
    :class:`Sync`'s answered later, as :class:`SnapshotDelivered`'s; None: answered at once."""

    server: int
    ticket: int | None = None


@dataclass(frozen=True)
class Fenced(RoleStimulus):
    """A copy refused this primary's message as coming from an old epoch. ``ticket``: that of a
    :class:`Sync` answered later, as :class:`SnapshotDelivered`'s; None: answered at once."""

    ticket: int | None = None


@dataclass(frozen=True)
class Restored(RoleStimulus):
    """A snapshot of the bucket arrived here from its primary of ``epoch`` and was applied."""

    epoch: int


@dataclass(frozen=True)
class StepDown(RoleStimulus):
    """Serve nothing of the bucket from now on; ``record``: what etcd holds, if known."""

    record: BucketRecord | None


@dataclass(frozen=True)
class Stopped(RoleStimulus):
    """A write this server acknowledged or committed failed to apply to the bucket here."""


@dataclass(frozen=True)
class StopLifted(RoleStimulus):
    """Snapshots replaced every shard of the bucket that failed a write here: its memory is a
    primary's again (current once that primary's :class:`Restored` says so)."""


@dataclass(frozen=True)
class Remembered(RoleStimulus):
    """This server's store says a process on it saw the bucket's record at ``epoch``, naming
    ``primary`` under ``lease`` (:mod:`~hogwild_plugins.ps.replication.marks`): a missing
    record, an older one, or one of that epoch naming another primary or lease, is etcd's lost
    state, never a new bucket."""

    epoch: int
    primary: int
    lease: int


@dataclass(frozen=True)
class RecordRefreshed(RoleStimulus):
    """The copy side read ``record`` again (a message of a newer epoch than it knew arrived)."""

    record: BucketRecord


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
    """Send ``server`` a snapshot of every shard of ``bucket``; report :class:`SnapshotDelivered`
    or :class:`CopyUnreachable`. ``epoch``: the epoch of the primaryship that decided it (its
    messages carry it); ``ticket``: which Sync of the role's it is (its answer names it: a host
    may answer after the role moved on, dropped the copy, or asked for another Sync of it). Not
    part of what is to be done: two Syncs of one copy are the same action."""

    bucket: int
    server: int
    epoch: int = field(default=0, compare=False)
    ticket: int = field(default=0, compare=False)


@dataclass(frozen=True)
class HandOver:
    """As primary (no longer serving), hand ``bucket`` to its preferred copy: write ``record``
    (the next epoch, the successor as primary under its lease) if ``sync/<bucket>`` is still at
    ``expected``; report :class:`HandOverAnswered`."""

    bucket: int
    record: BucketRecord
    expected: int


@dataclass(frozen=True)
class CommitPrepared:
    """Just won ``bucket``: commit what was prepared under the previous primary, in order."""

    bucket: int
