"""The replicated parameter server's state machines (plugins/ps/failover.py), with no socket.

Every transition of a bucket's role (bootstrap, two candidates racing for a lapsed primary's
bucket, a fenced primary, a primary named by the record that takes its bucket back under the next
epoch, a new primary that serves only once every live in-sync copy has its snapshot, copies
dropped from and added back to ``in_sync``, a bucket handed back to its preferred primary), a
copy's checks (:func:`gate`), the lease clock, rendezvous placement and the validation of records
read back from etcd. A shard's log has its own tests (``tests/unit/test_shard_log.py``).

Where etcd decides (a campaign or an in-sync write is a compare-and-swap on ``sync/<b>``'s
revision), :class:`SyncKeys` stands in with etcd's transaction semantics and nothing else, and
:func:`carry_out` dispatches actions to it the way ``Replication._carry_out`` does. The members
are what ``Replication._observe`` reads: ``{server: its lease}``.
"""

from __future__ import annotations

import pytest
from hogwild_plugins.ps.failover import (
    BucketRecord,
    BucketRole,
    Campaign,
    CommitPrepared,
    Gate,
    HandOver,
    LeaseClock,
    Role,
    Sync,
    WriteInSync,
    desired_copies,
    gate,
)
from hogwild_plugins.ps.shard_log import ShardLog

BUCKET = 5
COPIES = 3
LEASE = {s: 0x7000 + s for s in range(8)}  # each server's etcd session lease
NEW_LEASE = {s: 0x9000 + s for s in range(8)}  # ... once it registered again (restart, lapse)


def live(servers) -> dict[int, int]:
    """The members ``{server: lease}``: every one of ``servers`` under its usual lease."""
    return {s: LEASE[s] for s in servers}


# --------------------------------------------------------------------------- etcd's side


class SyncKeys:
    """The ``sync/<b>`` keys with etcd's transaction semantics: one revision counter that every
    write advances; a campaign for an absent key creates it only if still absent, every other
    write replaces the value only if the key's mod revision is still the one expected."""

    def __init__(self, n_servers: int = 3) -> None:
        self.n_servers = n_servers
        self.revision = 0
        self.values: dict[int, tuple[dict, int]] = {}

    def transact(self, action: Campaign | WriteInSync | HandOver) -> bool:
        current = self.values.get(action.bucket)
        if (current[1] if current else 0) != action.expected:
            return False
        self.revision += 1
        self.values[action.bucket] = (action.record.value(), self.revision)
        return True

    def read(self, bucket: int = BUCKET) -> BucketRecord | None:
        if bucket not in self.values:
            return None
        value, revision = self.values[bucket]
        return BucketRecord.parse(value, revision, self.n_servers, f"sync/{bucket}")


def carry_out(role, actions, keys, roles=None, reachable=lambda s: True) -> list:
    """Carry ``actions`` out as the replication thread does. A snapshot reaches the servers for
    which ``reachable`` is true, and their role in ``roles`` (if given) is restored. Returns
    every action carried out, in order."""
    done, todo = [], list(actions)
    while todo:
        action = todo.pop(0)
        done.append(action)
        if isinstance(action, Campaign):
            won = keys.transact(action)
            record = keys.read(action.bucket)
            todo += role.campaigned(won and record is not None, record)
        elif isinstance(action, WriteInSync):
            ok = keys.transact(action)
            todo += role.written(ok, keys.read(action.bucket))
        elif isinstance(action, HandOver):
            ok = keys.transact(action)
            todo += role.handed(ok, keys.read(action.bucket))
        elif isinstance(action, Sync):
            if not reachable(action.server):
                todo += role.unreachable(action.server)
                continue
            if roles is not None:
                roles[action.server].restored(role.epoch)
            todo += role.synced(action.server)
    return done


def cluster(servers=range(3)) -> dict[int, BucketRole]:
    return {s: BucketRole(BUCKET, s, COPIES) for s in servers}


def observe_all(roles, keys, members) -> None:
    """Every live server reads the map and carries out what its role asks."""
    for s, role in roles.items():
        if members.get(s) == LEASE[s]:
            carry_out(role, role.observe(keys.read(), members, LEASE[s], True), keys, roles)


def established(servers=range(3)) -> tuple[dict[int, BucketRole], SyncKeys, int]:
    """A bucket whose first primary won and caught up every copy; everyone has read the map."""
    keys, roles = SyncKeys(len(servers)), cluster(servers)
    observe_all(roles, keys, live(servers))
    observe_all(roles, keys, live(servers))
    primary = keys.read().primary
    assert roles[primary].serving
    assert set(keys.read().in_sync) == set(desired_copies(BUCKET, live(servers), COPIES))
    return roles, keys, primary


def first_primary(members: dict[int, int], keys: SyncKeys) -> BucketRole:
    """The first desired copy of a new bucket, its campaign accepted by etcd (and not yet
    reported to it: the caller calls ``campaigned``)."""
    first = desired_copies(BUCKET, members, COPIES)[0]
    role = BucketRole(BUCKET, first, COPIES)
    [campaign] = role.observe(None, members, LEASE[first], True)
    assert keys.transact(campaign)
    return role


# --------------------------------------------------------------------------- bootstrap


def test_with_no_record_only_the_first_desired_copy_campaigns_for_a_new_bucket():
    members = live(range(3))
    first = desired_copies(BUCKET, members, COPIES)[0]
    roles = cluster()
    for s, role in roles.items():
        actions = role.observe(None, members, LEASE[s], lease_valid=True, settled=True)
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
        assert role.observe(None, members, LEASE[s], True, settled=False) == []
        assert role.role is Role.FOLLOWER
    assert roles[first].observe(None, members, LEASE[first], True, settled=True) != []


