"""A bucket primary's copies: catching them up and keeping ``in_sync`` true.

Part of the one machine :class:`~hogwild_plugins.ps.replication.bucket_role.BucketRole` (a mixin
of its transitions, no state and no entry of its own: the machine's :meth:`handle
<hogwild_plugins.ps.replication.bucket_role.BucketRole.handle>` calls it; and one query,
:meth:`KeepingInSync.confirmed_copies`, which the server's STATUS reads). As primary the role
sends a :class:`Sync` (a snapshot) to every live copy that should hold the bucket and is not
caught up in this epoch under its present lease, adds a caught-up copy to the record's
``in_sync`` and writes out one that is gone or did not answer (:class:`WriteInSync`, one write
under way at a time; changes asked for meanwhile go out next), never leaving fewer than
``min_copies`` in it (a copy kept, not caught up, blocks writes until it is).

A snapshot's answer may come late (the real server sends snapshots beside its other work:
:mod:`~hogwild_plugins.ps.replication.snapshot_sender`): each :class:`Sync` carries a ticket its
answer names, and an answer to a Sync the role no longer waits for (deposed or elected again
since, the copy dropped and asked for again) is no news (:meth:`KeepingInSync.awaits`); one
delivered to a copy that registered under a new lease since is a copy unreachable.

The invariant it keeps (with the machine's :meth:`serving
<hogwild_plugins.ps.replication.bucket_role.BucketRole.serving>`): the primary serves only while
every live in-sync copy is confirmed in this epoch and no Sync or ``in_sync`` write is under
way, so an acknowledged update is on every copy a successor may come from.
"""

from __future__ import annotations

from hogwild_plugins.ps.failover import BucketRecord, desired_copies
from hogwild_plugins.ps.replication.bucket_role_events import Role, Sync, WriteInSync

__all__ = ["KeepingInSync"]


class KeepingInSync:
    """A primary's catch-up of its copies and its ``in_sync`` writes (see the module docstring).

    It reads and writes the machine's primary's work: ``syncing``, ``sync_tickets``,
    ``sync_leases``, ``tickets``, ``first_ticket``, ``confirmed``, ``copy_leases``, ``behind``,
    ``dropping`` and ``writing``, and sets ``record`` once etcd took an ``in_sync`` write; it
    reads ``role``, ``me``, ``bucket``, ``copies``, ``members``, ``min_copies`` and the
    machine's ``history`` and ``epoch``; it calls the machine's ``_step_down`` and
    ``_lose_record``.
    """

    def confirmed_copies(self) -> dict[str, int]:
        """As primary: each copy caught up under the lease it holds now, and that lease (what a
        STATUS tells observers; etcd cannot: a copy kept in ``in_sync`` through a new lease, as
        one whose removal would leave fewer than ``min_copies``, is caught up again without the
        record being written). Else empty. The one query of this mixin read from another thread
        than the replication thread that changes its sets: ``copy()`` of a set or dict is atomic
        under the GIL, iterating them is not."""
        if self.role is not Role.PRIMARY:
            return {}
        confirmed, leases = self.confirmed.copy(), self.copy_leases.copy()
        return {str(c): leases[c] for c in sorted(confirmed) if c != self.me and c in leases}

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
