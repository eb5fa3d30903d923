"""A host's takes handed to its partitions (hogwild/partition/takes.py): the control word is a
seqlock, so a partition never adopts a take's versions while the host is writing them (the
word odd); and a take's versions published into an arena sized without a ``versions`` region
are a wiring error, said, not dropped."""

from __future__ import annotations

import numpy as np
import pytest

from hogwild.partition.process import CONTROL_WORDS, TAKEN
from hogwild.partition.takes import Takes
from hogwild.shm.arena import Arena, ArenaLayout
from hogwild.shm.atomics import atomic_add


def _arena(versions: int) -> Arena:
    layout = ArenaLayout()
    if versions:
        layout.add("versions", np.uint64, versions)
    layout.add("control", np.int64, CONTROL_WORDS)
    return Arena.create("takes test", layout)


def test_a_partition_adopts_only_a_whole_take():
    with _arena(4) as arena:
        host, partition = Takes(arena, TAKEN), Takes(arena, TAKEN)
        assert partition.since() is None  # no take yet
        host.publish(np.array([3, 4, 5], np.uint64))
        np.testing.assert_array_equal(partition.since()[:3], [3, 4, 5])
        assert partition.since() is None  # seen once
        control = arena.array("control")
        atomic_add(control, TAKEN, 1)  # a take being written: the word is odd
        arena.array("versions")[:3] = [9, 9, 0]  # half of it
        assert partition.since() is None
        arena.array("versions")[:3] = [9, 9, 9]
        atomic_add(control, TAKEN, 1)  # whole
        np.testing.assert_array_equal(partition.since()[:3], [9, 9, 9])
        host.publish(np.array([7, 7], np.uint64))
        host.publish(np.array([8, 8], np.uint64))  # two takes between examples: the last one
        np.testing.assert_array_equal(partition.since()[:2], [8, 8])


def test_versions_published_into_an_arena_without_a_versions_region_are_refused():
    with _arena(0) as arena:
        takes = Takes(arena, TAKEN)
        takes.publish(None)  # a home without versions: nothing to hand on
        assert takes.since() is None
        with pytest.raises(ValueError, match="no versions region.*version_words 0"):
            takes.publish(np.array([1, 2], np.uint64))
    with _arena(2) as arena, pytest.raises(ValueError, match="3 versions exceed the arena's 2"):
        Takes(arena, TAKEN).publish(np.array([1, 2, 3], np.uint64))