def test_the_first_primary_serves_only_once_every_copy_is_synced_and_written_in_sync():
    keys, members = SyncKeys(), live(range(3))
    role = first_primary(members, keys)
    first = role.me
    others = sorted(set(members) - {first})

    actions = role.campaigned(True, keys.read())
    assert actions == [CommitPrepared(BUCKET)] + [Sync(BUCKET, s) for s in others]
    assert role.role is Role.PRIMARY and not role.serving

    [write] = role.synced(others[0])
    assert write.record.in_sync == (first, others[0]) and write.expected == keys.read().revision
    assert not role.serving
    assert role.synced(others[1]) == []  # a write is under way: this one goes in the next
    assert keys.transact(write)
    [second] = role.written(True, keys.read())
    assert second.record.in_sync == (first, *others)
    assert not role.serving
    assert keys.transact(second)
    assert role.written(True, keys.read()) == []
    assert role.serving
    assert keys.read().in_sync == (first, *others) and keys.read().epoch == 1


def test_two_servers_that_each_think_they_are_first_race_and_one_creates_the_record():
    keys, roles = SyncKeys(), cluster()
    # Each has seen only itself register: each is the first desired copy of its own view.
    campaigns = {s: roles[s].observe(None, live([s]), LEASE[s], True) for s in (0, 1)}
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
    assert role.observe(None, members, LEASE[first], lease_valid=False) == []
    others = {s: lease for s, lease in members.items() if s != first}
    assert role.observe(None, others, LEASE[first], lease_valid=True) == []
    # Its member key still carries the lease it had before it registered again.
    assert role.observe(None, members, NEW_LEASE[first], lease_valid=True) == []
    assert role.role is Role.FOLLOWER


# --------------------------------------------------------------------------- failover


def lapsed_primary(servers=range(3)):
    """An established bucket whose primary's member key just lapsed."""
    roles, keys, primary = established(servers)
    return roles, keys, primary, live(s for s in servers if s != primary)


@pytest.mark.parametrize("first_to_etcd", [0, 1])
def test_two_in_sync_copies_campaign_for_a_lapsed_primary_and_exactly_one_wins(first_to_etcd):
    roles, keys, old, members = lapsed_primary(range(4))
    old_record = keys.read()
    candidates = sorted(set(old_record.in_sync) & set(members))
    assert len(candidates) == 2
    campaigns = {s: roles[s].observe(old_record, members, LEASE[s], True) for s in candidates}
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

    assert roles[loser].campaigned(False, record) == []
    assert roles[loser].role is Role.FOLLOWER and roles[loser].record == record

    actions = roles[winner].campaigned(True, record)
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
    [ca], [cb] = (roles[s].observe(stale, members, LEASE[s], True) for s in (a, b))
    assert keys.transact(ca) and not keys.transact(cb)
    roles[b].campaigned(False, keys.read())
    roles[a].campaigned(True, keys.read())
    # A read that started before the winner's write comes back after it.
    assert roles[b].observe(stale, members, LEASE[b], True) == []
    assert roles[b].role is Role.FOLLOWER and roles[b].record.primary == a


def test_a_copy_not_in_sync_never_campaigns():
    roles, keys, primary = established()
    dropped = next(s for s in roles if s != primary)
    carry_out(roles[primary], roles[primary].unreachable(dropped), keys, roles, lambda s: False)
    assert dropped not in keys.read().in_sync
    members = live(s for s in roles if s != primary)
    for _ in range(3):
        assert roles[dropped].observe(keys.read(), members, LEASE[dropped], True) == []
        assert roles[dropped].role is Role.FOLLOWER


def test_an_in_sync_copy_that_restarted_has_no_state_and_never_campaigns():
    roles, keys, primary, members = lapsed_primary()
    restarted, other = sorted(members)
    reborn = BucketRole(BUCKET, restarted, COPIES)  # a new process: nothing restored yet
    members = {**members, restarted: NEW_LEASE[restarted]}
    assert restarted in keys.read().in_sync
    assert reborn.observe(keys.read(), members, NEW_LEASE[restarted], True) == []
    assert reborn.role is Role.FOLLOWER
    assert isinstance(roles[other].observe(keys.read(), members, LEASE[other], True)[0], Campaign)


def test_an_in_sync_copy_without_a_valid_lease_never_campaigns():
    roles, keys, _old, members = lapsed_primary()
    for s in members:
        assert roles[s].observe(keys.read(), members, LEASE[s], lease_valid=False) == []
        assert roles[s].role is Role.FOLLOWER


def test_copies_do_not_campaign_while_the_primary_is_a_member_under_its_lease():
    roles, keys, primary = established()
    for s, role in roles.items():
        if s != primary:
            assert role.observe(keys.read(), live(roles), LEASE[s], True) == []


def test_a_primary_that_restarted_is_replaced_and_does_not_campaign_itself():
    # Killed and restarted within its lease: its member key is back under a new lease, the
    # record still names it under the old one. Its memory is gone: an in-sync copy takes over.
    roles, keys, primary = established()
    members = {**live(roles), primary: NEW_LEASE[primary]}
    reborn = BucketRole(BUCKET, primary, COPIES)
    assert reborn.observe(keys.read(), members, NEW_LEASE[primary], True) == []
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
            campaigns[s] = roles[s].observe(old, members, LEASE[s], True)
            assert campaigns[s] == [Campaign(BUCKET, new, old.revision)]
    winner = min(campaigns)
    carry_out(roles[winner], campaigns[winner], keys, roles)
    assert roles[winner].serving and reborn.current  # the restarted one got its snapshot
    assert keys.read().primary == winner and set(keys.read().in_sync) == set(roles)
    assert reborn.observe(keys.read(), members, NEW_LEASE[primary], True) == []


# --------------------------------------------------------------------------- a fenced primary


@pytest.mark.parametrize("what", ["newer epoch", "another lease", "lease not valid"])
def test_a_primary_steps_down_at_once_and_asks_for_nothing_more(what):
    keys, members = SyncKeys(), live(range(3))
    role = first_primary(members, keys)
    first = role.me
    other = next(s for s in members if s != first)
    role.campaigned(True, keys.read())
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
    assert role.observe(record, members, lease, valid) == []
    assert role.role is Role.DEPOSED and not role.serving
    assert not (role.syncing or role.writing or role.behind or role.dropping)
    assert role.synced(other) == []  # a late snapshot's answer writes nothing
    assert role.unreachable(other) == []


