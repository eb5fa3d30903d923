"""A bucket role's map reads and campaigns: what the map read from etcd makes this side do.

Part of the one machine :class:`~hogwild_plugins.ps.replication.bucket_role.BucketRole` (a mixin
of its transitions, no state and no entry of its own: the machine's :meth:`handle
<hogwild_plugins.ps.replication.bucket_role.BucketRole.handle>` calls it, and it records nothing
itself). A :class:`~hogwild_plugins.ps.replication.bucket_role_events.MapRead` is judged against
what this side knows of the bucket's history (a record of another history is never followed: the
bucket serves nothing), then, by role:

- a primary whose record and lease are still its own catches its copies up
  (:mod:`~hogwild_plugins.ps.replication.bucket_role_in_sync`) or, caught up, hands the bucket to
  its preferred copy (:mod:`~hogwild_plugins.ps.replication.bucket_role_hand_over`); else it
  steps down;
- a deposed primary that a newer primary left out of ``in_sync`` is no longer current;
- a live follower campaigns (a :class:`Campaign` under the next epoch) when it is the very first
  primary of a bucket no server has seen a record of, when it is named primary and still holds
  the bucket's state, or when the primary is dead and this side is a current in-sync copy. How
  long a won takeover waits before it answers reads is decided when campaigning
  (:func:`~hogwild_plugins.ps.replication.reads_gate.takeover_wait`).

The invariant it keeps: only a current side (one holding every acknowledged update) campaigns,
and a won campaign starts the primaryship with every copy unconfirmed but this one, so nothing
is served until the live in-sync copies are caught up in the new epoch.
"""

from __future__ import annotations

from collections.abc import Mapping

from hogwild_plugins.ps.failover import BucketRecord, desired_copies
from hogwild_plugins.ps.replication.bucket_role_events import Campaign, CommitPrepared, Role
from hogwild_plugins.ps.replication.reads_gate import takeover_wait

__all__ = ["AWAY", "Campaigning"]

AWAY = 0  # as a copy's lease in ``copy_leases``: away when the primary won (etcd grants none 0)


class Campaigning:
    """The map reads and campaigns of a :class:`BucketRole` (see the module docstring).

    Against the machine's settings (``bucket``, ``me``, ``copies``, ``min_copies``, ``empty``,
    ``lease_ttl``) it reads and writes its ``role``, ``record``, ``members``, ``current``,
    ``restored_epoch``, ``campaign``, ``won_epoch``, ``reads``, ``history`` and, on winning, the
    primary's work (``copy_leases``, ``confirmed``, ``first_ticket``...); it calls the machine's
    ``_step_down``, ``_lose_record``, ``_lost`` and ``foreign``, and its other parts'
    ``_reconcile`` and ``_hand_back``.
    """

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
