"""A simulated server's store, as the replication uses it: the marks, which outlive the process.

The real server's LMDB store keeps, besides the shards, the newest epoch of each bucket's record
it read (:mod:`~hogwild_plugins.ps.replication.marks`); :class:`SimStore` keeps only that, in
memory. The :class:`~hogwild_plugins.ps.simulation.world.World` keeps it across a server's kill
and hands it to the restarted process.
"""

from __future__ import annotations

__all__ = ["SimStore"]


class SimStore:
    """A server's store as the replication uses it (its marks: bucket -> the newest epoch of a
    record seen, its primary and lease); it outlives the process, as the LMDB file does."""

    def __init__(self) -> None:
        self.epochs: dict[int, tuple[int, int, int]] = {}

    def marks(
        self, n_buckets: int, n_servers: int | None = None
    ) -> dict[int, tuple[int, int, int]]:
        return dict(self.epochs)

    def mark(self, marks: dict[int, tuple[int, int, int]]) -> None:
        self.epochs.update(marks)