def test_a_fenced_primary_is_deposed():
    roles, _keys, primary = established()
    assert roles[primary].fenced() == []
    assert roles[primary].role is Role.DEPOSED and not roles[primary].serving
    follower = next(s for s in roles if s != primary)
    assert roles[follower].fenced() == []
    assert roles[follower].role is Role.FOLLOWER


def test_a_deposed_primary_follows_once_the_record_names_another_primary():
    roles, keys, primary = established()
    members = live(roles)
    roles[primary].fenced()
    assert roles[primary].current  # its memory stays current until a newer primary shows
    # The record still names it, but its lease is not valid: it stays deposed, and does not
    # campaign.
    assert roles[primary].observe(keys.read(), members, LEASE[primary], False) == []
    assert roles[primary].role is Role.DEPOSED
    other = next(s for s in roles if s != primary)
    record = keys.read()
    new = BucketRecord(record.epoch + 1, other, LEASE[other], (other,))
    keys.transact(Campaign(BUCKET, new, record.revision))
    assert roles[primary].observe(keys.read(), members, LEASE[primary], True) == []
    assert roles[primary].role is Role.FOLLOWER and roles[primary].record == keys.read()
    # A newer primary: this side may have diverged from it, and takes nothing back unless a
    # snapshot makes it current again, even once that primary is gone.
    assert not roles[primary].current
    without = {s: lease for s, lease in members.items() if s != other}
    assert roles[primary].observe(keys.read(), without, LEASE[primary], True) == []
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
    assert roles[paused].observe(taken, survivors, LEASE[paused], lease_valid=False) == []
    assert roles[paused].role is Role.DEPOSED
    members = {**survivors, paused: NEW_LEASE[paused]}
    assert roles[holder].observe(taken, members, LEASE[holder], True) == [Sync(BUCKET, paused)]
    roles[paused].restored(taken.epoch)  # the snapshot, on the paused side's network thread
    assert roles[paused].observe(taken, members, NEW_LEASE[paused], True) == []
    assert roles[paused].role is Role.FOLLOWER and roles[paused].current
    carry_out(roles[holder], roles[holder].synced(paused), keys, roles)  # now in in_sync
    [hand] = roles[holder].observe(keys.read(), members, LEASE[holder], True)
    carry_out(roles[holder], [hand], keys, roles)
    assert keys.read().primary == paused
    [campaign] = roles[paused].observe(keys.read(), members, NEW_LEASE[paused], True)
    carry_out(roles[paused], [campaign], keys, roles)
    assert roles[paused].serving and keys.read().epoch == taken.epoch + 2


def test_a_deposed_primary_restored_under_an_older_epoch_than_the_map_it_reads_is_not_current():
    # Its snapshot came from a primary that was itself replaced, without it, since: what that
    # newer primary acknowledged is not in its memory.
    roles, keys, paused, survivors = failed_over()
    taken = keys.read()
    roles[paused].observe(taken, survivors, LEASE[paused], lease_valid=False)
    roles[paused].restored(taken.epoch)
    other = next(s for s in survivors if s != taken.primary)
    newer = BucketRecord(taken.epoch + 1, other, LEASE[other], (other,))
    assert keys.transact(Campaign(BUCKET, newer, taken.revision))
    members = {**survivors, paused: NEW_LEASE[paused]}
    assert roles[paused].observe(keys.read(), members, NEW_LEASE[paused], True) == []
    assert roles[paused].role is Role.FOLLOWER and not roles[paused].current


def test_a_snapshot_of_an_older_epoch_than_the_record_already_read_does_not_make_a_copy_current():
    # The gate let the snapshot in under epoch E; while it was applied, this side read the
    # record of epoch E + 1, whose primary may have acknowledged what the snapshot lacks.
    roles, keys, paused, survivors = failed_over()
    taken = keys.read()
    roles[paused].observe(taken, survivors, LEASE[paused], lease_valid=False)
    other = next(s for s in survivors if s != taken.primary)
    newer = BucketRecord(taken.epoch + 1, other, LEASE[other], (other,))
    assert keys.transact(Campaign(BUCKET, newer, taken.revision))
    members = {**survivors, paused: NEW_LEASE[paused]}
    roles[paused].observe(keys.read(), members, NEW_LEASE[paused], True)
    assert not roles[paused].current
    roles[paused].restored(taken.epoch)
    assert not roles[paused].current and roles[paused].restored_epoch == 0


def test_a_deposed_primary_that_reads_the_record_still_naming_it_takes_it_back():
    # Fenced (or stepped down) with nobody else taking over: the record in etcd still names it.
    # Registered again under a new lease, it campaigns for the next epoch under that lease.
    roles, keys, primary = established()
    roles[primary].fenced()
    record = keys.read()
    members = {**live(roles), primary: NEW_LEASE[primary]}
    others = tuple(s for s in record.in_sync if s != primary)
    new = BucketRecord(record.epoch + 1, primary, NEW_LEASE[primary], (primary, *others))
    actions = roles[primary].observe(record, members, NEW_LEASE[primary], True)
    assert actions == [Campaign(BUCKET, new, record.revision)]
    assert roles[primary].role is Role.CANDIDATE


def test_a_replaced_primarys_in_sync_write_fails_and_deposes_it():
    roles, keys, old, members = lapsed_primary()
    winner = min(members)
    actions = roles[winner].observe(keys.read(), members, LEASE[winner], True)
    carry_out(roles[winner], actions, keys, roles)
    assert roles[winner].serving
    # The old primary, back from a pause, has not read the map yet and drops a copy.
    [write] = roles[old].unreachable(max(members))
    assert not keys.transact(write)  # it expected the revision before the campaign
    assert roles[old].written(False, keys.read()) == []
    assert roles[old].role is Role.DEPOSED and roles[old].record.primary == winner
    assert roles[old].observe(keys.read(), live(roles), LEASE[old], True) == []
    assert roles[old].role is Role.FOLLOWER


