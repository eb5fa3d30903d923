"""A primary's hand-over (plugins/ps/replication/bucket_role_hand_over.py), with no socket: a
bucket handed back to its preferred primary once that copy is caught up (and its reads open, the
record marked so the successor need not wait), no hand-back while a campaign or a catch-up is
open, a hand-over lost or unanswered decided by the next read, a successor that dies mid-way
replaced by an ordinary failover. Every stimulus is followed by the role's ``validate_state``.
"""

from __future__ import annotations

from hogwild_plugins.ps.failover import BucketRecord, desired_copies
from hogwild_plugins.ps.replication.bucket_role import BucketRole, Role
from hogwild_plugins.ps.replication.bucket_role_events import (
    Campaign,
    CampaignAnswered,
    HandOver,
    HandOverAnswered,
    MapRead,
    SnapshotDelivered,
    StepDown,
    Sync,
    WriteInSync,
)
from hogwild_plugins.ps.replication.copy_side import Gate, gate

from tests.unit.bucket_role_support import (
    BUCKET,
    COPIES,
    LEASE,
    NEW_LEASE,
    TTL,
    carry_out,
    failed_over,
    lapsed_primary,
    settle,
    step,
)

# --------------------------------------------------------------------------- hand-back


def test_after_a_failover_the_bucket_goes_to_the_survivors_preferred_primary_and_stays():
    roles, keys, _dead, survivors = failed_over(range(4))
    holder = keys.read().primary
    assert holder == desired_copies(BUCKET, survivors, COPIES)[0] and roles[holder].serving
    record = keys.read()
    assert settle(roles, keys, survivors) == 0 and keys.read() == record


def test_a_primary_hands_the_bucket_back_to_a_returning_preferred_copy_once_it_is_in_sync():
    roles, keys, back, survivors = failed_over()
    holder = keys.read().primary
    roles[back] = BucketRole(BUCKET, back, COPIES, lease_ttl=TTL)  # a new process: no state
    members = {**survivors, back: NEW_LEASE[back]}
    role = roles[holder]
    # Not in sync yet: caught up first, then written into in_sync; no hand-over meanwhile.
    assert step(role, MapRead, keys.read(), members, LEASE[holder], True) == [Sync(BUCKET, back)]
    carry_out(role, [Sync(BUCKET, back)], keys, roles)
    assert back in keys.read().in_sync and role.serving and role.role is Role.PRIMARY
    before = keys.read()
    [hand] = step(role, MapRead, before, members, LEASE[holder], True)
    in_sync = (back, *(s for s in before.in_sync if s != back))
    assert hand == HandOver(
        BUCKET, BucketRecord(before.epoch + 1, back, NEW_LEASE[back], in_sync), before.revision
    )
    assert role.role is Role.HANDING and not role.serving  # no acknowledgement from here on
    carry_out(role, [hand], keys, roles)
    assert role.role is Role.FOLLOWER and role.current and role.record == keys.read()
    # The successor, named primary and not serving, takes the bucket under the next epoch.
    [campaign] = step(roles[back], MapRead, keys.read(), members, NEW_LEASE[back], True)
    handed = keys.read()
    new = BucketRecord(before.epoch + 2, back, NEW_LEASE[back], in_sync)
    assert campaign == Campaign(BUCKET, new, handed.revision)
    carry_out(roles[back], [campaign], keys, roles)
    assert roles[back].serving and set(keys.read().in_sync) == set(members)
    # The old primary, having read the map, accepts the successor and refuses its own epoch.
    assert step(role, MapRead, keys.read(), members, LEASE[holder], True) == []
    assert gate(role, before.epoch + 2, NEW_LEASE[back], back) is Gate.ACCEPT
    assert gate(role, before.epoch, LEASE[holder], holder) is Gate.FENCED
    # No ping-pong: the membership is fixed, so is the preferred primary.
    record = keys.read()
    assert settle(roles, keys, members) == 0 and keys.read() == record


