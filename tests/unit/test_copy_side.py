"""A copy's acceptance of PREPARE, COMMIT and SNAPSHOT (plugins/ps/replication/copy_side.py),
with no socket and no thread: the gate (epoch fencing, a refresh of the record), gap detection,
commits, outdated snapshots; every stimulus followed by ``validate_state``, and seeded random
sequences of stimuli checked against the log's promises.
"""

from __future__ import annotations

import copy
import itertools
import random
from types import SimpleNamespace

import pytest
from hogwild_plugins.ps.failover import BucketRecord
from hogwild_plugins.ps.replication.bucket_role import BucketRole
from hogwild_plugins.ps.replication.bucket_role_events import MapRead
from hogwild_plugins.ps.replication.copy_side import CopySide
from hogwild_plugins.ps.replication.copy_side_events import (
    Acknowledge,
    ApplyCommitted,
    ApplySnapshot,
    CatchUpArrived,
    CommitArrived,
    MarkRestored,
    Pass,
    PeerArrived,
    PrepareArrived,
    RefreshRecord,
    Refuse,
    SnapshotApplied,
    SnapshotArrived,
)
from hogwild_plugins.ps.shard_log import ShardLog

from hogwild.net.wire import ErrorCode
from tests.unit.bucket_role_support import BUCKET, COPIES, LEASE, TTL, live, step

ME, PRIMARY, EPOCH = 2, 1, 3
RECORD = BucketRecord(
    epoch=EPOCH, primary=PRIMARY, lease=LEASE[PRIMARY], in_sync=(1, 2), revision=9
)
SHARDS = (10, 11)
_ids = itertools.count()


def copy_side() -> CopySide:
    """This server (``ME``) as a copy of ``BUCKET`` (shards ``SHARDS``), under ``RECORD``, its
    logs caught up by that record's primary (the fence of ``EPOCH``: its catch-up or snapshot
    came first, as a primary's always does)."""
    role = BucketRole(BUCKET, ME, COPIES, lease_ttl=TTL)
    step(role, MapRead, RECORD, live(range(3)), LEASE[ME], True)
    logs = {s: ShardLog(fence=EPOCH) for s in SHARDS}
    return CopySide(ME, {BUCKET: role}, logs, {BUCKET: SHARDS})


def feed(side: CopySide, stimulus, *args) -> list:
    actions = side.handle(stimulus(*args, stimulus_id=f"copy-{next(_ids)}"))
    side.validate_state()
    return actions


def item(version: int, sender: int = 7, seq: int | None = None) -> tuple:
    """A client's update as a copy holds it: ``(sender, seq, work)``."""
    return (sender, version if seq is None else seq, SimpleNamespace(version=version))


def test_the_gate_passes_only_the_current_primary_of_the_current_epoch():
    side = copy_side()
    assert feed(side, PeerArrived, BUCKET, EPOCH, LEASE[PRIMARY], PRIMARY) == [Pass()]
    [old] = feed(side, PeerArrived, BUCKET, EPOCH - 1, LEASE[PRIMARY], PRIMARY)
    [other] = feed(side, PeerArrived, BUCKET, EPOCH, LEASE[0], 0)
    assert old.code is other.code is ErrorCode.FENCED
    assert side.counters["fenced"] == 2


def test_a_newer_epoch_asks_for_the_record_once_then_is_busy():
    side = copy_side()
    assert feed(side, PeerArrived, BUCKET, EPOCH + 1, LEASE[0], 0) == [RefreshRecord(BUCKET)]
    [busy] = feed(side, PeerArrived, BUCKET, EPOCH + 1, LEASE[0], 0, True)
    assert isinstance(busy, Refuse) and busy.code is ErrorCode.BUSY
    assert "epoch 4 from server 0" in busy.message