def test_a_primary_deposed_by_its_own_clock_does_not_strand_the_bucket():
    roles, keys, primary = established()
    members = live(roles)
    before = keys.read()
    # A heartbeat came back late: past ttl * (1 - margin) by this side's clock, within the TTL
    # by etcd's. The primary steps down; the renewal then arrives: same lease, valid again. Its
    # member key never lapsed, so no copy sees a reason to campaign.
    roles[primary].observe(before, members, LEASE[primary], lease_valid=False)
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
            actions = roles[primary].unreachable(copy)
            carry_out(roles[primary], actions, keys, roles, lambda s: False)
    assert keys.read().in_sync == (primary,)
    return roles, keys, primary


def test_the_sole_in_sync_primary_that_lost_its_lease_takes_the_bucket_back_under_a_new_one():
    roles, keys, primary = sole_in_sync_primary()
    before = keys.read()
    copies = [s for s in roles if s != primary]
    lapsed = live(copies)  # its member key lapsed with its lease
    assert roles[primary].observe(before, lapsed, LEASE[primary], lease_valid=False) == []
    assert roles[primary].role is Role.DEPOSED and roles[primary].current
    for s in copies:  # not in sync: they wait for it
        assert roles[s].observe(before, lapsed, LEASE[s], True) == []
    # It registers again under a new lease: the record names it under the old one.
    members = {**lapsed, primary: NEW_LEASE[primary]}
    actions = roles[primary].observe(before, members, NEW_LEASE[primary], True)
    new = BucketRecord(before.epoch + 1, primary, NEW_LEASE[primary], (primary,))
    assert actions == [Campaign(BUCKET, new, before.revision)]
    carry_out(roles[primary], actions, keys, roles)
    after = keys.read()
    assert roles[primary].serving and roles[primary].role is Role.PRIMARY
    assert after.epoch == before.epoch + 1 and after.lease == NEW_LEASE[primary]
    assert set(after.in_sync) == set(roles)  # the copies caught up again
    for s in copies:  # once they read the map, what it sent under the old epoch is fenced
        assert gate(roles[s], after.epoch, NEW_LEASE[primary], primary) is Gate.REFRESH
        assert roles[s].observe(keys.read(), members, LEASE[s], True) == []
        assert gate(roles[s], before.epoch, LEASE[primary], primary) is Gate.FENCED
        assert gate(roles[s], after.epoch, NEW_LEASE[primary], primary) is Gate.ACCEPT
    assert roles[primary].observe(after, members, NEW_LEASE[primary], True) == []
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
            assert role.observe(keys.read(), members, lease, True) == []
            assert role.role is Role.FOLLOWER and not role.serving
    assert keys.read() == before


def test_a_campaign_won_in_etcd_whose_answer_was_lost_is_fought_again_and_won():
    roles, keys, old, members = lapsed_primary()
    stale = keys.read()
    winner, other = sorted(members)
    [campaign] = roles[winner].observe(stale, members, LEASE[winner], True)
    assert keys.transact(campaign)  # etcd took it; the answer never came back
    assert roles[winner].campaigned(False, None) == []
    assert roles[winner].role is Role.FOLLOWER and roles[winner].record == stale
    won = keys.read()
    assert won.epoch == stale.epoch + 1 and won.primary == winner
    # The other in-sync copy sees a live primary: it waits, and asks a newer epoch to refresh.
    assert roles[other].observe(won, members, LEASE[other], True) == []
    assert roles[other].role is Role.FOLLOWER
    # The next read names this side primary, not serving: it campaigns for the next epoch.
    actions = roles[winner].observe(won, members, LEASE[winner], True)
    again = BucketRecord(won.epoch + 1, winner, LEASE[winner], (winner, other))
    assert actions == [Campaign(BUCKET, again, won.revision)]
    carry_out(roles[winner], actions, keys, roles)
    after = keys.read()
    assert roles[winner].serving and after.epoch == stale.epoch + 2 and after.primary == winner
    assert set(after.in_sync) == set(members)
    assert gate(roles[other], after.epoch, LEASE[winner], winner) is Gate.REFRESH
    assert roles[other].observe(after, members, LEASE[other], True) == []
    assert gate(roles[other], after.epoch, LEASE[winner], winner) is Gate.ACCEPT
    assert gate(roles[other], won.epoch, LEASE[winner], winner) is Gate.FENCED


def test_a_first_campaign_won_in_etcd_whose_answer_was_lost_does_not_strand_the_bucket():
    # The bucket's very first record names this server, which never heard it won. Nothing was
    # acknowledged yet: it (or whoever) must still end up serving the bucket.
    keys, members = SyncKeys(), live(range(3))
    role = first_primary(members, keys)
    assert role.campaigned(False, None) == []
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
    [campaign] = roles[first].observe(record, members, LEASE[first], True)
    assert keys.transact(campaign)
    actions = roles[first].campaigned(True, keys.read())
    assert Sync(BUCKET, second) in actions  # and none of the snapshots is sent
    assert roles[first].role is Role.PRIMARY and not roles[first].serving
    won = keys.read()
    assert won.in_sync == (first, second)
    # It dies before any snapshot: it acknowledged nothing.
    after = {s: lease for s, lease in members.items() if s != first}
    assert roles[outsider].observe(won, after, LEASE[outsider], True) == []
    actions = roles[second].observe(won, after, LEASE[second], True)
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
    [campaign] = roles[winner].observe(record, members, LEASE[winner], True)
    assert keys.transact(campaign)
    role = roles[winner]
    actions = role.campaigned(True, keys.read())
    assert actions == [CommitPrepared(BUCKET), Sync(BUCKET, kept), Sync(BUCKET, outsider)]
    assert role.confirmed == {winner} and not role.serving
    # The outsider caught up and is written into in_sync: the kept copy is still unconfirmed.
    carry_out(role, role.synced(outsider), keys)
    assert set(keys.read().in_sync) == set(members)
    assert role.confirmed == {winner, outsider} and not role.serving
    assert role.observe(keys.read(), members, LEASE[winner], True) == []  # under way already
    assert not role.serving
    assert role.synced(kept) == []  # in in_sync already: nothing to write
    assert role.confirmed == set(members) and role.serving


