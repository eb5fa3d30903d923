"""A replicated server's answers to its clients: which bucket's requests it takes, and why not.

Part of :class:`~hogwild_plugins.ps.replication.adapter.Replication` (a mixin, no state of its
own): the network thread asks it, for each client request, whether this server is the serving
primary of the request's bucket (under the lease its record names, valid by this server's clock:
:meth:`Admitting.serving`), whether a pull may be answered yet (past a takeover's wait for
reads: :meth:`Admitting.answers_reads`), whether a write may be taken (with ``ps.min_copies``
live copies in sync: :meth:`Admitting.writable`), and, when not, the refusal the client gets
(:meth:`Admitting.not_primary`: ``NOT_PRIMARY`` with its reason, or ``READS_WAITING``), counted by
reason. It reads the bucket roles and decides nothing of its own: the roles decided.

It expects of the replication: ``roles`` (each bucket's role), ``layout``, ``clock`` (the lease
clock), ``failure``, ``counters``, ``marks``, ``server`` (its store's file), ``me`` and ``queue``
(the replication thread's, for :meth:`Admitting.submit`).
"""

from __future__ import annotations

import math

from hogwild_plugins.ps.failover import lease_now
from hogwild_plugins.ps.replication.primary_round import Pending
from hogwild_plugins.ps.work import Work

from hogwild.net.wire import ErrorCode, Header, WireError

__all__ = ["Admitting"]


class Admitting:
    """A replicated server's answers to its clients' requests (see the module docstring)."""

    def serving(self, shard: int) -> bool:
        """Whether this server answers ``shard``'s pulls: the bucket's serving primary, under
        the lease its record names, valid by this server's clock (a lease lost and taken anew
        is not the record's: a successor may serve meanwhile)."""
        role = self.roles[self.layout.bucket_of(shard)]
        return (
            role.serving
            and role.record.lease == self.clock.lease
            and self.failure is None
            and self.clock.valid(lease_now())
        )

    def answers_reads(self, shard: int) -> bool:
        """Whether this server answers ``shard``'s pulls and reductions: :meth:`serving`, and
        past its role's wait for reads after a takeover from another server (the revoked
        holder's TTL, its ``lease_s``, from the campaign's answer: ``BucketRole.reads_open``)."""
        role = self.roles[self.layout.bucket_of(shard)]
        return self.serving(shard) and role.reads_open(lease_now())

    def lease_time(self) -> float:
        """Now, by the clock the lease clock (``LeaseClock``) and the heartbeat read
        (:func:`~hogwild_plugins.ps.failover.lease_now`): the time a campaign's answer is
        stamped with, in the units of the wait for reads (``BucketRole.reads_open``, ``lease_s``
        long)."""
        return lease_now()

    def writable(self, shard: int) -> bool:
        """As :meth:`serving`, with ``ps.min_copies`` live copies in sync: takes writes."""
        return self.serving(shard) and self.roles[self.layout.bucket_of(shard)].writable

    def not_primary(self, header: Header, shard: int, read: bool = False) -> WireError:
        """Why this server does not take ``header``'s request of ``shard`` (a pull or a
        reduction when ``read``, else a write), counted by that reason: a write short of
        copies, a read waiting out the predecessor's lease (``READS_WAITING``: the client sends
        it again here after a pause, with no map read), or not the serving primary."""
        self.counters["not_primary"] += 1
        role = self.roles[self.layout.bucket_of(shard)]
        primary = role.record.primary if role.record else None
        if self.serving(shard):  # the primary, under its record's lease, valid by its clock
            if not read and not role.writable:
                self.counters["too_few_copies"] += 1
                return WireError(
                    f"bucket {role.bucket} has {role.holders} live copies in sync, fewer than "
                    f"ps.min_copies = {role.min_copies}: writes are refused until a copy "
                    "catches up (send again)",
                    ErrorCode.NOT_PRIMARY,
                )
            if read:  # not open when answers_reads asked, even if the wait ended since:
                # the same server again, not a map round that would name this server anyway
                self.counters["reads_waiting"] += 1
                left = max(0.0, role.reads_from - lease_now())
                more = (  # a revoked/<i> marker naming no TTL: closed while it lives
                    "until a revoked marker naming no TTL is gone"
                    if math.isinf(left)
                    else f"{left:.2f} s more"
                )
                return WireError(
                    f"bucket {role.bucket} was taken over from another server: its reads wait "
                    f"out that server's lease ({more}; send again)",
                    ErrorCode.READS_WAITING,
                )
        if role.record_lost:
            store = ""
            if role.bucket in self.marks.remembered:
                store = (
                    f"; this server's store ({self.server.store.file}) remembers it: a new job "
                    "needs another --store directory"
                )
            return WireError(
                f"etcd lost the record of bucket {role.bucket} (it saw epoch "
                f"{role.known_epoch}): the bucket serves nothing until the job is restarted"
                f"{store}",
                ErrorCode.NOT_PRIMARY,
            )
        return WireError(
            f"server {self.me} is not the serving primary of bucket {self.layout.bucket_of(shard)}"
            f" (it is {role.role.value}; the map names server {primary}): re-read the map",
            ErrorCode.NOT_PRIMARY,
        )

    def submit(self, header: Header, shard: int, work: Work, frames: list) -> None:
        """A client's update of ``shard`` (checked): for the replication thread."""
        if not self.writable(shard):
            raise self.not_primary(header, shard)
        self.queue.put(Pending(header, shard, work, list(frames)))
