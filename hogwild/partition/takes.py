"""The versions a host's take of the servers' model pulled, handed to the partitions on the host.

A take (:mod:`hogwild.partition.host_rows`) rewrites the host's partitions' rows' ``base``, so
each partition's next pushes must be stamped with the shard versions the take pulled. The host
writes them into the arena's ``versions`` region under a control word used as a seqlock: it
advances the word to odd before writing and to even after (each an atomic add: a full barrier).
A partition (:mod:`hogwild.partition.process`) reads the word before it counts each example and,
when it moved to a new even value, copies the versions and reads the word again; it keeps the copy
only if the word did not move meanwhile, and otherwise tries again at its next example. A
partition thus never adopts a take's versions half-written.

The seqlock guards the versions only, not the rows the take rewrites: the host writes ``params``
and ``base`` before it publishes, so a partition that counted an example between the two, or
while the word is odd, would push against the new ``base`` stamped with the old versions. The
stamps are right only because a take comes while every partition on the host is idle and
flushed (:meth:`hogwild.partition.host_rows.HostRows.take`), as every take does today.
"""

from __future__ import annotations

import numpy as np


class Takes:
    """The versions of a host's last take of the servers' model, in its arena, and how many
    takes there were (a control word).

    Args:
        arena: The host's arena; without a ``versions`` region (a store whose ``version_words``
            is 0) :meth:`since` is always None, and publishing versions into it is an error.
        word: The index of the control word that counts the takes, twice each: odd while one is
            being written (:data:`hogwild.partition.process.TAKEN`).
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
            ValueError: Versions but no ``versions`` region in the arena (a wiring error: the
                arena was sized with 0 version words for a store that has versions), or more
                versions than the region holds.
        """
        from hogwild.shm.atomics import atomic_add

        if versions is None:
            return
        if self.versions is None:
            raise ValueError(f"a take pulled {len(versions)} versions but the arena has no "
                             "versions region: it was sized with version_words 0 for a store "
                             "that has versions")  # fmt: skip
        if len(versions) > len(self.versions):
            raise ValueError(f"a take's {len(versions)} versions exceed the arena's "
                             f"{len(self.versions)} (the store's version_words)")  # fmt: skip
        atomic_add(self.control, self.word, 1)  # odd: a reader copying now will not keep it
        self.versions[: len(versions)] = versions
        atomic_add(self.control, self.word, 1)  # even: the take's versions are whole

    def since(self) -> np.ndarray | None:
        """A partition's side: the last take's versions (a copy) if the host took since the
        last call, else None (also while a take is being written or moved during the copy: the
        next call sees it whole)."""
        from hogwild.shm.atomics import atomic_add, atomic_load

        if self.versions is None:
            return None
        taken = atomic_load(self.control, self.word)
        if taken == self.seen or taken % 2:  # no new take, or one being written
            return None
        versions = self.versions.copy()
        # Read again with a read-modify-write (adding 0): a full barrier, so the copy's plain
        # loads cannot drift past it (an acquire load would not hold them back on ARM).
        if atomic_add(self.control, self.word, 0) != taken:  # a take began during the copy
            return None
        self.seen = taken
        return versions