def test_a_new_primary_drops_an_in_sync_copy_its_snapshot_cannot_reach_and_serves():
    roles, keys, old, members = lapsed_primary(range(4))
    record = keys.read()
    winner, kept = sorted(set(record.in_sync) & set(members))
    actions = roles[winner].observe(record, members, LEASE[winner], True)
    carry_out(roles[winner], actions, keys, roles, reachable=lambda s: s != kept)
    assert kept not in keys.read().in_sync and kept not in roles[winner].confirmed
    assert roles[winner].serving  # given up on for now: the others are in sync
    assert roles[winner].observe(keys.read(), members, LEASE[winner], True) == [Sync(BUCKET, kept)]
    carry_out(roles[winner], roles[winner].synced(kept), keys)
    assert kept in keys.read().in_sync and roles[winner].serving


def test_a_candidate_asks_every_sender_to_retry_while_it_campaigns():
    roles, keys, old, members = lapsed_primary()
    record = keys.read()
    candidate = min(members)
    roles[candidate].observe(record, members, LEASE[candidate], True)
    assert roles[candidate].role is Role.CANDIDATE
    # The old primary's late prepare, in the epoch this side still has, and a newer epoch.
    assert gate(roles[candidate], record.epoch, LEASE[old], old) is Gate.REFRESH
    assert gate(roles[candidate], record.epoch + 1, LEASE[max(members)], max(members)) is (
        Gate.REFRESH
    )
    assert gate(roles[candidate], record.epoch - 1, LEASE[old], old) is Gate.FENCED


# --------------------------------------------------------------------------- a copy's gate


RECORD = BucketRecord(epoch=3, primary=1, lease=LEASE[1], in_sync=(1, 2), revision=9)


def follower_of(record: BucketRecord, me: int = 2) -> BucketRole:
    role = BucketRole(BUCKET, me, COPIES)
    role.observe(record, live(range(3)), LEASE[me], True)
    return role


@pytest.mark.parametrize(
    ("epoch", "lease", "sender", "verdict"),
    [
        (3, LEASE[1], 1, Gate.ACCEPT),
        (2, LEASE[1], 1, Gate.FENCED),  # an older epoch
        (3, NEW_LEASE[1], 1, Gate.FENCED),  # another lease
        (3, LEASE[1], 0, Gate.FENCED),  # another sender
        (4, LEASE[0], 0, Gate.REFRESH),  # a newer epoch than this copy knows
    ],
)
def test_a_copy_accepts_only_the_current_primary_of_the_current_epoch(
    epoch, lease, sender, verdict
):
    assert gate(follower_of(RECORD), epoch, lease, sender) is verdict


def test_a_copy_that_never_read_the_record_asks_to_refresh():
    assert gate(BucketRole(BUCKET, 2, COPIES), 1, LEASE[1], 1) is Gate.REFRESH


def test_a_primary_refuses_another_servers_messages_for_its_bucket():
    roles, keys, primary = established()
    record = keys.read()
    other = next(s for s in roles if s != primary)
    assert gate(roles[primary], record.epoch, record.lease, other) is Gate.FENCED


# --------------------------------------------------------------------------- a copy's log


def test_a_copy_that_missed_a_prepare_is_dropped_caught_up_and_taken_back():
    roles, keys, primary = established()
    copy = next(s for s in roles if s != primary)
    log = ShardLog(committed=4)
    assert not log.prepare(6, "u6")  # the copy reports a gap: NEED_SYNC
    [drop] = roles[primary].unreachable(copy)
    assert copy not in drop.record.in_sync
    assert not roles[primary].serving  # until etcd has the copy out of in_sync
    assert keys.transact(drop)
    assert roles[primary].written(True, keys.read()) == [Sync(BUCKET, copy)]
    assert not roles[primary].serving
    log.restore(6, [], epoch=1)  # the snapshot
    [back] = roles[primary].synced(copy)
    assert copy in back.record.in_sync
    assert keys.transact(back) and roles[primary].written(True, keys.read()) == []
    assert roles[primary].serving and copy in keys.read().in_sync
    assert log.prepare(7, "u7")


# --------------------------------------------------------------------------- in_sync changes


def test_a_copy_lost_while_a_write_is_under_way_is_removed_by_the_next_write():
    keys, members = SyncKeys(), live(range(3))
    role = first_primary(members, keys)
    first = role.me
    a, b = sorted(set(members) - {first})
    role.campaigned(True, keys.read())
    [add_a] = role.synced(a)
    assert role.synced(b) == []  # a write is under way: b goes in the next one
    assert keys.transact(add_a)
    [add_b] = role.written(True, keys.read())
    assert add_b.record.in_sync == (first, a, b)
    assert role.unreachable(a) == []  # while b is being added: queued
    assert keys.transact(add_b)
    [drop_a] = role.written(True, keys.read())
    assert drop_a.record.in_sync == (first, b)
    assert keys.transact(drop_a)
    role.written(True, keys.read())
    assert keys.read().in_sync == (first, b)


def test_a_copy_back_while_its_removal_is_written_is_added_again():
    roles, keys, primary = established()
    copy = next(s for s in roles if s != primary)
    role = roles[primary]
    [drop] = role.unreachable(copy)
    assert role.synced(copy) == []  # caught up again while the removal is under way
    carry_out(role, [drop], keys, roles)
    assert role.serving and copy in keys.read().in_sync


