"""What one server knows of one bucket's history in etcd, and whether a record belongs to it.

etcd may lose a bucket's state (its keys wiped, restored from an old backup, or cleared by another
driver of the same job) and the bucket may then be started afresh elsewhere. A record of such
another history must never be followed: a server that did would take a fresh bucket for the one
whose acknowledged updates it holds. So each
:class:`~hogwild_plugins.ps.replication.bucket_role.BucketRole` keeps a :class:`KnownHistory`:
the newest epoch it saw a record of (from etcd, or from its store: ``Remembered``), that epoch's
primary and lease (one epoch has one of each: a campaign or a hand-over takes the next epoch),
whether a member said the bucket had started, and whether a loss was seen (never forgotten).
:meth:`KnownHistory.foreign` judges a record against it, and :meth:`KnownHistory.disowns` is
the guard on a record an answer brings. No I/O here: the role changes it only
inside its ``handle``.
"""

from __future__ import annotations

from dataclasses import dataclass

from hogwild_plugins.ps.failover import BucketRecord

__all__ = ["KnownHistory"]


@dataclass
class KnownHistory:
    """One server's knowledge of one bucket's history (see the module docstring)."""

    # the newest epoch of a record this side has seen: a missing record, or an older one, after
    # it means etcd lost the bucket's state: the bucket is never started afresh over it
    epoch: int = 0
    # the primary and lease of that epoch's record: a record of that epoch naming others is
    # another history (etcd lost the bucket and it was started afresh elsewhere), never followed
    holder: tuple[int, int] | None = None
    lost: bool = False  # such a loss was seen: the bucket waits (it serves nothing)
    # the copy side read the record again since the last map read (``RecordRefreshed``): a map
    # read under way meanwhile may be older than that record, which is no loss
    refreshed: bool = False
    # a live member said it had seen a record of this bucket (``blank`` false): the bucket has
    # started, so a missing record is never a new bucket, even after that member's key is gone
    # (a process started after etcd lost its keys learns it from the members still there, or
    # from its store: ``Remembered``)
    started: bool = False

    @property
    def seen(self) -> bool:
        """This side saw a record of the bucket, met a member that had, or its store remembers
        one (``members/<me>`` lists the bucket in ``seen``)."""
        return self.epoch > 0 or self.started

    def know(self, epoch: int, holder: tuple[int, int]) -> None:
        """A record of ``epoch`` held by ``holder`` (its primary and lease) was seen."""
        if epoch > self.epoch or (epoch == self.epoch and self.holder is None):
            self.epoch, self.holder = epoch, holder

    def foreign(self, record: BucketRecord | None) -> bool:
        """Whether ``record`` (None: missing) is not the bucket's history this side knows: a loss
        was seen already, or it is missing, older than the newest epoch seen, or of that epoch
        under another holder (a bucket started afresh elsewhere reaching a higher epoch later
        is foreign too: the loss is never forgotten)."""
        if self.lost:
            return True
        if not self.epoch:
            return False
        if record is None or record.epoch < self.epoch:
            return True
        return (
            record.epoch == self.epoch
            and self.holder is not None
            and (record.primary, record.lease) != self.holder
        )

    def disowns(self, record: BucketRecord | None) -> bool:
        """The one guard on a record an answer brings (a campaign's, a hand-over's, an
        ``in_sync`` write's read back, a newer primary's): whether it is another history's
        (:meth:`foreign`), the loss then marked for good. None (no record read back) is no
        news here: each answer's own rule says what a missing record means."""
        if record is None or not self.foreign(record):
            return False
        self.lost = True
        return True
