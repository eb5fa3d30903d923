"""A bucket stopped on a server (plugins/ps/replication/bucket_role.py, copy_side.py), with no
socket: a write this server acknowledged or committed failed to apply, so its memory is not the
bucket's state. A primary hands the bucket to a caught-up in-sync copy (not only the preferred
one), or steps down when it has none; a copy stops being current (it never campaigns) and refuses
its primary's prepares and commits (``NEED_SYNC``: the primary drops it and sends a snapshot)
until snapshots have replaced the shards that failed, which lifts the stop; a primary's
snapshot makes it current only then. Every stimulus is followed by the machine's
``validate_state``.
"""

from __future__ import annotations

from hogwild_plugins.ps.replication.bucket_role import Role
from hogwild_plugins.ps.replication.bucket_role_events import (
    CopyUnreachable,
    HandOver,
    MapRead,
    Restored,
    StopLifted,
    Stopped,
)
from hogwild_plugins.ps.replication.copy_side import CopySide
from hogwild_plugins.ps.replication.copy_side_events import (
    Acknowledge,
    CommitArrived,
    MarkRestored,
    PrepareArrived,
    SnapshotApplied,
    SnapshotArrived,
)
from hogwild_plugins.ps.shard_log import ShardLog

from hogwild.net.wire import ErrorCode
from tests.unit.bucket_role_support import (
    BUCKET,
    LEASE,
    carry_out,
    established,
    live,
    settle,
    step,
)


def test_a_stopped_primary_hands_its_bucket_to_a_caught_up_copy_and_never_takes_it_back():
    roles, keys, primary = established(range(3))
    record = keys.read()
    copies = sorted(s for s in record.in_sync if s != primary)
    [handover] = step(roles[primary], Stopped)
    assert isinstance(handover, HandOver)
    assert handover.record.primary == copies[0] and handover.record.epoch == record.epoch + 1
    assert roles[primary].role is Role.HANDING and not roles[primary].serving
    carry_out(roles[primary], [handover], keys, roles)
    assert roles[primary].role is Role.FOLLOWER and not roles[primary].current
    assert keys.read().primary == copies[0]
    # the stopped server never takes the bucket back while stopped
    assert step(roles[primary], MapRead, keys.read(), live(range(3)), LEASE[primary], True) == []
    # a snapshot of the new primary's that came before the failure was known replaced nothing:
    # restored, it is still not current
    step(roles[primary], Restored, keys.read().epoch)
    assert not roles[primary].current and roles[primary].stopped
    step(roles[primary], StopLifted)  # snapshots replaced every shard that failed
    settle(roles, keys, live(range(3)))
    # the new primary caught it up from its snapshot: current again (and, the bucket's
    # preferred primary, it may be handed the bucket back)
    now = keys.read()
    assert roles[now.primary].serving and primary in now.in_sync
    assert roles[primary].current and not roles[primary].stopped


def test_a_stopped_primary_without_a_caught_up_copy_steps_down_and_does_not_campaign():
    roles, keys, primary = established(range(3))
    roles[primary].confirmed = {primary}  # no copy caught up in this epoch (a new epoch's start)
    assert step(roles[primary], Stopped) == []
    assert roles[primary].role is Role.DEPOSED and not roles[primary].current
    record = keys.read()
    # its record still names it, and it never takes the bucket again while it is stopped
    assert step(roles[primary], MapRead, record, live(range(3)), LEASE[primary], True) == []
    assert not roles[primary].serving and roles[primary].stopped


def test_a_stopped_copy_does_not_campaign_for_a_lapsed_primary():
    roles, keys, primary = established(range(3))
    record = keys.read()
    copy = next(s for s in record.in_sync if s != primary)
    step(roles[copy], Stopped)
    assert roles[copy].role is Role.FOLLOWER and not roles[copy].current
    others = live(s for s in range(3) if s != primary)
    assert step(roles[copy], MapRead, record, others, LEASE[copy], True) == []


def test_a_stopped_copy_refuses_prepares_and_commits_until_a_snapshot_lifts_the_stop():
    roles, keys, primary = established(range(3))
    record = keys.read()
    me = next(s for s in record.in_sync if s != primary)
    shards = (10, 11)
    logs = {s: ShardLog(fence=record.epoch) for s in shards}  # caught up by that primary
    side = CopySide(me, {BUCKET: roles[me]}, logs, {BUCKET: shards})

    def feed(stimulus, *args):
        actions = side.handle(stimulus(*args, stimulus_id="stop-test"))
        side.validate_state()
        roles[me].validate_state()
        return actions

    assert feed(PrepareArrived, shards[0], 1, (7, 1, None), record.epoch) == [Acknowledge(1)]
    step(roles[me], Stopped)
    # the server's stop (its adapter reads it for every message) refuses them at once
    [prepare] = feed(PrepareArrived, shards[0], 2, (7, 2, None), record.epoch, True)
    [commit] = feed(CommitArrived, shards[0], 1, record.epoch, None, True)
    assert prepare.code is commit.code is ErrorCode.NEED_SYNC
    assert "stopped here" in commit.message and side.counters["stopped_refused"] == 2
    assert side.logs[shards[0]].committed == 0  # nothing committed while stopped
    # the primary's snapshot of every shard of the bucket replaces the memory that failed
    for shard in shards:
        feed(SnapshotArrived, shard, 4, record.epoch, ())
    feed(SnapshotApplied, shards[0], BUCKET, 4, record.epoch)
    restored, ack = feed(SnapshotApplied, shards[1], BUCKET, 4, record.epoch)
    assert restored == MarkRestored(BUCKET, record.epoch) and ack == Acknowledge(4)
    step(roles[me], StopLifted)
    step(roles[me], Restored, record.epoch)
    assert roles[me].current and not roles[me].stopped
    assert feed(PrepareArrived, shards[0], 5, (7, 5, None), record.epoch) == [Acknowledge(5)]


def test_a_stopped_primary_hands_over_with_a_copy_still_being_dropped():
    """A copy that failed its snapshot again after it was written out of ``in_sync`` is still
    being dropped when the primary stops: the hand-over leaves that work to the successor (a
    primary's work open while handing is an invalid state)."""
    roles, keys, primary = established(range(3))
    lost, kept = sorted(s for s in keys.read().in_sync if s != primary)
    actions = step(roles[primary], CopyUnreachable, lost)
    carry_out(roles[primary], actions, keys, roles, reachable=lambda s: s != lost)
    assert lost not in keys.read().in_sync and lost in roles[primary].dropping
    [handover] = step(roles[primary], Stopped)  # (step checks the machine's invariants)
    assert isinstance(handover, HandOver) and handover.record.primary == kept
    assert not roles[primary].dropping and roles[primary].role is Role.HANDING
    carry_out(roles[primary], [handover], keys, roles)
    assert keys.read().primary == kept and roles[primary].role is Role.FOLLOWER
