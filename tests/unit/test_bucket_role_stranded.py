"""No bucket is stranded (plugins/ps/replication/bucket_role.py), with no socket: a primary named
by the record takes its bucket back under the next epoch, a campaign won in etcd whose answer was
lost is fought again, a new primary that dies before it served is succeeded, and a record lost
after one was seen starts nothing afresh. Every stimulus is followed by the role's
``validate_state``.
"""

from __future__ import annotations

from hogwild_plugins.ps.failover import BucketRecord, desired_copies
from hogwild_plugins.ps.replication.bucket_role import BucketRole, Role
from hogwild_plugins.ps.replication.bucket_role_events import (
    Campaign,
    CampaignAnswered,
    CommitPrepared,
    CopyUnreachable,
    MapRead,
    RecordRefreshed,
    SnapshotDelivered,
    Sync,
)
from hogwild_plugins.ps.replication.copy_side import Gate, gate

from tests.unit.bucket_role_support import (
    BUCKET,
    COPIES,
    LEASE,
    NEW_LEASE,
    TTL,
    SyncKeys,
    carry_out,
    cluster,
    established,
    first_primary,
    lapsed_primary,
    live,
    observe_all,
    step,
)


def sole_in_sync_primary():
    """An established bucket whose copies were both dropped from ``in_sync`` (their snapshots
    failed): the primary is the only copy with every acknowledged update."""
    roles, keys, primary = established()
    for copy in roles:
        if copy != primary:
            actions = step(roles[primary], CopyUnreachable, copy)
            carry_out(roles[primary], actions, keys, roles, lambda s: False)
    assert keys.read().in_sync == (primary,)
    return roles, keys, primary


def test_the_sole_in_sync_primary_that_lost_its_lease_takes_the_bucket_back_under_a_new_one():
    roles, keys, primary = sole_in_sync_primary()
    before = keys.read()
    copies = [s for s in roles if s != primary]
    lapsed = live(copies)  # its member key lapsed with its lease
    assert step(roles[primary], MapRead, before, lapsed, LEASE[primary], lease_valid=False) == []
    assert roles[primary].role is Role.DEPOSED and roles[primary].current
    for s in copies:  # not in sync: they wait for it
        assert step(roles[s], MapRead, before, lapsed, LEASE[s], True) == []
    # It registers again under a new lease: the record names it under the old one.
    members = {**lapsed, primary: NEW_LEASE[primary]}
    actions = step(roles[primary], MapRead, before, members, NEW_LEASE[primary], True)
    new = BucketRecord(before.epoch + 1, primary, NEW_LEASE[primary], (primary,))
    assert actions == [Campaign(BUCKET, new, before.revision)]
    carry_out(roles[primary], actions, keys, roles)
    after = keys.read()
    assert roles[primary].serving and roles[primary].role is Role.PRIMARY
    assert after.epoch == before.epoch + 1 and after.lease == NEW_LEASE[primary]
    assert set(after.in_sync) == set(roles)  # the copies caught up again
    for s in copies:  # once they read the map, what it sent under the old epoch is fenced
        assert gate(roles[s], after.epoch, NEW_LEASE[primary], primary) is Gate.REFRESH
        assert step(roles[s], MapRead, keys.read(), members, LEASE[s], True) == []
        assert gate(roles[s], before.epoch, LEASE[primary], primary) is Gate.FENCED
        assert gate(roles[s], after.epoch, NEW_LEASE[primary], primary) is Gate.ACCEPT
    assert step(roles[primary], MapRead, after, members, NEW_LEASE[primary], True) == []
    assert roles[primary].serving


def test_a_replaced_process_named_primary_does_not_campaign_and_the_bucket_waits():
    # The sole in-sync primary was killed and restarted: the new process has none of the
    # bucket's acknowledged updates, and no copy has them all either.
    roles, keys, primary = sole_in_sync_primary()
    before = keys.read()
    roles[primary] = BucketRole(BUCKET, primary, COPIES, lease_ttl=TTL)
    members = {**live(roles), primary: NEW_LEASE[primary]}
    for _ in range(3):
        for s, role in roles.items():
            lease = members[s]
            assert step(role, MapRead, keys.read(), members, lease, True) == []
            assert role.role is Role.FOLLOWER and not role.serving
    assert keys.read() == before


