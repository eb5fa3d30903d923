"""A primary's copies (plugins/ps/replication/bucket_role_in_sync.py), with no socket: copies
dropped from and added back to ``in_sync``, a new primary that serves only once every live
in-sync copy has its snapshot (a bucket handed back to its preferred primary:
test_bucket_role_hand_over.py). Every stimulus is followed by the role's ``validate_state``.
"""

from __future__ import annotations

from hogwild_plugins.ps.failover import BucketRecord
from hogwild_plugins.ps.replication.bucket_role import BucketRole, Role
from hogwild_plugins.ps.replication.bucket_role_events import (
    CampaignAnswered,
    CopyUnreachable,
    InSyncWritten,
    MapRead,
    SnapshotDelivered,
    StepDown,
    Sync,
    WriteInSync,
)
from hogwild_plugins.ps.replication.copy_side import Gate, gate
from hogwild_plugins.ps.shard_log import ShardLog

from tests.unit.bucket_role_support import (
    BUCKET,
    COPIES,
    LEASE,
    NEW_LEASE,
    TTL,
    SyncKeys,
    carry_out,
    established,
    first_primary,
    live,
    settle,
    step,
)

# --------------------------------------------------------------------------- a copy's log


def test_a_copy_that_missed_a_prepare_is_dropped_caught_up_and_taken_back():
    roles, keys, primary = established()
    copy = next(s for s in roles if s != primary)
    log = ShardLog(committed=4)
    assert not log.prepare(6, "u6", epoch=1)  # the copy reports a gap: NEED_SYNC
    [drop] = step(roles[primary], CopyUnreachable, copy)
    assert copy not in drop.record.in_sync
    assert not roles[primary].serving  # until etcd has the copy out of in_sync
    assert keys.transact(drop)
    assert step(roles[primary], InSyncWritten, True, keys.read()) == [Sync(BUCKET, copy)]
    assert not roles[primary].serving
    log.restore(6, [], epoch=1)  # the snapshot
    [back] = step(roles[primary], SnapshotDelivered, copy)
    assert copy in back.record.in_sync
    assert keys.transact(back) and step(roles[primary], InSyncWritten, True, keys.read()) == []
    assert roles[primary].serving and copy in keys.read().in_sync
    assert log.prepare(7, "u7", epoch=1)


# --------------------------------------------------------------------------- in_sync changes


def test_an_in_sync_write_whose_record_is_gone_when_read_back_is_the_records_loss():
    """The write went through; before the server read the record back (a request of its own),
    etcd lost the job's keys. The role took the missing record for its own (its replication
    thread died on it, and the server's key was never written again): it is the loss a map
    read would find, so the primary steps down and never follows the bucket again."""
    roles, keys, primary = established()
    copy = next(s for s in roles if s != primary)
    [drop] = step(roles[primary], CopyUnreachable, copy)
    assert keys.transact(drop)
    assert step(roles[primary], InSyncWritten, True, None) == []
    role = roles[primary]
    assert role.role is Role.DEPOSED and role.record_lost and not role.serving
    assert gate(role, role.epoch, LEASE[primary], primary) is Gate.FENCED


def test_an_in_sync_write_read_back_as_another_history_is_the_records_loss():
    roles, keys, primary = established()
    copy = next(s for s in roles if s != primary)
    [drop] = step(roles[primary], CopyUnreachable, copy)
    assert keys.transact(drop)
    other = next(s for s in roles if s not in (primary, copy))
    fresh = BucketRecord(epoch=1, primary=other, lease=LEASE[other], in_sync=(other,), revision=2)
    assert step(roles[primary], InSyncWritten, True, fresh) == []
    assert roles[primary].role is Role.DEPOSED and roles[primary].record_lost


def test_an_in_sync_write_read_back_as_a_newer_primarys_record_deposes_the_primary():
    """The write went through; before it was read back another server won the bucket (this
    one's lease lapsed meanwhile): the role follows the newer record, it does not hold it."""
    roles, keys, primary = established()
    copy = next(s for s in roles if s != primary)
    [drop] = step(roles[primary], CopyUnreachable, copy)
    assert keys.transact(drop)
    written = keys.read()
    newer = BucketRecord(
        epoch=written.epoch + 1, primary=copy, lease=LEASE[copy], in_sync=(copy,),
        revision=written.revision + 1,
    )  # fmt: skip
    assert step(roles[primary], InSyncWritten, True, newer) == []
    role = roles[primary]
    assert role.role is Role.DEPOSED and not role.serving and not role.record_lost
    assert role.record == newer