def test_prepares_are_held_in_order_and_a_gap_asks_for_a_snapshot():
    side = copy_side()
    log = side.logs[SHARDS[0]]
    assert feed(side, PrepareArrived, SHARDS[0], 1, item(1), EPOCH) == [Acknowledge(1)]
    assert feed(side, PrepareArrived, SHARDS[0], 1, item(1), EPOCH) == [Acknowledge(1)]  # a re-send
    [gap] = feed(side, PrepareArrived, SHARDS[0], 3, item(3), EPOCH)
    assert gap.code is ErrorCode.NEED_SYNC and "does not follow 1" in gap.message
    assert [v for v, _ in log.prepared] == [1]
    assert side.counters["prepared"] == 2


def test_a_commit_applies_what_was_prepared_in_order_and_records_the_requests():
    side = copy_side()
    for v in (1, 2, 3):
        feed(side, PrepareArrived, SHARDS[0], v, item(v), EPOCH)
    [beyond] = feed(side, CommitArrived, SHARDS[0], 4, EPOCH)
    assert beyond.code is ErrorCode.NEED_SYNC
    apply, ack = feed(side, CommitArrived, SHARDS[0], 2, EPOCH)
    assert isinstance(apply, ApplyCommitted) and apply.committed == 2
    assert [w.version for w in apply.works] == [1, 2]
    assert ack == Acknowledge(2)
    log = side.logs[SHARDS[0]]
    assert (log.committed, log.epoch, log.last) == (2, EPOCH, 3)
    assert log.seen(7, 2) == 2 and log.seen(7, 3) is None
    assert side.counters["committed"] == 2


def test_a_commit_without_room_for_all_of_it_is_busy_and_commits_nothing():
    side = copy_side()
    for v in (1, 2, 3):
        feed(side, PrepareArrived, SHARDS[0], v, item(v), EPOCH)
    before = copy.deepcopy(side.logs[SHARDS[0]])
    [busy] = feed(side, CommitArrived, SHARDS[0], 3, EPOCH, 2)  # room for two of three
    assert busy.code is ErrorCode.BUSY and "room for 2 of the 3" in busy.message
    assert side.logs[SHARDS[0]] == before and side.counters["no_room"] == 1
    apply, ack = feed(side, CommitArrived, SHARDS[0], 2, EPOCH, 2)  # two fit
    assert [w.version for w in apply.works] == [1, 2] and ack == Acknowledge(2)


def test_a_snapshot_without_room_is_busy_and_leaves_the_log():
    side = copy_side()
    feed(side, PrepareArrived, SHARDS[0], 1, item(1), EPOCH)
    before = copy.deepcopy(side.logs[SHARDS[0]])
    [busy] = feed(side, SnapshotArrived, SHARDS[0], 5, EPOCH + 1, (), False)
    assert busy.code is ErrorCode.BUSY and side.logs[SHARDS[0]] == before


def test_an_outdated_snapshot_of_the_same_primary_is_refused_and_changes_nothing():
    side = copy_side()
    for v in (1, 2):
        feed(side, PrepareArrived, SHARDS[0], v, item(v), EPOCH)
    feed(side, CommitArrived, SHARDS[0], 2, EPOCH)
    before = copy.deepcopy(side.logs[SHARDS[0]])
    [refused] = feed(side, SnapshotArrived, SHARDS[0], 1, EPOCH, ())
    assert refused.code is ErrorCode.NEED_SYNC and side.counters["outdated_snapshots"] == 1
    assert side.logs[SHARDS[0]] == before