def test_a_campaign_won_in_etcd_whose_answer_was_lost_is_fought_again_and_won():
    roles, keys, old, members = lapsed_primary()
    stale = keys.read()
    winner, other = sorted(members)
    [campaign] = step(roles[winner], MapRead, stale, members, LEASE[winner], True)
    assert keys.transact(campaign)  # etcd took it; the answer never came back
    assert step(roles[winner], CampaignAnswered, False, None) == []
    assert roles[winner].role is Role.FOLLOWER and roles[winner].record == stale
    won = keys.read()
    assert won.epoch == stale.epoch + 1 and won.primary == winner
    # The other in-sync copy sees a live primary: it waits, and asks a newer epoch to refresh.
    assert step(roles[other], MapRead, won, members, LEASE[other], True) == []
    assert roles[other].role is Role.FOLLOWER
    # The next read names this side primary, not serving: it campaigns for the next epoch.
    actions = step(roles[winner], MapRead, won, members, LEASE[winner], True)
    again = BucketRecord(won.epoch + 1, winner, LEASE[winner], (winner, other))
    assert actions == [Campaign(BUCKET, again, won.revision)]
    carry_out(roles[winner], actions, keys, roles)
    after = keys.read()
    assert roles[winner].serving and after.epoch == stale.epoch + 2 and after.primary == winner
    assert set(after.in_sync) == set(members)
    assert gate(roles[other], after.epoch, LEASE[winner], winner) is Gate.REFRESH
    assert step(roles[other], MapRead, after, members, LEASE[other], True) == []
    assert gate(roles[other], after.epoch, LEASE[winner], winner) is Gate.ACCEPT
    assert gate(roles[other], won.epoch, LEASE[winner], winner) is Gate.FENCED


def test_a_first_campaign_won_in_etcd_whose_answer_was_lost_does_not_strand_the_bucket():
    # The bucket's very first record names this server, which never heard it won. Nothing was
    # acknowledged yet: it (or whoever) must still end up serving the bucket.
    keys, members = SyncKeys(), live(range(3))
    role = first_primary(members, keys)
    assert step(role, CampaignAnswered, False, None) == []
    assert role.role is Role.FOLLOWER and keys.read().primary == role.me
    roles = {**cluster(), role.me: role}
    for _ in range(3):
        observe_all(roles, keys, members)
    assert [s for s, r in roles.items() if r.serving] == [keys.read().primary]


def test_a_new_primary_that_dies_before_it_served_is_succeeded_by_another_in_sync_copy():
    roles, keys, old, members = lapsed_primary(range(4))
    record = keys.read()
    first, second = sorted(set(record.in_sync) & set(members))
    outsider = next(s for s in members if s not in record.in_sync)
    [campaign] = step(roles[first], MapRead, record, members, LEASE[first], True)
    assert keys.transact(campaign)
    actions = step(roles[first], CampaignAnswered, True, keys.read())
    assert Sync(BUCKET, second) in actions  # and none of the snapshots is sent
    assert roles[first].role is Role.PRIMARY and not roles[first].serving
    won = keys.read()
    assert won.in_sync == (first, second)
    # It dies before any snapshot: it acknowledged nothing.
    after = {s: lease for s, lease in members.items() if s != first}
    assert step(roles[outsider], MapRead, won, after, LEASE[outsider], True) == []
    actions = step(roles[second], MapRead, won, after, LEASE[second], True)
    succession = BucketRecord(won.epoch + 1, second, LEASE[second], (second,))
    assert actions == [Campaign(BUCKET, succession, won.revision)]
    carry_out(roles[second], actions, keys, roles)
    assert roles[second].serving
    assert keys.read().epoch == record.epoch + 2 and set(keys.read().in_sync) == set(after)


def test_a_new_primary_serves_only_once_every_live_in_sync_copy_is_confirmed():
    roles, keys, old, members = lapsed_primary(range(4))
    record = keys.read()
    winner, kept = sorted(set(record.in_sync) & set(members))
    outsider = next(s for s in members if s not in record.in_sync)
    [campaign] = step(roles[winner], MapRead, record, members, LEASE[winner], True)
    assert keys.transact(campaign)
    role = roles[winner]
    actions = step(role, CampaignAnswered, True, keys.read())
    assert actions == [CommitPrepared(BUCKET), Sync(BUCKET, kept), Sync(BUCKET, outsider)]
    assert role.confirmed == {winner} and not role.serving
    # The outsider caught up and is written into in_sync: the kept copy is still unconfirmed.
    carry_out(role, step(role, SnapshotDelivered, outsider), keys)
    assert set(keys.read().in_sync) == set(members)
    assert role.confirmed == {winner, outsider} and not role.serving
    assert step(role, MapRead, keys.read(), members, LEASE[winner], True) == []  # under way already
    assert not role.serving
    assert step(role, SnapshotDelivered, kept) == []  # in in_sync already: nothing to write
    assert role.confirmed == set(members) and role.serving


