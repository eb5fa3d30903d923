"""A fenced or deposed primary (plugins/ps/replication/bucket_role.py), with no socket: it steps
down at once and asks for nothing more, follows its successor, or takes its bucket back when the
record still names it; snapshots of older epochs do not make a copy current. Every stimulus is
followed by the role's ``validate_state``.
"""

from __future__ import annotations

import pytest
from hogwild_plugins.ps.failover import BucketRecord
from hogwild_plugins.ps.replication.bucket_role import Role
from hogwild_plugins.ps.replication.bucket_role_events import (
    Campaign,
    CampaignAnswered,
    CopyUnreachable,
    Fenced,
    InSyncWritten,
    MapRead,
    Restored,
    SnapshotDelivered,
    Sync,
    WriteInSync,
)
from hogwild_plugins.ps.replication.copy_side import Gate, gate

from tests.unit.bucket_role_support import (
    BUCKET,
    LEASE,
    NEW_LEASE,
    SyncKeys,
    carry_out,
    established,
    failed_over,
    first_primary,
    lapsed_primary,
    live,
    observe_all,
    step,
)


@pytest.mark.parametrize("what", ["newer epoch", "another lease", "lease not valid"])
def test_a_primary_steps_down_at_once_and_asks_for_nothing_more(what):
    keys, members = SyncKeys(), live(range(3))
    role = first_primary(members, keys)
    first = role.me
    other = next(s for s in members if s != first)
    step(role, CampaignAnswered, True, keys.read())
    assert role.syncing  # snapshots under way

    record, lease, valid = keys.read(), LEASE[first], True
    if what == "newer epoch":
        new = BucketRecord(record.epoch + 1, other, LEASE[other], (other,))
        keys.transact(WriteInSync(BUCKET, new, record.revision))
        record = keys.read()
    elif what == "another lease":
        lease = NEW_LEASE[first]  # its lease lapsed and it registered again
    else:
        valid = False
    assert step(role, MapRead, record, members, lease, valid) == []
    assert role.role is Role.DEPOSED and not role.serving
    assert not (role.syncing or role.writing or role.behind or role.dropping)
    assert step(role, SnapshotDelivered, other) == []  # a late snapshot's answer writes nothing
    assert step(role, CopyUnreachable, other) == []


def test_a_fenced_primary_is_deposed():
    roles, _keys, primary = established()
    assert step(roles[primary], Fenced) == []
    assert roles[primary].role is Role.DEPOSED and not roles[primary].serving
    follower = next(s for s in roles if s != primary)
    assert step(roles[follower], Fenced) == []
    assert roles[follower].role is Role.FOLLOWER


def test_a_deposed_primary_follows_once_the_record_names_another_primary():
    roles, keys, primary = established()
    members = live(roles)
    step(roles[primary], Fenced)
    assert roles[primary].current  # its memory stays current until a newer primary shows
    # The record still names it, but its lease is not valid: it stays deposed, and does not
    # campaign.
    assert step(roles[primary], MapRead, keys.read(), members, LEASE[primary], False) == []
    assert roles[primary].role is Role.DEPOSED
    other = next(s for s in roles if s != primary)
    record = keys.read()
    new = BucketRecord(record.epoch + 1, other, LEASE[other], (other,))
    keys.transact(Campaign(BUCKET, new, record.revision))
    assert step(roles[primary], MapRead, keys.read(), members, LEASE[primary], True) == []
    assert roles[primary].role is Role.FOLLOWER and roles[primary].record == keys.read()
    # A newer primary: this side may have diverged from it, and takes nothing back unless a
    # snapshot makes it current again, even once that primary is gone.
    assert not roles[primary].current
    without = {s: lease for s, lease in members.items() if s != other}
    assert step(roles[primary], MapRead, keys.read(), without, LEASE[primary], True) == []
    assert roles[primary].role is Role.FOLLOWER


def test_a_deposed_primary_restored_before_it_reads_its_successors_map_takes_the_bucket_back():
    # The preferred primary is paused past its lease; the survivors take the bucket over without
    # it. It wakes, steps down and registers again; the new primary's snapshot reaches it before
    # it has read a map that has it in in_sync (the write adding it comes after the snapshot).
    # That snapshot made it current: when the bucket is handed back to it, it takes it.
    roles, keys, paused, survivors = failed_over()
    holder = keys.read().primary
    taken = keys.read()
    assert paused not in taken.in_sync
    assert step(roles[paused], MapRead, taken, survivors, LEASE[paused], lease_valid=False) == []
    assert roles[paused].role is Role.DEPOSED
    members = {**survivors, paused: NEW_LEASE[paused]}
    assert step(roles[holder], MapRead, taken, members, LEASE[holder], True) == [
        Sync(BUCKET, paused)
    ]
    step(roles[paused], Restored, taken.epoch)  # the snapshot, on the paused side's network thread
    assert step(roles[paused], MapRead, taken, members, NEW_LEASE[paused], True) == []
    assert roles[paused].role is Role.FOLLOWER and roles[paused].current
    carry_out(
        roles[holder], step(roles[holder], SnapshotDelivered, paused), keys, roles
    )  # now in in_sync
    [hand] = step(roles[holder], MapRead, keys.read(), members, LEASE[holder], True)
    carry_out(roles[holder], [hand], keys, roles)
    assert keys.read().primary == paused
    [campaign] = step(roles[paused], MapRead, keys.read(), members, NEW_LEASE[paused], True)
    carry_out(roles[paused], [campaign], keys, roles)
    assert roles[paused].serving and keys.read().epoch == taken.epoch + 2