def test_a_hand_back_waits_for_its_own_reads_and_marks_the_record_so_the_successor_need_not():
    """Told the time of its map read, a primary hands back only once its own reads are open,
    in a record marked ``handed``; the successor's reads then open as its campaign comes back
    (the one server that answered reads stopped before it wrote the record). A record handed
    unmarked (the host told no time) makes the successor wait ``lease_ttl``."""
    for at in (None, 0.0):
        roles, keys, back, survivors = failed_over()
        holder = keys.read().primary
        role = roles[holder]
        role.reads.opens_at = 5.0  # as if it had taken the bucket after a revocation, at 5 - TTL
        roles[back] = BucketRole(BUCKET, back, COPIES, lease_ttl=TTL)  # a new process
        members = {**survivors, back: NEW_LEASE[back]}
        carry_out(role, step(role, MapRead, keys.read(), members, LEASE[holder], True), keys, roles)
        assert back in keys.read().in_sync and role.serving
        if at is not None:  # its reads still wait: no hand-over yet
            assert step(role, MapRead, keys.read(), members, LEASE[holder], True, at=4.0) == []
            at = 5.0
        [hand] = step(role, MapRead, keys.read(), members, LEASE[holder], True, at=at)
        assert isinstance(hand, HandOver) and hand.record.handed is (at is not None)
        carry_out(role, [hand], keys, roles)
        assert keys.read().handed is (at is not None)
        [campaign] = step(roles[back], MapRead, keys.read(), members, NEW_LEASE[back], True)
        assert keys.transact(campaign) and not keys.read().handed  # (only the handed record)
        actions = step(roles[back], CampaignAnswered, True, keys.read(), 50.0)
        carry_out(roles[back], actions, keys, roles)
        assert roles[back].serving
        assert roles[back].reads_open(50.0) is (at is not None)
        assert roles[back].reads_open(50.0 + TTL)


def test_no_hand_back_while_a_campaign_is_open_or_the_primary_confirms_its_copies():
    roles, keys, _old, members = lapsed_primary(range(4))
    record = keys.read()
    preferred, second = desired_copies(BUCKET, members, COPIES)[:2]
    assert {preferred, second} <= set(record.in_sync)
    campaigns = {
        s: step(roles[s], MapRead, record, members, LEASE[s], True) for s in (preferred, second)
    }
    assert step(roles[second], MapRead, record, members, LEASE[second], True) == []  # campaigning
    assert keys.transact(campaigns[second][0])  # the second one wins the race
    assert step(roles[preferred], CampaignAnswered, False, keys.read()) == []
    role = roles[second]
    actions = step(role, CampaignAnswered, True, keys.read())
    assert preferred in keys.read().in_sync and not role.serving
    assert not any(isinstance(a, HandOver) for a in actions)
    assert (
        step(role, MapRead, keys.read(), members, LEASE[second], True) == []
    )  # snapshots under way
    carry_out(role, actions[1:], keys, roles, reachable=lambda s: s != preferred)
    assert role.serving and preferred not in keys.read().in_sync  # dropped: no hand-over
    assert step(role, MapRead, keys.read(), members, LEASE[second], True) == [
        Sync(BUCKET, preferred)
    ]
    carry_out(role, step(role, SnapshotDelivered, preferred), keys)
    [hand] = step(role, MapRead, keys.read(), members, LEASE[second], True)
    assert hand.record.primary == preferred and hand.record.lease == LEASE[preferred]


def test_a_preferred_copy_that_restarted_since_it_was_caught_up_is_not_handed_the_bucket():
    roles, keys, back, survivors = failed_over()
    holder = keys.read().primary
    members = {**survivors, back: NEW_LEASE[back]}
    roles[back] = BucketRole(BUCKET, back, COPIES, lease_ttl=TTL)
    carry_out(
        roles[holder],
        step(roles[holder], MapRead, keys.read(), members, LEASE[holder], True),
        keys,
        roles,
    )
    assert back in keys.read().in_sync
    again = {**members, back: NEW_LEASE[back] + 100}  # restarted once more
    roles[back] = BucketRole(BUCKET, back, COPIES, lease_ttl=TTL)
    [drop] = step(roles[holder], MapRead, keys.read(), again, LEASE[holder], True)
    assert isinstance(drop, WriteInSync) and back not in drop.record.in_sync