def test_a_copy_lost_while_a_write_is_under_way_is_removed_by_the_next_write():
    keys, members = SyncKeys(), live(range(3))
    role = first_primary(members, keys)
    first = role.me
    a, b = sorted(set(members) - {first})
    step(role, CampaignAnswered, True, keys.read())
    [add_a] = step(role, SnapshotDelivered, a)
    assert step(role, SnapshotDelivered, b) == []  # a write is under way: b goes in the next one
    assert keys.transact(add_a)
    [add_b] = step(role, InSyncWritten, True, keys.read())
    assert add_b.record.in_sync == (first, a, b)
    assert step(role, CopyUnreachable, a) == []  # while b is being added: queued
    assert keys.transact(add_b)
    [drop_a] = step(role, InSyncWritten, True, keys.read())
    assert drop_a.record.in_sync == (first, b)
    assert keys.transact(drop_a)
    step(role, InSyncWritten, True, keys.read())
    assert keys.read().in_sync == (first, b)


def test_a_copy_back_while_its_removal_is_written_is_added_again():
    roles, keys, primary = established()
    copy = next(s for s in roles if s != primary)
    role = roles[primary]
    [drop] = step(role, CopyUnreachable, copy)
    assert (
        step(role, SnapshotDelivered, copy) == []
    )  # caught up again while the removal is under way
    carry_out(role, [drop], keys, roles)
    assert role.serving and copy in keys.read().in_sync


def test_an_in_sync_write_that_loses_to_another_deposes_the_primary():
    roles, keys, primary = established()
    copy = next(s for s in roles if s != primary)
    step(roles[primary], CopyUnreachable, copy)
    assert step(roles[primary], InSyncWritten, False, keys.read()) == []
    assert roles[primary].role is Role.DEPOSED and not roles[primary].serving


def test_a_snapshot_that_fails_is_tried_again_at_the_next_read_of_the_map():
    keys, members = SyncKeys(), live(range(3))
    role = first_primary(members, keys)
    down = max(set(members) - {role.me})
    carry_out(
        role, step(role, CampaignAnswered, True, keys.read()), keys, reachable=lambda s: s != down
    )
    assert down not in keys.read().in_sync
    assert role.serving  # given up on for now: the others are in sync
    assert step(role, MapRead, keys.read(), members, LEASE[role.me], True) == [Sync(BUCKET, down)]
    assert not role.serving
    carry_out(role, step(role, SnapshotDelivered, down), keys)
    assert down in keys.read().in_sync and role.serving


def test_a_member_going_away_is_written_out_of_in_sync_and_synced_when_it_returns():
    roles, keys, primary = established()
    gone = next(s for s in roles if s != primary)
    role = roles[primary]
    members = live(s for s in roles if s != gone)
    [drop] = step(role, MapRead, keys.read(), members, LEASE[primary], True)
    assert isinstance(drop, WriteInSync) and gone not in drop.record.in_sync
    assert not role.serving
    carry_out(role, [drop], keys)
    assert role.serving and gone not in keys.read().in_sync
    assert step(role, MapRead, keys.read(), members, LEASE[primary], True) == []  # nothing to sync
    returned = {**members, gone: NEW_LEASE[gone]}  # its key lapsed: it registers anew
    back = step(role, MapRead, keys.read(), returned, LEASE[primary], True)
    assert back == [Sync(BUCKET, gone)]


def test_a_copy_that_restarted_is_written_out_of_in_sync_and_synced_again():
    roles, keys, primary = established()
    restarted = next(s for s in roles if s != primary)
    role = roles[primary]
    members = {**live(roles), restarted: NEW_LEASE[restarted]}  # a new process, a new lease
    [drop] = step(role, MapRead, keys.read(), members, LEASE[primary], True)
    assert isinstance(drop, WriteInSync) and restarted not in drop.record.in_sync
    assert keys.transact(drop)
    assert step(role, InSyncWritten, True, keys.read()) == [Sync(BUCKET, restarted)]
    carry_out(role, step(role, SnapshotDelivered, restarted), keys)
    assert restarted in keys.read().in_sync and role.serving
    assert step(role, MapRead, keys.read(), members, LEASE[primary], True) == []  # and stays in