def test_an_in_sync_write_that_loses_to_another_deposes_the_primary():
    roles, keys, primary = established()
    copy = next(s for s in roles if s != primary)
    roles[primary].unreachable(copy)
    assert roles[primary].written(False, keys.read()) == []
    assert roles[primary].role is Role.DEPOSED and not roles[primary].serving


def test_a_snapshot_that_fails_is_tried_again_at_the_next_read_of_the_map():
    keys, members = SyncKeys(), live(range(3))
    role = first_primary(members, keys)
    down = max(set(members) - {role.me})
    carry_out(role, role.campaigned(True, keys.read()), keys, reachable=lambda s: s != down)
    assert down not in keys.read().in_sync
    assert role.serving  # given up on for now: the others are in sync
    assert role.observe(keys.read(), members, LEASE[role.me], True) == [Sync(BUCKET, down)]
    assert not role.serving
    carry_out(role, role.synced(down), keys)
    assert down in keys.read().in_sync and role.serving


def test_a_member_going_away_is_written_out_of_in_sync_and_synced_when_it_returns():
    roles, keys, primary = established()
    gone = next(s for s in roles if s != primary)
    role = roles[primary]
    members = live(s for s in roles if s != gone)
    [drop] = role.observe(keys.read(), members, LEASE[primary], True)
    assert isinstance(drop, WriteInSync) and gone not in drop.record.in_sync
    assert not role.serving
    carry_out(role, [drop], keys)
    assert role.serving and gone not in keys.read().in_sync
    assert role.observe(keys.read(), members, LEASE[primary], True) == []  # nothing to sync
    returned = {**members, gone: NEW_LEASE[gone]}  # its key lapsed: it registers anew
    back = role.observe(keys.read(), returned, LEASE[primary], True)
    assert back == [Sync(BUCKET, gone)]


def test_a_copy_that_restarted_is_written_out_of_in_sync_and_synced_again():
    roles, keys, primary = established()
    restarted = next(s for s in roles if s != primary)
    role = roles[primary]
    members = {**live(roles), restarted: NEW_LEASE[restarted]}  # a new process, a new lease
    [drop] = role.observe(keys.read(), members, LEASE[primary], True)
    assert isinstance(drop, WriteInSync) and restarted not in drop.record.in_sync
    assert keys.transact(drop)
    assert role.written(True, keys.read()) == [Sync(BUCKET, restarted)]
    carry_out(role, role.synced(restarted), keys)
    assert restarted in keys.read().in_sync and role.serving
    assert role.observe(keys.read(), members, LEASE[primary], True) == []  # and stays in


def test_a_copy_that_left_while_its_snapshot_was_sent_is_written_out_of_in_sync():
    keys, members = SyncKeys(), live(range(3))
    role = first_primary(members, keys)
    leaving = max(set(members) - {role.me})
    role.campaigned(True, keys.read())
    without = {s: lease for s, lease in members.items() if s != leaving}
    role.observe(keys.read(), without, LEASE[role.me], True)  # its key lapsed meanwhile
    carry_out(role, role.synced(leaving), keys)  # the snapshot had reached it
    carry_out(role, role.observe(keys.read(), without, LEASE[role.me], True), keys)
    assert leaving not in keys.read().in_sync


# --------------------------------------------------------------------------- hand-back


def settle(roles, keys, members, rounds: int = 8) -> int:
    """Every live server (``members``: ``{server: lease}``) reads the map and carries out what
    it asks, until a round in which none asks anything; returns how many rounds asked."""
    for n in range(rounds):
        acted = False
        for s, role in roles.items():
            if s in members:
                actions = role.observe(keys.read(), members, members[s], True)
                acted |= bool(actions)
                carry_out(role, actions, keys, roles)
        if not acted:
            return n
    raise AssertionError(f"the map did not settle in {rounds} rounds")


def failed_over(servers=range(3)):
    """An established bucket whose preferred primary died; the survivors took it over and
    settled. Returns the roles, the keys, the dead server and the survivors' members."""
    roles, keys, preferred = established(servers)
    survivors = live(s for s in servers if s != preferred)
    settle(roles, keys, survivors)
    assert keys.read().primary != preferred
    return roles, keys, preferred, survivors


def test_after_a_failover_the_bucket_goes_to_the_survivors_preferred_primary_and_stays():
    roles, keys, _dead, survivors = failed_over(range(4))
    holder = keys.read().primary
    assert holder == desired_copies(BUCKET, survivors, COPIES)[0] and roles[holder].serving
    record = keys.read()
    assert settle(roles, keys, survivors) == 0 and keys.read() == record


def test_a_primary_hands_the_bucket_back_to_a_returning_preferred_copy_once_it_is_in_sync():
    roles, keys, back, survivors = failed_over()
    holder = keys.read().primary
    roles[back] = BucketRole(BUCKET, back, COPIES)  # a new process: no state
    members = {**survivors, back: NEW_LEASE[back]}
    role = roles[holder]
    # Not in sync yet: caught up first, then written into in_sync; no hand-over meanwhile.
    assert role.observe(keys.read(), members, LEASE[holder], True) == [Sync(BUCKET, back)]
    carry_out(role, [Sync(BUCKET, back)], keys, roles)
    assert back in keys.read().in_sync and role.serving and role.role is Role.PRIMARY
    before = keys.read()
    [hand] = role.observe(before, members, LEASE[holder], True)
    in_sync = (back, *(s for s in before.in_sync if s != back))
    assert hand == HandOver(
        BUCKET, BucketRecord(before.epoch + 1, back, NEW_LEASE[back], in_sync), before.revision
    )
    assert role.role is Role.HANDING and not role.serving  # no acknowledgement from here on
    carry_out(role, [hand], keys, roles)
    assert role.role is Role.FOLLOWER and role.current and role.record == keys.read()
    # The successor, named primary and not serving, takes the bucket under the next epoch.
    [campaign] = roles[back].observe(keys.read(), members, NEW_LEASE[back], True)
    handed = keys.read()
    new = BucketRecord(before.epoch + 2, back, NEW_LEASE[back], in_sync)
    assert campaign == Campaign(BUCKET, new, handed.revision)
    carry_out(roles[back], [campaign], keys, roles)
    assert roles[back].serving and set(keys.read().in_sync) == set(members)
    # The old primary, having read the map, accepts the successor and refuses its own epoch.
    assert role.observe(keys.read(), members, LEASE[holder], True) == []
    assert gate(role, before.epoch + 2, NEW_LEASE[back], back) is Gate.ACCEPT
    assert gate(role, before.epoch, LEASE[holder], holder) is Gate.FENCED
    # No ping-pong: the membership is fixed, so is the preferred primary.
    record = keys.read()
    assert settle(roles, keys, members) == 0 and keys.read() == record


