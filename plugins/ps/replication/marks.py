"""What a replicated server's store remembers of the bucket records it saw: each bucket's epoch.

etcd's map is the only record of who holds a bucket's acknowledged updates; if etcd loses it (an
external etcd that comes back empty, a backup restored, a second driver clearing the job's keys),
a process that has never seen a record of the bucket would take a missing record for a new bucket
and start it afresh, at epoch 1, with empty memory. A process that saw one remembers it in memory
(:class:`~hogwild_plugins.ps.replication.bucket_role.BucketRole`'s ``known_epoch``); a
:class:`BucketMarks` makes that memory durable on a server with a store (``--store DIR``): the
newest epoch of every bucket's record the server read (with that record's primary and lease: one
epoch has one of each) is written to its LMDB store
(:meth:`~hogwild_plugins.ps.storage.ShardStore.mark`, one synced transaction) *before* the
record is handed to the bucket's role, so that nothing the server does on a record (campaign,
serve, accept a primary's prepares) comes before the mark is on disk. A process started later on
the same store hands each mark to its role (``Remembered``): a missing record, one of a lower
epoch, or one of the marked epoch naming another primary or lease, is etcd's lost state to it,
never a new bucket, and its ``members/<i>`` lists the bucket in ``seen``, so that servers
without the mark hold back too while it is registered. Only the history the role follows is
marked: a record its role finds foreign (``BucketRole.foreign``) never is.

Without a store the marks live as long as the process (the role's memory): a process started
after etcd lost its keys learns that a bucket had a record only from the registered members.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Protocol

from hogwild_plugins.ps.failover import BucketRecord

__all__ = ["BucketMarks", "followed", "MarkStore"]


class MarkStore(Protocol):
    """Where marks last: the server's :class:`~hogwild_plugins.ps.storage.ShardStore` (the
    simulator has its own, surviving a server's kill)."""

    def marks(
        self, n_buckets: int, n_servers: int | None = None
    ) -> dict[int, tuple[int, int, int]]:
        """``{bucket: (epoch, primary, lease)}`` as written."""

    def mark(self, marks: dict[int, tuple[int, int, int]]) -> None:
        """Write ``{bucket: (epoch, primary, lease)}`` durably, all or nothing, before
        returning."""


def followed(records: Mapping[int, BucketRecord | None], roles: Mapping) -> dict:
    """Of ``records`` (by bucket; None: missing), those of the history each bucket's role
    follows (``BucketRole.foreign`` is false): the only ones marked. Read under the lock that
    guards the roles; the marks are written after it."""
    return {b: r for b, r in records.items() if r is not None and not roles[b].foreign(r)}


class BucketMarks:
    """One server's marks (see the module docstring).

    Args:
        store: Where they last; None: a server without a store (they live with the process).
        n_buckets: The job's buckets (a mark of another is a corrupt store).
        n_servers: The job's servers (a mark naming another as primary is a corrupt store).

    Raises:
        StoreError: The store's marks are corrupt, of an unknown format, of a bucket the job
            does not have, or naming a primary that is none of its servers.
    """

    def __init__(
        self, store: MarkStore | None, n_buckets: int, n_servers: int | None = None
    ) -> None:
        self.store = store
        # bucket -> (epoch, primary, lease) of the newest record seen
        self.marked: dict[int, tuple[int, int, int]] = (
            store.marks(n_buckets, n_servers) if store is not None else {}
        )
        self.remembered = dict(self.marked)  # what the store held when this process started
        self.writes = 0  # transactions written
        self._lock = threading.Lock()  # the replication thread and the record refresher

    def __getstate__(self) -> dict:
        """The simulator copies a server's state (a lock is not copied: a new one is made)."""
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def saw(self, records: Mapping[int, BucketRecord]) -> None:
        """These buckets' records were read: those of a newer epoch than marked are written to
        the store (one transaction) before this returns; an older epoch changes nothing.

        Raises:
            StoreError: The store could not write them (the caller takes no part in the
                bucket's record until it can: handled as an etcd call that failed).
        """
        with self._lock:
            newer = {
                b: (r.epoch, r.primary, r.lease)
                for b, r in records.items()
                if r.epoch > self.marked.get(b, (0,))[0]
            }
            if not newer:
                return
            if self.store is not None:
                self.store.mark(newer)
                self.writes += 1
            self.marked.update(newer)
