"""The versions a host's take of the servers' model pulled, handed to the partitions on the host.

A take (:mod:`hogwild.partition.host_rows`) rewrites the host's partitions' rows' ``base``, so
each partition's next pushes must be stamped with the shard versions the take pulled. The host
writes them into the arena's ``versions`` region and then advances a control word; a partition
(:mod:`hogwild.partition.process`) reads the word before it counts each example and, when it
moved, takes a copy of the versions for its exchanger to adopt. The word is advanced after the
versions are written (an atomic add: a full barrier), and a take comes only while every partition
is idle, so a partition that sees the word moved reads the whole take's versions.
"""

from __future__ import annotations

import numpy as np


class Takes:
    """The versions of a host's last take of the servers' model, in its arena, and how many
    takes there were (a control word).

    Args:
        arena: The host's arena; without a ``versions`` region (a home without versions) a
            take publishes nothing and :meth:`since` is always None.
        word: The index of the control word that counts the takes
            (:data:`hogwild.partition.process.TAKEN`).
    """

    def __init__(self, arena, word: int) -> None:
        self.control, self.word = arena.array("control"), word
        try:
            self.versions: np.ndarray | None = arena.array("versions")
        except KeyError:
            self.versions = None
        self.seen = 0  # the takes this side has adopted

    def publish(self, versions: np.ndarray | None) -> None:
        """The host's side, after a take pulled at ``versions`` (None: a home without them).

        Raises:
            ValueError: More versions than the region holds.
        """
        from hogwild.shm.atomics import atomic_add

        if versions is None or self.versions is None:
            return
        if len(versions) > len(self.versions):
            raise ValueError(f"a take's {len(versions)} versions exceed the arena's "
                             f"{len(self.versions)} (the store's version_words)")  # fmt: skip
        self.versions[: len(versions)] = versions
        atomic_add(self.control, self.word, 1)  # after the versions: a reader sees them whole

    def since(self) -> np.ndarray | None:
        """A partition's side: the last take's versions (a copy) if the host took since the
        last call, else None."""
        from hogwild.shm.atomics import atomic_load

        if self.versions is None:
            return None
        taken = atomic_load(self.control, self.word)
        if taken == self.seen:
            return None
        self.seen = taken
        return self.versions.copy()
