"""Answers to a primary's snapshots that come after the role moved on
(plugins/ps/replication/bucket_role.py, with no socket): the real server sends snapshots on a
thread of their own (plugins/ps/replication/snapshot_sender.py), so a Sync's answer may reach the
role after it was deposed and won the bucket again, with a Sync of the same copy under way in
the new epoch. An answer names its Sync's epoch: one of an earlier primaryship is no news (it
neither confirms nor drops the copy, nor deposes the primary); the new epoch's answer counts.
Every stimulus is followed by the role's ``validate_state``.
"""

from __future__ import annotations

from hogwild_plugins.ps.replication.bucket_role import Role
from hogwild_plugins.ps.replication.bucket_role_events import (
    CampaignAnswered,
    CopyUnreachable,
    Fenced,
    InSyncWritten,
    MapRead,
    SnapshotDelivered,
    Sync,
    WriteInSync,
)

from tests.unit.bucket_role_support import BUCKET, LEASE, established, live, step


def resyncing():
    """An established bucket's primary syncing a copy it dropped: (role, keys, the copy, the
    Sync under way)."""
    roles, keys, primary = established()
    role = roles[primary]
    copy = next(s for s in keys.read().in_sync if s != primary)
    [drop] = step(role, CopyUnreachable, copy)
    assert isinstance(drop, WriteInSync) and keys.transact(drop)
    [sync] = step(role, InSyncWritten, True, keys.read())
    assert sync == Sync(BUCKET, copy) and sync.epoch == role.epoch
    return role, keys, copy, sync


def reelected(role, keys) -> list:
    """The primary deposed (a copy fenced it) and, named in the record still, winning the
    bucket again under the next epoch; the Syncs the new primaryship starts."""
    assert step(role, Fenced) == []
    assert role.role is Role.DEPOSED
    [campaign] = step(role, MapRead, keys.read(), live(range(3)), LEASE[role.me], True)
    assert keys.transact(campaign)
    actions = step(role, CampaignAnswered, True, keys.read())
    return [a for a in actions if isinstance(a, Sync)]


def test_an_answer_to_an_earlier_primaryships_snapshot_is_no_news():
    role, keys, copy, old = resyncing()
    syncs = reelected(role, keys)
    [new] = [s for s in syncs if s.server == copy]
    assert new.epoch == old.epoch + 1 == role.epoch
    # the old Sync's answers come now: delivered, unreachable, fenced: none counts
    assert step(role, SnapshotDelivered, copy, old.epoch) == []
    assert copy in role.syncing and copy not in role.confirmed
    assert step(role, CopyUnreachable, copy, old.epoch) == []
    assert copy in role.syncing and copy not in role.dropping
    assert step(role, Fenced, old.epoch) == []
    assert role.role is Role.PRIMARY
    assert not role.serving  # the new epoch's snapshots are still under way
    # the new epoch's answers count
    for sync in syncs:
        actions = step(role, SnapshotDelivered, sync.server, sync.epoch)
        for write in actions:
            assert isinstance(write, WriteInSync) and keys.transact(write)
            assert step(role, InSyncWritten, True, keys.read()) == []
    assert copy in role.confirmed and copy in keys.read().in_sync
    assert role.serving


def test_a_late_fence_of_the_current_epoch_still_deposes():
    role, _, copy, sync = resyncing()
    assert step(role, Fenced, sync.epoch) == []
    assert role.role is Role.DEPOSED and not role.syncing
