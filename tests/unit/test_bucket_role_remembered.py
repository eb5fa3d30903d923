"""A bucket role whose server's store remembers the bucket's record (plugins/ps/replication/
bucket_role.py, ``Remembered``), and the ``seen`` of one bucket, not of the job, with no socket:
a process started on a store that marks the bucket never starts it afresh over a missing or older
record, follows one at the remembered epoch or newer, and one bucket's ``seen`` holds back no
other bucket's first primary. Every stimulus is followed by the role's ``validate_state``.
"""

from __future__ import annotations

from hogwild_plugins.ps.failover import BucketRecord, desired_copies
from hogwild_plugins.ps.replication.bucket_role import BucketRole, Role
from hogwild_plugins.ps.replication.bucket_role_events import (
    Campaign,
    CampaignAnswered,
    MapRead,
    Remembered,
)
from hogwild_plugins.ps.replication.copy_side import Gate, gate

from tests.unit.bucket_role_support import (
    BUCKET,
    COPIES,
    LEASE,
    NEW_LEASE,
    TTL,
    lapsed_primary,
    live,
    step,
)

MEMBERS = live(range(3))
FIRST = desired_copies(BUCKET, MEMBERS, COPIES)[0]  # the bucket's very first primary


def test_without_a_mark_the_first_server_starts_the_missing_bucket():
    """The control: a process with nothing remembered takes a missing record for a new bucket
    (what a server without a store does after etcd lost its keys, when no member saw one)."""
    role = BucketRole(BUCKET, FIRST, COPIES, lease_ttl=TTL)
    [campaign] = step(role, MapRead, None, MEMBERS, LEASE[FIRST], True)
    assert campaign == Campaign(BUCKET, BucketRecord(1, FIRST, LEASE[FIRST], (FIRST,)), 0)


def test_a_process_whose_store_remembers_the_bucket_never_starts_it_afresh():
    role = BucketRole(BUCKET, FIRST, COPIES, lease_ttl=TTL)
    assert step(role, Remembered, 4, FIRST, LEASE[FIRST]) == []
    assert role.seen and role.known_epoch == 4  # (its members/<i> lists the bucket)
    for _ in range(3):  # read again and again: etcd came back empty, nobody else listed it
        assert step(role, MapRead, None, MEMBERS, LEASE[FIRST], True, blank=True) == []
        assert role.record_lost and role.role is Role.FOLLOWER and not role.current
    assert [t[1] for t in role.story()][:2] == ["Remembered", "MapRead"]


def test_a_record_older_than_the_remembered_epoch_is_etcds_lost_state():
    """A bucket started afresh elsewhere (epoch 1), or etcd restored from an old backup."""
    other = next(s for s in MEMBERS if s != FIRST)
    role = BucketRole(BUCKET, FIRST, COPIES, lease_ttl=TTL)
    step(role, Remembered, 4, other, LEASE[other])
    for epoch in (1, 3):
        older = BucketRecord(epoch, other, LEASE[other], (other,), revision=2)
        assert step(role, MapRead, older, MEMBERS, LEASE[FIRST], True, blank=False) == []
        assert role.record_lost and role.role is Role.FOLLOWER


def test_a_record_at_the_remembered_epoch_or_newer_is_followed():
    """A server restarted on its store while etcd kept the map (the supervisor's restart): the
    record is the one it remembers, or newer; it follows it (a new process is not current: it
    is caught up by a snapshot, never campaigns on its own memory)."""
    other = next(s for s in MEMBERS if s != FIRST)
    for epoch in (4, 6):
        role = BucketRole(BUCKET, FIRST, COPIES, lease_ttl=TTL)
        step(role, Remembered, 4, other, LEASE[other])
        record = BucketRecord(epoch, other, LEASE[other], (other, FIRST), revision=9)
        members = {**MEMBERS, FIRST: NEW_LEASE[FIRST]}
        assert step(role, MapRead, record, members, NEW_LEASE[FIRST], True, blank=False) == []
        assert not role.record_lost and role.record == record and not role.current
        assert role.known_epoch == epoch


def test_a_mark_older_than_what_the_process_saw_changes_nothing():
    role = BucketRole(BUCKET, FIRST, COPIES, lease_ttl=TTL)
    record = BucketRecord(7, FIRST, LEASE[FIRST], (FIRST,), revision=3)
    step(role, MapRead, record, MEMBERS, LEASE[FIRST], True, blank=False)
    step(role, Remembered, 2, FIRST, LEASE[FIRST])
    assert role.known_epoch == 7 and role.history.holder == (FIRST, LEASE[FIRST])


def test_a_record_of_the_remembered_epoch_under_another_holder_is_another_history():
    """One epoch has one primary and lease: a record of the remembered epoch naming others is a
    bucket started afresh elsewhere (most buckets are lost at epoch 1, never having failed
    over); and once a loss was seen, a foreign history that reaches a higher epoch later is
    never followed either (the process's memory is never replaced by its snapshot)."""
    other = next(s for s in MEMBERS if s != FIRST)
    role = BucketRole(BUCKET, FIRST, COPIES, lease_ttl=TTL)
    step(role, Remembered, 1, FIRST, LEASE[FIRST])
    fresh = BucketRecord(1, other, LEASE[other], (other,), revision=4)
    assert role.foreign(fresh)
    assert step(role, MapRead, fresh, MEMBERS, NEW_LEASE[FIRST], True, blank=False) == []
    assert role.record_lost and role.record is None
    later = BucketRecord(3, other, LEASE[other], (other, FIRST), revision=9)
    assert role.foreign(later)
    assert step(role, MapRead, later, MEMBERS, NEW_LEASE[FIRST], True, blank=False) == []
    assert role.record is None and role.known_epoch == 1 and not role.current


def test_one_buckets_seen_holds_back_no_other_buckets_first_primary():
    """``blank`` is per bucket: a member that lists another bucket (it saw that bucket's record
    first, and registered again before this bucket's first primary campaigned) keeps this one
    from nothing; a member that lists this bucket keeps it from starting afresh."""
    role = BucketRole(BUCKET, FIRST, COPIES, lease_ttl=TTL)
    assert step(role, MapRead, None, MEMBERS, LEASE[FIRST], True, blank=False) == []
    assert role.history.started and role.seen
    # another bucket's seen: this one's blank
    fresh = BucketRole(BUCKET, FIRST, COPIES, lease_ttl=TTL)
    [campaign] = step(fresh, MapRead, None, MEMBERS, LEASE[FIRST], True, blank=True)
    assert isinstance(campaign, Campaign) and campaign.record.epoch == 1


def test_a_campaign_lost_to_another_history_is_never_followed():
    """A copy campaigns for a dead primary's bucket, and the compare-and-swap reads back a record
    of the epoch it knows under another holder (etcd lost the job's keys meanwhile and a server
    that knew nothing started the bucket afresh): the copy never follows that record, and its
    memory, which holds every acknowledged update, refuses that history's primary."""
    roles, keys, dead, members = lapsed_primary()
    known = keys.read()
    copy = next(s for s in members if s in known.in_sync)
    role = roles[copy]
    [campaign] = step(role, MapRead, known, members, LEASE[copy], True)
    assert campaign.record.epoch == known.epoch + 1
    other = next(s for s in members if s != copy)
    fresh = BucketRecord(known.epoch, other, NEW_LEASE[other], (other,), known.revision + 7)
    assert step(role, CampaignAnswered, False, fresh) == []
    assert role.record_lost and role.record == known and role.role is Role.FOLLOWER
    assert gate(role, fresh.epoch, fresh.lease, other) is Gate.FENCED