def test_a_snapshot_replaces_the_log_and_once_applied_makes_the_bucket_current():
    side = copy_side()
    feed(side, PrepareArrived, SHARDS[0], 1, item(1), EPOCH)
    table = ((7, 40, 5), (8, 2, 4))
    assert feed(side, SnapshotArrived, SHARDS[0], 5, EPOCH + 1, table) == [
        ApplySnapshot(SHARDS[0], 5)
    ]
    log = side.logs[SHARDS[0]]
    assert (log.committed, log.epoch, log.prepared) == (5, EPOCH + 1, [])
    assert log.seen(7, 40) == 5 and log.seen(7, 1) is None
    # one shard of the bucket's two: acknowledged, and the bucket is not current yet
    assert feed(side, SnapshotApplied, SHARDS[0], BUCKET, 5, EPOCH + 1) == [Acknowledge(5)]
    feed(side, SnapshotArrived, SHARDS[1], 0, EPOCH + 1, ())
    assert feed(side, SnapshotApplied, SHARDS[1], BUCKET, 0, EPOCH + 1) == [
        MarkRestored(BUCKET, EPOCH + 1),
        Acknowledge(0),
    ]
    assert side.counters["snapshots_received"] == 2


def test_a_bucket_is_current_only_with_every_shards_snapshot_of_one_primary():
    side = copy_side()
    feed(side, SnapshotArrived, SHARDS[0], 2, EPOCH, ())
    assert feed(side, SnapshotApplied, SHARDS[0], BUCKET, 2, EPOCH) == [Acknowledge(2)]
    feed(side, SnapshotArrived, SHARDS[1], 3, EPOCH + 1, ())
    # the other shard's snapshot comes from a newer primary: the first one's is not its state
    assert feed(side, SnapshotApplied, SHARDS[1], BUCKET, 3, EPOCH + 1) == [Acknowledge(3)]
    feed(side, SnapshotArrived, SHARDS[0], 2, EPOCH + 1, ())
    assert feed(side, SnapshotApplied, SHARDS[0], BUCKET, 2, EPOCH + 1) == [
        MarkRestored(BUCKET, EPOCH + 1),
        Acknowledge(2),
    ]


def test_a_catch_up_of_the_state_this_log_holds_restores_without_a_snapshot():
    """A log at the primary's committed version of the same epoch holds its state: restored by
    the catch-up (its stale prepared updates dropped: their versions are the new primary's to
    give); the bucket is current once every shard is."""
    side = copy_side()
    for v in (1, 2):
        feed(side, PrepareArrived, SHARDS[0], v, item(v), EPOCH)
    feed(side, CommitArrived, SHARDS[0], 1, EPOCH)
    # the primary of EPOCH + 1 committed up to 1 of EPOCH too: version 2 never was
    assert feed(side, CatchUpArrived, SHARDS[0], BUCKET, 1, EPOCH, EPOCH + 1) == [Acknowledge(1)]
    log = side.logs[SHARDS[0]]
    assert (log.committed, log.epoch, log.prepared) == (1, EPOCH, [])
    assert log.seen(7, 1) == 1  # its request table stays
    feed(side, SnapshotArrived, SHARDS[1], 4, EPOCH + 1, ())
    assert feed(side, SnapshotApplied, SHARDS[1], BUCKET, 4, EPOCH + 1) == [
        MarkRestored(BUCKET, EPOCH + 1),
        Acknowledge(4),
    ]
    assert side.counters["caught_up"] == 1 and side.counters["snapshots_received"] == 1


@pytest.mark.parametrize(
    ("version", "log_epoch"),
    [(2, EPOCH), (1, EPOCH - 1), (1, EPOCH + 1), (0, 0)],
    ids=["other-version", "older-epoch", "newer-epoch", "no-primarys-state"],
)
def test_a_catch_up_of_another_state_asks_for_the_snapshot_and_changes_nothing(version, log_epoch):
    side = copy_side()
    if version or log_epoch:
        feed(side, PrepareArrived, SHARDS[0], 1, item(1), EPOCH)
        feed(side, CommitArrived, SHARDS[0], 1, EPOCH)
    feed(side, PrepareArrived, SHARDS[0], side.logs[SHARDS[0]].last + 1, item(9), EPOCH)
    before = copy.deepcopy(side.logs[SHARDS[0]])
    [refused] = feed(side, CatchUpArrived, SHARDS[0], BUCKET, version, log_epoch, EPOCH + 1)
    assert refused.code is ErrorCode.NEED_SYNC
    assert side.logs[SHARDS[0]] == before and side.counters["caught_up"] == 0