def test_a_deposed_primary_restored_under_an_older_epoch_than_the_map_it_reads_is_not_current():
    # Its snapshot came from a primary that was itself replaced, without it, since: what that
    # newer primary acknowledged is not in its memory.
    roles, keys, paused, survivors = failed_over()
    taken = keys.read()
    step(roles[paused], MapRead, taken, survivors, LEASE[paused], lease_valid=False)
    step(roles[paused], Restored, taken.epoch)
    other = next(s for s in survivors if s != taken.primary)
    newer = BucketRecord(taken.epoch + 1, other, LEASE[other], (other,))
    assert keys.transact(Campaign(BUCKET, newer, taken.revision))
    members = {**survivors, paused: NEW_LEASE[paused]}
    assert step(roles[paused], MapRead, keys.read(), members, NEW_LEASE[paused], True) == []
    assert roles[paused].role is Role.FOLLOWER and not roles[paused].current


def test_a_snapshot_of_an_older_epoch_than_the_record_already_read_does_not_make_a_copy_current():
    # The gate let the snapshot in under epoch E; while it was applied, this side read the
    # record of epoch E + 1, whose primary may have acknowledged what the snapshot lacks.
    roles, keys, paused, survivors = failed_over()
    taken = keys.read()
    step(roles[paused], MapRead, taken, survivors, LEASE[paused], lease_valid=False)
    other = next(s for s in survivors if s != taken.primary)
    newer = BucketRecord(taken.epoch + 1, other, LEASE[other], (other,))
    assert keys.transact(Campaign(BUCKET, newer, taken.revision))
    members = {**survivors, paused: NEW_LEASE[paused]}
    step(roles[paused], MapRead, keys.read(), members, NEW_LEASE[paused], True)
    assert not roles[paused].current
    step(roles[paused], Restored, taken.epoch)
    assert not roles[paused].current and roles[paused].restored_epoch == 0


def test_a_deposed_primary_that_reads_the_record_still_naming_it_takes_it_back():
    # Fenced (or stepped down) with nobody else taking over: the record in etcd still names it.
    # Registered again under a new lease, it campaigns for the next epoch under that lease.
    roles, keys, primary = established()
    step(roles[primary], Fenced)
    record = keys.read()
    members = {**live(roles), primary: NEW_LEASE[primary]}
    others = tuple(s for s in record.in_sync if s != primary)
    new = BucketRecord(record.epoch + 1, primary, NEW_LEASE[primary], (primary, *others))
    actions = step(roles[primary], MapRead, record, members, NEW_LEASE[primary], True)
    assert actions == [Campaign(BUCKET, new, record.revision)]
    assert roles[primary].role is Role.CANDIDATE


def test_a_replaced_primarys_in_sync_write_fails_and_deposes_it():
    roles, keys, old, members = lapsed_primary()
    winner = min(members)
    actions = step(roles[winner], MapRead, keys.read(), members, LEASE[winner], True)
    carry_out(roles[winner], actions, keys, roles)
    assert roles[winner].serving
    # The old primary, back from a pause, has not read the map yet and drops a copy.
    [write] = step(roles[old], CopyUnreachable, max(members))
    assert not keys.transact(write)  # it expected the revision before the campaign
    assert step(roles[old], InSyncWritten, False, keys.read()) == []
    assert roles[old].role is Role.DEPOSED and roles[old].record.primary == winner
    assert step(roles[old], MapRead, keys.read(), live(roles), LEASE[old], True) == []
    assert roles[old].role is Role.FOLLOWER


def test_a_primary_deposed_by_its_own_clock_does_not_strand_the_bucket():
    roles, keys, primary = established()
    members = live(roles)
    before = keys.read()
    # A heartbeat came back late: past ttl * (1 - margin) by this side's clock, within the TTL
    # by etcd's. The primary steps down; the renewal then arrives: same lease, valid again. Its
    # member key never lapsed, so no copy sees a reason to campaign.
    step(roles[primary], MapRead, before, members, LEASE[primary], lease_valid=False)
    assert roles[primary].role is Role.DEPOSED
    for _ in range(3):
        observe_all(roles, keys, members)
    assert [s for s, role in roles.items() if role.serving] == [primary]
    after = keys.read()
    assert after.epoch > before.epoch  # what it sent under the old epoch is fenced
    assert gate(roles[after.in_sync[-1]], before.epoch, before.lease, primary) is Gate.FENCED
    assert set(after.in_sync) == set(before.in_sync)  # every copy caught up again
