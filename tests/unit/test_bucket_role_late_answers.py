"""Answers to a primary's snapshots that come after the role moved on
(plugins/ps/replication/bucket_role.py, with no socket): the real server sends snapshots on a
thread of their own (plugins/ps/replication/snapshot_sender.py), so a Sync's answer may reach the
role after it was deposed and won the bucket again, after a round dropped the copy and another
Sync of it was asked for (the first one's snapshot may lack what the bucket acknowledged in
between), or after the copy restarted. An answer names its Sync's ticket: one the role no longer
waits for is no news; one delivered to a process that is gone since is a copy unreachable.
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

from tests.unit.bucket_role_support import BUCKET, LEASE, NEW_LEASE, established, live, step


def resyncing():
    """An established bucket's primary syncing a copy it dropped: (role, keys, the copy, the
    Sync under way)."""
    roles, keys, primary = established()
    role = roles[primary]
    copy = next(s for s in keys.read().in_sync if s != primary)
    [drop] = step(role, CopyUnreachable, copy)
    assert isinstance(drop, WriteInSync) and keys.transact(drop)
    [sync] = step(role, InSyncWritten, True, keys.read())
    assert sync == Sync(BUCKET, copy) and sync.epoch == role.epoch and sync.ticket
    return role, keys, copy, sync


def written(role, keys, actions) -> None:
    """Carry out the in_sync writes ``actions`` ask for (each accepted)."""
    while actions:
        [write] = actions
        assert isinstance(write, WriteInSync) and keys.transact(write)
        actions = [
            a for a in step(role, InSyncWritten, True, keys.read()) if not isinstance(a, Sync)
        ]


def test_an_answer_to_an_earlier_primaryships_snapshot_is_no_news():
    role, keys, copy, old = resyncing()
    assert step(role, Fenced) == []  # deposed, and, still named in the record, elected again
    assert role.role is Role.DEPOSED
    [campaign] = step(role, MapRead, keys.read(), live(range(3)), LEASE[role.me], True)
    assert keys.transact(campaign)
    syncs = [a for a in step(role, CampaignAnswered, True, keys.read()) if isinstance(a, Sync)]
    [new] = [s for s in syncs if s.server == copy]
    assert new.epoch == old.epoch + 1 and new.ticket != old.ticket
    # the old Sync's answers come now: delivered, unreachable, fenced: none counts
    assert step(role, SnapshotDelivered, copy, old.ticket) == []
    assert copy in role.syncing and copy not in role.confirmed
    assert step(role, CopyUnreachable, copy, old.ticket) == []
    assert copy in role.syncing and copy not in role.dropping
    assert step(role, Fenced, old.ticket) == []
    assert role.role is Role.PRIMARY and not role.serving
    for sync in syncs:  # the new primaryship's answers count
        written(role, keys, step(role, SnapshotDelivered, sync.server, sync.ticket))
    assert copy in role.confirmed and copy in keys.read().in_sync and role.serving


def test_an_answer_to_a_sync_asked_for_again_since_is_no_news():
    role, keys, copy, first = resyncing()
    # a round drops the copy meanwhile (its prepare failed), and it is asked for again: the
    # first Sync's snapshot was taken before what the bucket may have acknowledged since
    assert step(role, CopyUnreachable, copy) == []
    [again] = [a for a in step(role, MapRead, keys.read(), live(range(3)), LEASE[role.me], True)]
    assert again == Sync(BUCKET, copy) and again.ticket > first.ticket
    assert step(role, SnapshotDelivered, copy, first.ticket) == []
    assert copy not in role.confirmed and not role.serving
    written(role, keys, step(role, SnapshotDelivered, copy, again.ticket))
    assert copy in role.confirmed and role.serving


def test_a_snapshot_delivered_to_a_process_gone_since_is_a_copy_unreachable():
    role, keys, copy, sync = resyncing()
    members = {**live(range(3)), copy: NEW_LEASE[copy]}  # the copy restarted: a new lease
    step(role, MapRead, keys.read(), members, LEASE[role.me], True)
    step(role, SnapshotDelivered, copy, sync.ticket)
    assert copy not in role.confirmed and copy not in keys.read().in_sync


def test_a_late_fence_of_this_primaryship_still_deposes():
    role, _, copy, sync = resyncing()
    assert step(role, Fenced, sync.ticket) == []
    assert role.role is Role.DEPOSED and not role.syncing
