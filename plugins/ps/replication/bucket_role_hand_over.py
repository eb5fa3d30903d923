"""A bucket primary's hand-over: giving the bucket to a copy under the next epoch.

Part of the one machine :class:`~hogwild_plugins.ps.replication.bucket_role.BucketRole` (a mixin
of its transitions, no state and no entry of its own: the machine's :meth:`handle
<hogwild_plugins.ps.replication.bucket_role.BucketRole.handle>` calls it). Two hand-overs:

- back to the bucket's preferred primary (:meth:`HandingOver.successor`, the first of
  :func:`~hogwild_plugins.ps.failover.desired_copies` over the live members) once a serving
  primary's own reads are open, the record marked ``handed`` so the successor answers reads at
  once (:meth:`HandingOver._hand_back`);
- away from a stopped primary (:class:`Stopped`: its memory is no longer the bucket's state) to
  any live in-sync copy caught up in this epoch (:meth:`HandingOver._any_successor`).

The invariant it keeps: from the moment it asks for a :class:`HandOver` the role is ``HANDING``
and serves nothing (no acknowledgement after it), and the successor named is live, in
``in_sync`` and caught up in this epoch under its present lease. Its answer
(:class:`HandOverAnswered`) makes the role a follower (won) or deposed (lost or not known; the
next map read decides).
"""

from __future__ import annotations

from hogwild_plugins.ps.failover import BucketRecord, desired_copies
from hogwild_plugins.ps.replication.bucket_role_events import HandOver, Role

__all__ = ["HandingOver"]


class HandingOver:
    """A primary's hand-over of its bucket (see the module docstring).

    It reads the machine's ``me``, ``bucket``, ``stopped``, ``record``, ``members``,
    ``copies``, ``confirmed``, ``copy_leases``, ``dropping`` and ``behind``, and sets ``role``,
    ``record``, ``current`` and the primary's work; it calls the machine's ``serving``,
    ``reads_open``, ``history`` and ``_lost``.
    """

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