def test_a_copy_that_left_while_its_snapshot_was_sent_is_written_out_of_in_sync():
    keys, members = SyncKeys(), live(range(3))
    role = first_primary(members, keys)
    leaving = max(set(members) - {role.me})
    step(role, CampaignAnswered, True, keys.read())
    without = {s: lease for s, lease in members.items() if s != leaving}
    step(role, MapRead, keys.read(), without, LEASE[role.me], True)  # its key lapsed meanwhile
    carry_out(role, step(role, SnapshotDelivered, leaving), keys)  # the snapshot had reached it
    carry_out(role, step(role, MapRead, keys.read(), without, LEASE[role.me], True), keys)
    assert leaving not in keys.read().in_sync


def test_a_copy_away_when_the_bucket_was_won_is_written_out_before_the_bucket_takes_writes():
    """The primary is gone and the other copy away (paused past its lease): the survivor wins
    keeping one of them in ``in_sync`` (min_copies = 2: it missed nothing acknowledged), here the
    old primary. Nobody caught that one up in the new epoch, so once the other copy is back and
    synced, the bucket takes writes only after it is written out: a prepare of this epoch must
    never reach a log a deposed primary's round may have left diverged."""
    keys = SyncKeys()
    dead, survivor, away = 0, 1, 2
    record = BucketRecord(3, dead, LEASE[dead], (dead, survivor, away))
    keys.values[BUCKET] = (record.value(), 7)
    keys.revision = 7
    role = BucketRole(BUCKET, survivor, COPIES, min_copies=2, lease_ttl=TTL)
    role.current, role.record = True, keys.read()
    members = {survivor: LEASE[survivor]}
    carry_out(role, step(role, MapRead, keys.read(), members, LEASE[survivor], True), keys)
    assert role.role is Role.PRIMARY and len(keys.read().in_sync) == 2  # one kept while away
    assert not role.writable
    members = {survivor: LEASE[survivor], away: NEW_LEASE[away]}  # it registered again
    for _ in range(4):
        carry_out(role, step(role, MapRead, keys.read(), members, LEASE[survivor], True), keys)
        if role.writable:
            assert set(role.record.in_sync) <= role.confirmed, role.record
    assert role.writable and sorted(keys.read().in_sync) == [survivor, away]


def test_a_step_down_told_another_historys_record_does_not_follow_it():
    """A primary stepping down is told a record of its own epoch under another holder (a
    bucket started afresh elsewhere): it serves nothing and keeps the record it knew."""
    roles, keys, primary = established()
    role = roles[primary]
    before = role.record
    other = next(s for s in roles if s != primary)
    fresh = BucketRecord(
        epoch=before.epoch, primary=other, lease=LEASE[other], in_sync=(other,),
        revision=before.revision + 1,
    )  # fmt: skip
    assert step(role, StepDown, fresh) == []
    assert role.role is Role.DEPOSED and role.record_lost and not role.serving
    assert role.record == before


def test_a_copy_kept_through_a_new_lease_is_caught_up_without_a_write_and_its_primary_says_so():
    """min_copies = 2 and two live copies: a copy that took a new lease (paused past its old
    one) cannot be written out of ``in_sync`` (one would be left), so it is kept and caught up
    again, and the record is not written. etcd's record is then older than the copy's member
    key, so an observer reading etcd alone cannot tell that it is caught up; the primary's
    STATUS can (``BucketRole.confirmed_copies``: the copy, under its new lease)."""
    keys = SyncKeys(2)
    roles = {s: BucketRole(BUCKET, s, COPIES, min_copies=2, lease_ttl=TTL) for s in (0, 1)}
    settle(roles, keys, live(roles))
    primary = keys.read().primary
    role, other = roles[primary], 1 - primary
    assert sorted(keys.read().in_sync) == [0, 1] and role.serving
    assert role.confirmed_copies() == {str(other): LEASE[other]}
    assert roles[other].confirmed_copies() == {}  # a copy tells none
    written = keys.revision
    members = {primary: LEASE[primary], other: NEW_LEASE[other]}
    [sync] = step(role, MapRead, keys.read(), members, LEASE[primary], True)
    assert isinstance(sync, Sync) and sync.server == other  # caught up again, not written out
    assert role.confirmed_copies() == {} and not role.serving
    carry_out(role, [sync], keys)
    assert keys.revision == written and sorted(keys.read().in_sync) == [0, 1]  # no write
    assert role.serving
    assert role.confirmed_copies() == {str(other): NEW_LEASE[other]}