@pytest.mark.parametrize(
    ("stopped", "restoring", "code"),
    [(True, False, ErrorCode.NEED_SYNC), (False, True, ErrorCode.BUSY)],
    ids=["stopped", "restoring"],
)
def test_a_catch_up_is_refused_where_the_memory_may_not_hold_what_the_log_does(
    stopped, restoring, code
):
    """A log at the primary's committed state does not make the bucket current where a write
    failed to apply here (stopped: a snapshot must replace the memory) or a snapshot's values
    are still being applied (its log is replaced before they are in)."""
    side = copy_side()
    feed(side, PrepareArrived, SHARDS[0], 1, item(1), EPOCH)
    feed(side, CommitArrived, SHARDS[0], 1, EPOCH)
    before = copy.deepcopy(side.logs[SHARDS[0]])
    [refused] = feed(
        side, CatchUpArrived, SHARDS[0], BUCKET, 1, EPOCH, EPOCH + 1, stopped, restoring
    )
    assert refused.code is code
    assert side.logs[SHARDS[0]] == before and side.counters["caught_up"] == 0


def test_a_catch_up_waits_while_this_servers_own_round_applies_what_its_log_does_not_count():
    """Deposed while its round was applying, this server's memory holds the round's update and
    its log does not yet: holding the new primary's committed state by the log, it would be
    taken as holding it by the memory too, with an update beyond it."""
    side = copy_side()
    feed(side, PrepareArrived, SHARDS[0], 1, item(1), EPOCH)
    feed(side, CommitArrived, SHARDS[0], 1, EPOCH)
    before = copy.deepcopy(side.logs[SHARDS[0]])
    [busy] = feed(side, CatchUpArrived, SHARDS[0], BUCKET, 1, EPOCH, EPOCH + 1, False, False, True)
    assert busy.code is ErrorCode.BUSY and "own round" in busy.message
    assert side.logs[SHARDS[0]] == before and side.counters["catch_up_while_applying"] == 1


def test_a_log_whose_prepared_versions_skip_fails_validation():
    side = copy_side()
    side.logs[SHARDS[0]].prepared = [(2, item(2))]  # committed 0: version 1 is missing
    with pytest.raises(AssertionError, match="do not follow"):
        side.validate_state()


def random_stimulus(rng: random.Random, side: CopySide):
    shard = rng.choice(SHARDS)
    log = side.logs[shard]
    kind = rng.randrange(6)
    if kind == 0:
        epoch = rng.choice((EPOCH - 1, EPOCH, EPOCH + 1))
        sender = rng.choice((PRIMARY, 0))
        return PeerArrived, (BUCKET, epoch, LEASE[sender], sender, rng.random() < 0.5)
    if kind == 1:
        version = log.last + rng.choice((-1, 0, 1, 1, 1, 2))
        epoch = rng.choice((EPOCH - 1, EPOCH, EPOCH, EPOCH + 1))
        return PrepareArrived, (shard, version, item(version, rng.randrange(3)), epoch)
    if kind == 2:
        epoch = rng.choice((EPOCH, EPOCH, EPOCH + 1))
        return CommitArrived, (shard, log.committed + rng.randrange(-1, 4), epoch)
    table = tuple((rng.randrange(3), rng.randrange(50), rng.randrange(20)) for _ in range(3))
    epoch = rng.choice((log.epoch, EPOCH, EPOCH + 1))
    version = max(0, log.committed + rng.randrange(-2, 3))
    if kind == 3:
        return SnapshotArrived, (shard, version, epoch, table)
    if kind == 4:
        return CatchUpArrived, (shard, BUCKET, version, epoch, EPOCH + 1)
    return SnapshotApplied, (shard, BUCKET, version, epoch)