def test_a_new_primary_drops_an_in_sync_copy_its_snapshot_cannot_reach_and_serves():
    roles, keys, old, members = lapsed_primary(range(4))
    record = keys.read()
    winner, kept = sorted(set(record.in_sync) & set(members))
    actions = step(roles[winner], MapRead, record, members, LEASE[winner], True)
    carry_out(roles[winner], actions, keys, roles, reachable=lambda s: s != kept)
    assert kept not in keys.read().in_sync and kept not in roles[winner].confirmed
    assert roles[winner].serving  # given up on for now: the others are in sync
    assert step(roles[winner], MapRead, keys.read(), members, LEASE[winner], True) == [
        Sync(BUCKET, kept)
    ]
    carry_out(roles[winner], step(roles[winner], SnapshotDelivered, kept), keys)
    assert kept in keys.read().in_sync and roles[winner].serving


def test_a_candidate_asks_every_sender_to_retry_while_it_campaigns():
    roles, keys, old, members = lapsed_primary()
    record = keys.read()
    candidate = min(members)
    step(roles[candidate], MapRead, record, members, LEASE[candidate], True)
    assert roles[candidate].role is Role.CANDIDATE
    # The old primary's late prepare, in the epoch this side still has, and a newer epoch.
    assert gate(roles[candidate], record.epoch, LEASE[old], old) is Gate.REFRESH
    assert gate(roles[candidate], record.epoch + 1, LEASE[max(members)], max(members)) is (
        Gate.REFRESH
    )
    assert gate(roles[candidate], record.epoch - 1, LEASE[old], old) is Gate.FENCED


def test_a_record_lost_after_one_was_seen_starts_nothing_afresh():
    """etcd came back empty (or another driver cleared the job's keys): no server that saw the
    bucket's record campaigns for a new one, the primary steps down, the bucket waits."""
    roles, keys, primary = established()
    members = live(range(3))
    for s, role in roles.items():
        assert step(role, MapRead, None, members, LEASE[s], True) == []
        assert role.record_lost and not role.serving
    # nor does an older record (a bucket started afresh elsewhere at epoch 1) count
    stale = BucketRecord(1, primary, LEASE[primary], (primary,), revision=1)
    copy = next(s for s in roles if s != primary)
    assert step(roles[copy], MapRead, stale, members, LEASE[copy], True) == []
    assert roles[copy].role is Role.FOLLOWER and roles[copy].record_lost


def test_a_server_that_never_saw_a_record_starts_no_bucket_while_a_member_has_seen_one():
    members = live(range(3))
    first = desired_copies(BUCKET, members, COPIES)[0]
    role = BucketRole(BUCKET, first, COPIES, lease_ttl=TTL)
    assert not role.seen
    assert step(role, MapRead, None, members, LEASE[first], True, blank=False) == []
    assert role.role is Role.FOLLOWER and role.seen  # (its members/<i> says so from now on)


def test_a_server_that_met_a_member_that_saw_a_record_starts_no_bucket_once_that_key_is_gone():
    """A process started after etcd lost its keys learns that the job had started only from the
    members still registered; the key of the one that saw a record can vanish for a while (its
    lease lapsed before it registers again, it is paused, killed, or etcd is wiped again), and the
    bucket it held (its acknowledged updates on that server's memory) is never started afresh."""
    members = live(range(3))
    first = desired_copies(BUCKET, members, COPIES)[0]
    restarted = BucketRole(BUCKET, first, COPIES, lease_ttl=TTL)  # a new process: it saw no record
    assert step(restarted, MapRead, None, members, LEASE[first], True, blank=False) == []
    for alone in (members, {first: LEASE[first]}):  # the other members' keys gone, or all but its
        assert step(restarted, MapRead, None, alone, LEASE[first], True, blank=True) == []
        assert restarted.role is Role.FOLLOWER and not restarted.current


def test_a_map_read_older_than_a_record_the_copy_side_refreshed_is_no_loss():
    """The host reads the map once for every bucket and handles them in turn; meanwhile a newer
    epoch's message made the copy side read a bucket's record again. The map read's older view
    (no record yet, or an older one) is no news, not etcd's lost state; a read after it that
    still misses the record is."""
    members = live(range(3))
    copy = 1
    role = BucketRole(BUCKET, copy, COPIES, lease_ttl=TTL)
    record = BucketRecord(1, 0, LEASE[0], (0, copy), revision=4)
    step(role, RecordRefreshed, record)
    assert role.known_epoch == 1
    assert step(role, MapRead, None, members, LEASE[copy], True) == []  # read before the refresh
    assert not role.record_lost and role.record == record
    step(role, RecordRefreshed, BucketRecord(2, 0, LEASE[0], (0, copy), revision=6))
    assert step(role, MapRead, record, members, LEASE[copy], True) == []  # epoch 1, read before
    assert not role.record_lost and role.record.epoch == 2
    assert step(role, MapRead, None, members, LEASE[copy], True) == []  # read after: lost
    assert role.record_lost and role.role is Role.FOLLOWER
