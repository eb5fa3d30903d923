"""A bucket role's elections (plugins/ps/replication/bucket_role.py), with no socket: a new bucket's
first primary, two candidates racing for a lapsed primary's bucket, a fenced or deposed primary, and
a primary named by the record that takes its bucket back under the next epoch (no bucket is
stranded). Every stimulus is followed by the role's ``validate_state``.
"""

from __future__ import annotations

import pytest
from hogwild_plugins.ps.failover import BucketRecord, desired_copies
from hogwild_plugins.ps.replication.bucket_role import (
    BucketRole,
    Campaign,
    CampaignAnswered,
    CommitPrepared,
    CopyUnreachable,
    Fenced,
    InSyncWritten,
    MapRead,
    Restored,
    Role,
    SnapshotDelivered,
    Sync,
    WriteInSync,
)
from hogwild_plugins.ps.replication.copy_side import Gate, gate

from tests.unit.bucket_role_support import (
    BUCKET,
    COPIES,
    LEASE,
    NEW_LEASE,
    SyncKeys,
    carry_out,
    cluster,
    established,
    failed_over,
    first_primary,
    lapsed_primary,
    live,
    observe_all,
    step,
)

# --------------------------------------------------------------------------- bootstrap


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
    role = BucketRole(BUCKET, first, COPIES)
    assert step(role, MapRead, None, members, LEASE[first], lease_valid=False) == []
    others = {s: lease for s, lease in members.items() if s != first}
    assert step(role, MapRead, None, others, LEASE[first], lease_valid=True) == []
    # Its member key still carries the lease it had before it registered again.
    assert step(role, MapRead, None, members, NEW_LEASE[first], lease_valid=True) == []
    assert role.role is Role.FOLLOWER


# --------------------------------------------------------------------------- failover


@pytest.mark.parametrize("first_to_etcd", [0, 1])
def test_two_in_sync_copies_campaign_for_a_lapsed_primary_and_exactly_one_wins(first_to_etcd):
    roles, keys, old, members = lapsed_primary(range(4))
    old_record = keys.read()
    candidates = sorted(set(old_record.in_sync) & set(members))
    assert len(candidates) == 2
    campaigns = {
        s: step(roles[s], MapRead, old_record, members, LEASE[s], True) for s in candidates
    }
    for s, actions in campaigns.items():
        # The other live in-sync copy stays in in_sync: it holds every acknowledged update.
        other = next(c for c in candidates if c != s)
        new = BucketRecord(old_record.epoch + 1, s, LEASE[s], (s, other))
        assert actions == [Campaign(BUCKET, new, expected=old_record.revision)]
        assert roles[s].role is Role.CANDIDATE

    winner = candidates[first_to_etcd]
    loser = candidates[1 - first_to_etcd]
    assert keys.transact(campaigns[winner][0])
    assert not keys.transact(campaigns[loser][0])  # the same expected revision: too late
    record = keys.read()

    assert step(roles[loser], CampaignAnswered, False, record) == []
    assert roles[loser].role is Role.FOLLOWER and roles[loser].record == record

    actions = step(roles[winner], CampaignAnswered, True, record)
    others = set(desired_copies(BUCKET, members, COPIES)) - {winner}
    assert others == set(members) - {winner}  # the loser and a server that held no copy
    assert actions[0] == CommitPrepared(BUCKET)
    assert sorted(actions[1:], key=lambda a: a.server) == [Sync(BUCKET, s) for s in sorted(others)]
    assert roles[winner].role is Role.PRIMARY and not roles[winner].serving

    # The loser takes the winner's snapshot and refuses the old primary's late prepare.
    assert gate(roles[loser], record.epoch, LEASE[winner], winner) is Gate.ACCEPT
    assert gate(roles[loser], old_record.epoch, LEASE[old], old) is Gate.FENCED

    assert record.in_sync == (winner, loser)

    carry_out(roles[winner], actions[1:], keys, roles)
    assert roles[winner].serving
    assert roles[winner].confirmed == set(members)
    assert set(keys.read().in_sync) == set(members)
    assert keys.read().epoch == old_record.epoch + 1