SEEDS = 300


def test_random_sequences_keep_the_logs_promises():
    """Each seed replays one sequence of 40 stimuli (a failing seed names itself)."""
    for seed in range(SEEDS):
        try:
            run_random_sequence(seed)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}: {exc}") from exc


def run_random_sequence(seed: int) -> None:
    rng = random.Random(seed)
    side = copy_side()
    for _ in range(40):
        stimulus, args = random_stimulus(rng, side)
        shard = args[0] if stimulus is not PeerArrived else None
        before = copy.deepcopy(side.logs[shard]) if shard is not None else None
        actions = feed(side, stimulus, *args)
        if shard is None:
            assert len(actions) == 1 and isinstance(actions[0], Pass | RefreshRecord | Refuse)
            continue
        log = side.logs[shard]
        if any(isinstance(a, Refuse) for a in actions):
            assert actions[-1:] == actions[:1] and log == before  # a refusal changes nothing
            continue
        if stimulus is PrepareArrived:
            assert log.last >= args[1] and actions == [Acknowledge(args[1])]
        elif stimulus is CommitArrived:
            assert log.committed >= before.committed and actions[-1] == Acknowledge(log.committed)
        elif stimulus is SnapshotArrived:
            # a snapshot never takes back what this log committed from the same primary
            assert args[2] != before.epoch or args[1] >= before.committed
            assert (log.committed, log.epoch) == args[1:3]
        elif stimulus is CatchUpArrived:
            # accepted only for the state this log holds, which it keeps (its prepared dropped)
            assert (before.committed, before.epoch) == args[2:4] and args[3] > 0
            assert (log.committed, log.epoch, log.prepared) == (*args[2:4], [])
            assert actions[-1] == Acknowledge(args[2])


@pytest.mark.parametrize("late", ["PREPARE", "COMMIT", "SNAPSHOT", "CATCHUP"])
def test_a_deposed_primarys_message_that_passed_the_gate_before_its_successors_is_fenced(late):
    """The gate let the primary of EPOCH's message through; before its content was taken, the
    primary of EPOCH + 1 caught this log up (the replication thread read the new record
    meanwhile). The late content is refused FENCED and changes nothing."""
    side = copy_side()
    feed(side, PrepareArrived, SHARDS[0], 1, item(1), EPOCH)
    feed(side, CommitArrived, SHARDS[0], 1, EPOCH)
    feed(side, PrepareArrived, SHARDS[0], 2, item(2), EPOCH)
    assert feed(side, PeerArrived, BUCKET, EPOCH, LEASE[PRIMARY], PRIMARY) == [Pass()]
    assert feed(side, CatchUpArrived, SHARDS[0], BUCKET, 1, EPOCH, EPOCH + 1) == [Acknowledge(1)]
    before = copy.deepcopy(side.logs[SHARDS[0]])
    stimulus, args = {
        "PREPARE": (PrepareArrived, (SHARDS[0], 2, item(2), EPOCH)),
        "COMMIT": (CommitArrived, (SHARDS[0], 2, EPOCH)),
        "SNAPSHOT": (SnapshotArrived, (SHARDS[0], 3, EPOCH, ())),
        "CATCHUP": (CatchUpArrived, (SHARDS[0], BUCKET, 1, EPOCH, EPOCH)),
    }[late]
    [refused] = feed(side, stimulus, *args)
    assert refused.code is ErrorCode.FENCED and f"epoch {EPOCH} is late" in refused.message
    assert side.logs[SHARDS[0]] == before and before.prepared == []
    # the successor's own prepare of version 2 is held, not taken for the deposed one's
    assert feed(side, PrepareArrived, SHARDS[0], 2, item(2, seq=99), EPOCH + 1) == [Acknowledge(2)]
    assert side.logs[SHARDS[0]].prepared[0][1][1] == 99
