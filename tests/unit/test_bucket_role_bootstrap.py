"""A bucket role's first primary (plugins/ps/replication/bucket_role.py), with no socket: with no
record only the first desired copy campaigns, once the members settled and under a valid lease; it
serves once every copy is synced and written in sync; two servers that each think they are first
race and one creates the record. Every stimulus is followed by the role's ``validate_state``.
"""

from __future__ import annotations

from hogwild_plugins.ps.failover import BucketRecord, desired_copies
from hogwild_plugins.ps.replication.bucket_role import BucketRole, Role
from hogwild_plugins.ps.replication.bucket_role_events import (
    Campaign,
    CampaignAnswered,
    CommitPrepared,
    InSyncWritten,
    MapRead,
    SnapshotDelivered,
    Sync,
)

from tests.unit.bucket_role_support import (
    BUCKET,
    COPIES,
    LEASE,
    NEW_LEASE,
    TTL,
    SyncKeys,
    carry_out,
    cluster,
    first_primary,
    live,
    step,
)


def test_with_no_record_only_the_first_desired_copy_campaigns_for_a_new_bucket():
    members = live(range(3))
    first = desired_copies(BUCKET, members, COPIES)[0]
    roles = cluster()
    for s, role in roles.items():
        actions = step(role, MapRead, None, members, LEASE[s], lease_valid=True, settled=True)
        if s == first:
            assert actions == [Campaign(BUCKET, BucketRecord(1, s, LEASE[s], (s,)), expected=0)]
            assert role.role is Role.CANDIDATE
        else:
            assert actions == []
            assert role.role is Role.FOLLOWER


def test_no_first_primary_is_chosen_until_the_members_settled():
    members = live(range(3))
    first = desired_copies(BUCKET, members, COPIES)[0]
    roles = cluster()
    for s, role in roles.items():
        assert step(role, MapRead, None, members, LEASE[s], True, settled=False) == []
        assert role.role is Role.FOLLOWER
    assert step(roles[first], MapRead, None, members, LEASE[first], True, settled=True) != []


def test_the_first_primary_serves_only_once_every_copy_is_synced_and_written_in_sync():
    keys, members = SyncKeys(), live(range(3))
    role = first_primary(members, keys)
    first = role.me
    others = sorted(set(members) - {first})

    actions = step(role, CampaignAnswered, True, keys.read())
    assert actions == [CommitPrepared(BUCKET)] + [Sync(BUCKET, s) for s in others]
    assert role.role is Role.PRIMARY and not role.serving

    [write] = step(role, SnapshotDelivered, others[0])
    assert write.record.in_sync == (first, others[0]) and write.expected == keys.read().revision
    assert not role.serving
    assert (
        step(role, SnapshotDelivered, others[1]) == []
    )  # a write is under way: this one goes in the next
    assert keys.transact(write)
    [second] = step(role, InSyncWritten, True, keys.read())
    assert second.record.in_sync == (first, *others)
    assert not role.serving
    assert keys.transact(second)
    assert step(role, InSyncWritten, True, keys.read()) == []
    assert role.serving
    assert keys.read().in_sync == (first, *others) and keys.read().epoch == 1


def test_two_servers_that_each_think_they_are_first_race_and_one_creates_the_record():
    keys, roles = SyncKeys(), cluster()
    # Each has seen only itself register: each is the first desired copy of its own view.
    campaigns = {s: step(roles[s], MapRead, None, live([s]), LEASE[s], True) for s in (0, 1)}
    assert all(c[0].expected == 0 for c in campaigns.values())
    carry_out(roles[1], campaigns[1], keys)
    carry_out(roles[0], campaigns[0], keys)
    assert roles[1].role is Role.PRIMARY
    assert roles[0].role is Role.FOLLOWER and roles[0].record == keys.read()
    assert keys.read().primary == 1


def test_a_server_not_registered_under_a_valid_lease_does_not_start_a_bucket():
    members = live(range(3))
    first = desired_copies(BUCKET, members, COPIES)[0]
    role = BucketRole(BUCKET, first, COPIES, lease_ttl=TTL)
    assert step(role, MapRead, None, members, LEASE[first], lease_valid=False) == []
    others = {s: lease for s, lease in members.items() if s != first}
    assert step(role, MapRead, None, others, LEASE[first], lease_valid=True) == []
    # Its member key still carries the lease it had before it registered again.
    assert step(role, MapRead, None, members, NEW_LEASE[first], lease_valid=True) == []
    assert role.role is Role.FOLLOWER
