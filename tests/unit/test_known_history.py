"""What a bucket role knows of its bucket's history in etcd (plugins/ps/replication/
known_history.py), with no role around it: which records are another history's, that a loss is
never forgotten, and that the guard on an answer's record marks the loss while a missing record
is left to the answer's own rule.
"""

from __future__ import annotations

from hogwild_plugins.ps.failover import BucketRecord
from hogwild_plugins.ps.replication.known_history import KnownHistory

HOLDER = (1, 0x51)  # primary 1 under its lease


def record(epoch: int, primary: int = 1, lease: int = 0x51) -> BucketRecord:
    return BucketRecord(epoch, primary, lease, (primary,))


def test_nothing_known_takes_every_record_missing_or_not():
    history = KnownHistory()
    assert not history.seen
    assert not history.foreign(None) and not history.foreign(record(1))


def test_after_an_epoch_is_known_a_missing_older_or_other_holders_record_is_foreign():
    history = KnownHistory()
    history.know(3, HOLDER)
    assert history.seen and (history.epoch, history.holder) == (3, HOLDER)
    assert history.foreign(None)  # gone: etcd lost the bucket's state
    assert history.foreign(record(2))  # older than one seen
    assert history.foreign(record(3, primary=2, lease=0x52))  # that epoch, another holder
    assert not history.foreign(record(3)) and not history.foreign(record(4, primary=2))


def test_an_older_epoch_seen_later_changes_nothing_and_the_first_holder_of_an_epoch_stays():
    history = KnownHistory()
    history.know(3, HOLDER)
    history.know(2, (2, 0x52))
    history.know(3, (2, 0x52))
    assert (history.epoch, history.holder) == (3, HOLDER)


def test_a_member_that_saw_the_bucket_makes_it_seen_without_an_epoch():
    history = KnownHistory(started=True)
    assert history.seen and not history.foreign(None)


def test_the_guard_marks_a_foreign_answer_lost_for_good_and_passes_a_missing_one():
    history = KnownHistory()
    history.know(3, HOLDER)
    assert not history.disowns(None) and not history.lost  # each answer's rule decides
    assert not history.disowns(record(4)) and not history.lost
    assert history.disowns(record(2)) and history.lost
    assert history.foreign(record(9))  # a later epoch of that other history too: never again