def test_no_hand_back_while_a_campaign_is_open_or_the_primary_confirms_its_copies():
    roles, keys, _old, members = lapsed_primary(range(4))
    record = keys.read()
    preferred, second = desired_copies(BUCKET, members, COPIES)[:2]
    assert {preferred, second} <= set(record.in_sync)
    campaigns = {s: roles[s].observe(record, members, LEASE[s], True) for s in (preferred, second)}
    assert roles[second].observe(record, members, LEASE[second], True) == []  # campaigning
    assert keys.transact(campaigns[second][0])  # the second one wins the race
    assert roles[preferred].campaigned(False, keys.read()) == []
    role = roles[second]
    actions = role.campaigned(True, keys.read())
    assert preferred in keys.read().in_sync and not role.serving
    assert not any(isinstance(a, HandOver) for a in actions)
    assert role.observe(keys.read(), members, LEASE[second], True) == []  # snapshots under way
    carry_out(role, actions[1:], keys, roles, reachable=lambda s: s != preferred)
    assert role.serving and preferred not in keys.read().in_sync  # dropped: no hand-over
    assert role.observe(keys.read(), members, LEASE[second], True) == [Sync(BUCKET, preferred)]
    carry_out(role, role.synced(preferred), keys)
    [hand] = role.observe(keys.read(), members, LEASE[second], True)
    assert hand.record.primary == preferred and hand.record.lease == LEASE[preferred]


def test_a_preferred_copy_that_restarted_since_it_was_caught_up_is_not_handed_the_bucket():
    roles, keys, back, survivors = failed_over()
    holder = keys.read().primary
    members = {**survivors, back: NEW_LEASE[back]}
    roles[back] = BucketRole(BUCKET, back, COPIES)
    carry_out(
        roles[holder], roles[holder].observe(keys.read(), members, LEASE[holder], True), keys, roles
    )
    assert back in keys.read().in_sync
    again = {**members, back: NEW_LEASE[back] + 100}  # restarted once more
    roles[back] = BucketRole(BUCKET, back, COPIES)
    [drop] = roles[holder].observe(keys.read(), again, LEASE[holder], True)
    assert isinstance(drop, WriteInSync) and back not in drop.record.in_sync


def handing(servers=range(3)):
    """A bucket back to its preferred server's copy; the primary's :class:`HandOver` returned
    and not yet carried out."""
    roles, keys, back, survivors = failed_over(servers)
    holder = keys.read().primary
    members = {**survivors, back: LEASE[back]}  # its key lapsed; the same process registered
    roles[back].step_down(None)
    carry_out(
        roles[holder], roles[holder].observe(keys.read(), members, LEASE[holder], True), keys, roles
    )
    [hand] = roles[holder].observe(keys.read(), members, LEASE[holder], True)
    assert isinstance(hand, HandOver) and roles[holder].role is Role.HANDING
    return roles, keys, roles[holder], hand, members


def test_a_hand_over_whose_transaction_loses_deposes_the_primary_and_the_map_decides():
    roles, keys, role, hand, members = handing()
    other = next(s for s in members if s not in (role.me, hand.record.primary))
    # Someone else wrote the record first (here: a campaign by another in-sync copy).
    rival = keys.read()
    taken = BucketRecord(rival.epoch + 1, other, LEASE[other], (other, role.me))
    assert keys.transact(Campaign(BUCKET, taken, rival.revision))
    carry_out(role, [hand], keys)
    assert role.role is Role.DEPOSED and not role.serving and role.record == keys.read()
    assert role.observe(keys.read(), members, LEASE[role.me], True) == []
    assert role.role is Role.FOLLOWER and role.current  # still in in_sync


def test_a_hand_over_whose_answer_was_lost_is_decided_by_the_next_read():
    roles, keys, role, hand, members = handing()
    assert role.handed(False, None) == []  # etcd did not answer: it did not happen
    assert role.role is Role.DEPOSED
    [retake] = role.observe(keys.read(), members, LEASE[role.me], True)  # still named: retake
    assert isinstance(retake, Campaign) and retake.record.primary == role.me
    roles, keys, role, hand, members = handing()
    assert keys.transact(hand)
    assert role.handed(False, None) == []  # it did happen, the answer was lost
    assert role.observe(keys.read(), members, LEASE[role.me], True) == []
    assert role.role is Role.FOLLOWER and role.record.primary == hand.record.primary


def test_a_successor_that_dies_mid_hand_back_is_replaced_by_an_ordinary_failover():
    roles, keys, role, hand, members = handing()
    carry_out(role, [hand], keys)
    successor = hand.record.primary
    after = {s: lease for s, lease in members.items() if s != successor}
    actions = role.observe(keys.read(), after, LEASE[role.me], True)  # before it took over
    assert actions == [
        Campaign(
            BUCKET,
            BucketRecord(
                hand.record.epoch + 1,
                role.me,
                LEASE[role.me],
                (role.me, *(s for s in hand.record.in_sync if s in after and s != role.me)),
            ),
            keys.read().revision,
        )
    ]
    carry_out(role, actions, keys, roles)
    assert role.serving and keys.read().primary == role.me
    record = keys.read()
    assert settle(roles, keys, after) == 0 and keys.read() == record