def handing(servers=range(3)):
    """A bucket back to its preferred server's copy; the primary's :class:`HandOver` returned
    and not yet carried out."""
    roles, keys, back, survivors = failed_over(servers)
    holder = keys.read().primary
    members = {**survivors, back: LEASE[back]}  # its key lapsed; the same process registered
    step(roles[back], StepDown, None)
    carry_out(
        roles[holder],
        step(roles[holder], MapRead, keys.read(), members, LEASE[holder], True),
        keys,
        roles,
    )
    [hand] = step(roles[holder], MapRead, keys.read(), members, LEASE[holder], True)
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
    assert step(role, MapRead, keys.read(), members, LEASE[role.me], True) == []
    assert role.role is Role.FOLLOWER and role.current  # still in in_sync


def test_a_hand_over_whose_answer_was_lost_is_decided_by_the_next_read():
    roles, keys, role, hand, members = handing()
    assert step(role, HandOverAnswered, False, None) == []  # etcd did not answer: it did not happen
    assert role.role is Role.DEPOSED
    [retake] = step(
        role, MapRead, keys.read(), members, LEASE[role.me], True
    )  # still named: retake
    assert isinstance(retake, Campaign) and retake.record.primary == role.me
    roles, keys, role, hand, members = handing()
    assert keys.transact(hand)
    assert step(role, HandOverAnswered, False, None) == []  # it did happen, the answer was lost
    assert step(role, MapRead, keys.read(), members, LEASE[role.me], True) == []
    assert role.role is Role.FOLLOWER and role.record.primary == hand.record.primary


def test_a_successor_that_dies_mid_hand_back_is_replaced_by_an_ordinary_failover():
    roles, keys, role, hand, members = handing()
    carry_out(role, [hand], keys)
    successor = hand.record.primary
    after = {s: lease for s, lease in members.items() if s != successor}
    actions = step(role, MapRead, keys.read(), after, LEASE[role.me], True)  # before it took over
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


def test_a_bucket_without_shards_handed_to_a_copy_no_snapshot_reached_is_taken():
    """A bucket that holds no shard (more buckets than shards): catching a copy up sends it
    nothing (there is no shard to address), so no ``Restored`` reaches it. It holds the bucket's
    whole state all the same, none, and once handed the bucket it takes it."""
    roles, keys, back, survivors = failed_over()
    holder = keys.read().primary
    roles[back] = BucketRole(BUCKET, back, COPIES, empty=True, lease_ttl=TTL)  # a new process
    members = {**survivors, back: NEW_LEASE[back]}
    role = roles[holder]
    assert step(role, MapRead, keys.read(), members, LEASE[holder], True) == [Sync(BUCKET, back)]
    carry_out(role, [Sync(BUCKET, back)], keys)  # delivered: nothing was sent to the copy
    [hand] = step(role, MapRead, keys.read(), members, LEASE[holder], True)
    assert isinstance(hand, HandOver) and hand.record.primary == back
    carry_out(role, [hand], keys)
    [campaign] = step(roles[back], MapRead, keys.read(), members, NEW_LEASE[back], True)
    carry_out(roles[back], [campaign], keys, roles)
    assert roles[back].role is Role.PRIMARY and roles[back].serving


def test_a_hand_over_answered_with_another_historys_record_is_the_records_loss():
    """etcd lost the job's keys and the bucket was started afresh elsewhere before the hand-over
    was answered: the handing primary never follows that record, it is deposed for good."""
    roles, keys, role, hand, members = handing()
    before = role.record
    other = next(s for s in members if s not in (role.me, hand.record.primary))
    fresh = BucketRecord(epoch=1, primary=other, lease=LEASE[other], in_sync=(other,), revision=2)
    assert step(role, HandOverAnswered, True, fresh) == []
    assert role.role is Role.DEPOSED and role.record_lost and not role.serving
    assert role.record == before