def test_the_candidate_that_lost_follows_even_if_it_then_reads_an_older_map():
    roles, keys, _old, members = lapsed_primary()
    stale = keys.read()
    a, b = sorted(members)
    [ca], [cb] = (step(roles[s], MapRead, stale, members, LEASE[s], True) for s in (a, b))
    assert keys.transact(ca) and not keys.transact(cb)
    step(roles[b], CampaignAnswered, False, keys.read())
    step(roles[a], CampaignAnswered, True, keys.read())
    # A read that started before the winner's write comes back after it.
    assert step(roles[b], MapRead, stale, members, LEASE[b], True) == []
    assert roles[b].role is Role.FOLLOWER and roles[b].record.primary == a


def test_a_copy_not_in_sync_never_campaigns():
    roles, keys, primary = established()
    dropped = next(s for s in roles if s != primary)
    carry_out(
        roles[primary], step(roles[primary], CopyUnreachable, dropped), keys, roles, lambda s: False
    )
    assert dropped not in keys.read().in_sync
    members = live(s for s in roles if s != primary)
    for _ in range(3):
        assert step(roles[dropped], MapRead, keys.read(), members, LEASE[dropped], True) == []
        assert roles[dropped].role is Role.FOLLOWER


def test_an_in_sync_copy_that_restarted_has_no_state_and_never_campaigns():
    roles, keys, primary, members = lapsed_primary()
    restarted, other = sorted(members)
    reborn = BucketRole(BUCKET, restarted, COPIES)  # a new process: nothing restored yet
    members = {**members, restarted: NEW_LEASE[restarted]}
    assert restarted in keys.read().in_sync
    assert step(reborn, MapRead, keys.read(), members, NEW_LEASE[restarted], True) == []
    assert reborn.role is Role.FOLLOWER
    assert isinstance(
        step(roles[other], MapRead, keys.read(), members, LEASE[other], True)[0], Campaign
    )


def test_an_in_sync_copy_without_a_valid_lease_never_campaigns():
    roles, keys, _old, members = lapsed_primary()
    for s in members:
        assert step(roles[s], MapRead, keys.read(), members, LEASE[s], lease_valid=False) == []
        assert roles[s].role is Role.FOLLOWER


def test_copies_do_not_campaign_while_the_primary_is_a_member_under_its_lease():
    roles, keys, primary = established()
    for s, role in roles.items():
        if s != primary:
            assert step(role, MapRead, keys.read(), live(roles), LEASE[s], True) == []


def test_a_primary_that_restarted_is_replaced_and_does_not_campaign_itself():
    # Killed and restarted within its lease: its member key is back under a new lease, the
    # record still names it under the old one. Its memory is gone: an in-sync copy takes over.
    roles, keys, primary = established()
    members = {**live(roles), primary: NEW_LEASE[primary]}
    reborn = BucketRole(BUCKET, primary, COPIES)
    assert step(reborn, MapRead, keys.read(), members, NEW_LEASE[primary], True) == []
    assert reborn.role is Role.FOLLOWER and not reborn.serving
    roles[primary] = reborn
    old = keys.read()
    campaigns = {}
    for s in roles:
        if s != primary:
            # Every live in-sync copy is kept, the restarted one too (it is a member, under its
            # new lease): it does not campaign, and the winner serves only once it has a snapshot.
            others = tuple(c for c in old.in_sync if c != s)
            new = BucketRecord(old.epoch + 1, s, LEASE[s], (s, *others))
            campaigns[s] = step(roles[s], MapRead, old, members, LEASE[s], True)
            assert campaigns[s] == [Campaign(BUCKET, new, old.revision)]
    winner = min(campaigns)
    carry_out(roles[winner], campaigns[winner], keys, roles)
    assert roles[winner].serving and reborn.current  # the restarted one got its snapshot
    assert keys.read().primary == winner and set(keys.read().in_sync) == set(roles)
    assert step(reborn, MapRead, keys.read(), members, NEW_LEASE[primary], True) == []


# --------------------------------------------------------------------------- a fenced primary


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


# --------------------------------------------------------------------------- no stranded bucket


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
    roles[primary] = BucketRole(BUCKET, primary, COPIES)
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
    role = BucketRole(BUCKET, first, COPIES)
    assert step(role, MapRead, None, members, LEASE[first], True, blank=False) == []
    assert [type(a) for a in step(role, MapRead, None, members, LEASE[first], True)] == [Campaign]