# --------------------------------------------------------------------------- lease clock


def test_a_lease_is_valid_for_its_ttl_less_the_margin_after_the_grant_was_sent():
    clock = LeaseClock(margin=0.25)
    assert not clock.valid(0.0)
    clock.granted(lease=42, ttl_s=2.0, sent_at=100.0)
    assert clock.lease == 42
    assert clock.valid(100.0) and clock.valid(101.49)
    assert not clock.valid(101.5)


def test_a_renewal_extends_the_lease_from_when_it_was_sent():
    clock = LeaseClock(margin=0.25)
    clock.granted(42, 2.0, sent_at=100.0)
    assert clock.renewed(remaining_s=2.0, sent_at=101.0)
    assert clock.valid(102.49) and not clock.valid(102.5)
    assert clock.renewed(remaining_s=2.0, sent_at=100.5)  # a slower, older answer
    assert clock.valid(102.49)  # does not shorten it


def test_an_expired_lease_stays_lost_until_a_new_one_is_granted():
    clock = LeaseClock()
    clock.granted(42, 2.0, sent_at=0.0)
    assert not clock.renewed(remaining_s=0, sent_at=0.5)
    assert not clock.valid(0.5)
    assert not clock.renewed(remaining_s=2.0, sent_at=0.6)  # too late: it is gone
    assert not clock.valid(0.7)
    clock.granted(43, 2.0, sent_at=1.0)
    assert clock.lease == 43 and clock.valid(1.1)


def test_a_process_paused_past_its_lease_finds_it_invalid_on_waking():
    clock = LeaseClock()
    clock.granted(42, 2.0, sent_at=0.0)
    assert clock.valid(1.0)
    assert not clock.valid(1000.0)


def test_a_renewal_is_due_every_fifth_of_the_ttl():
    clock = LeaseClock()
    clock.granted(42, 2.0, sent_at=0.0)
    assert not clock.renew_due(now=10.3, last_sent=10.0)
    assert clock.renew_due(now=10.4, last_sent=10.0)


# --------------------------------------------------------------------------- placement


def test_desired_copies_are_deterministic_distinct_live_and_copies_long():
    members = live(range(6))
    for bucket in range(200):
        chosen = desired_copies(bucket, members, COPIES)
        assert chosen == desired_copies(bucket, frozenset(members), COPIES)
        assert len(chosen) == COPIES == len(set(chosen)) and set(chosen) <= set(members)
    assert sorted(desired_copies(BUCKET, live([4, 1]), COPIES)) == [1, 4]
    assert desired_copies(BUCKET, {}, COPIES) == []


def test_a_servers_departure_or_return_moves_only_the_buckets_it_holds():
    members = set(range(6))
    for server in members:
        without = members - {server}
        moved = 0
        for bucket in range(300):
            before = desired_copies(bucket, members, COPIES)
            after = desired_copies(bucket, without, COPIES)
            if server in before:
                moved += 1
                assert after[:-1] == [s for s in before if s != server]
                assert after[-1] not in before
            else:
                assert after == before
        assert 0 < moved < 300


def test_every_server_is_the_first_copy_of_some_buckets():
    members = set(range(6))
    firsts = {desired_copies(bucket, members, COPIES)[0] for bucket in range(200)}
    assert firsts == members


# --------------------------------------------------------------------------- records


def test_a_record_reads_back_what_it_wrote():
    record = BucketRecord(epoch=3, primary=1, lease=LEASE[1], in_sync=(1, 0, 2))
    assert BucketRecord.parse(record.value(), 17, 3, "sync/5") == BucketRecord(
        3, 1, LEASE[1], (1, 0, 2), revision=17
    )


def test_the_largest_epoch_a_header_carries_is_read_back():
    value = {"epoch": 2**32 - 1, "primary": 0, "lease": 2**63 - 1, "in_sync": [0]}
    assert BucketRecord.parse(value, 1, 3, "sync/5").epoch == 2**32 - 1


GOOD = {"epoch": 3, "primary": 1, "lease": 99, "in_sync": [1, 2]}


def without(key: str) -> dict:
    return {k: v for k, v in GOOD.items() if k != key}


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("not a mapping", "epoch"),
        (without("epoch"), "epoch"),
        ({**GOOD, "epoch": 0}, "epoch"),
        ({**GOOD, "epoch": True}, "epoch"),
        ({**GOOD, "epoch": 3.0}, "epoch"),
        ({**GOOD, "epoch": 2**32}, "epoch"),  # it travels in a 32-bit header field
        (without("primary"), "primary"),
        ({**GOOD, "primary": 3}, "primary"),
        ({**GOOD, "primary": -1}, "primary"),
        ({**GOOD, "primary": True}, "primary"),
        (without("lease"), "lease"),
        ({**GOOD, "lease": "99"}, "lease"),
        ({**GOOD, "lease": -1}, "lease"),
        (without("in_sync"), "in_sync"),
        ({**GOOD, "in_sync": "1,2"}, "in_sync"),
        ({**GOOD, "in_sync": [1, True]}, "in_sync"),
        ({**GOOD, "in_sync": [1, 2.0]}, "in_sync"),
        ({**GOOD, "in_sync": [1, 3]}, "in_sync"),
        ({**GOOD, "in_sync": [1, -1]}, "in_sync"),
        ({**GOOD, "in_sync": [1, 2, 1]}, "in_sync"),
        ({**GOOD, "in_sync": [0, 2]}, "in_sync"),  # the primary is not among them
        ({**GOOD, "in_sync": []}, "in_sync"),
    ],
)
def test_a_bad_record_is_refused_naming_its_key_and_field(value, field):
    with pytest.raises(ValueError, match=rf"^etcd key sync/5: '{field}'"):
        BucketRecord.parse(value, 1, 3, "etcd key sync/5")
