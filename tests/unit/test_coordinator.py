"""The cluster coordinator's epochs, through every rule, without a socket or a process.

Shards that tile each epoch's permutation; every replica starts once all joined; warm start
(replica 0 alone until it trained ``warm_start`` examples, or finished); the epoch rule across
replicas (the stragglers closed once enough finished, replicas that never started skipped); late
answers about an epoch that is over ignored; resume from a later epoch; the end; a replica that
dies (its share handed out again, whole, when it rejoins, or done with nothing once the epoch is
closed; never counted twice, never waited for).
"""

from __future__ import annotations

import pytest

from hogwild.cluster.coordinator import (
    CloseShare,
    Coordinator,
    EpochEnd,
    Finished,
    Joined,
    Lost,
    Progress,
    ShareDone,
    StartShare,
)


def make(replicas=2, **kw) -> Coordinator:
    options = dict(n_train=1000, epochs=2, start_epoch=0, seed=1, lr_of=lambda e: 0.1 / (e + 1))
    return Coordinator(replicas, **{**options, **kw})


def join_all(c: Coordinator) -> list:
    out = []
    for r in range(c.replicas):
        out += c.handle(Joined(r))
    return out


def done(r, epoch, n=500):
    return ShareDone(r, epoch, n, loss=0.5 * n, correct=n // 2)


def test_shards_tile_the_permutation_and_everyone_starts_once_all_joined():
    c = make(replicas=3)
    assert c.handle(Joined(0)) == [] and c.handle(Joined(2)) == []
    starts = c.handle(Joined(1))
    assert [type(i) for i in starts] == [StartShare] * 3
    assert [(s.start, s.stop) for s in starts] == [(0, 333), (333, 667), (667, 1000)]
    assert {s.epoch for s in starts} == {0} and {s.lr for s in starts} == {0.1}
    assert len({s.seed for s in starts}) == 3


def test_an_epoch_ends_when_every_replica_answered_then_advances_and_finishes():
    c = make()
    join_all(c)
    assert c.handle(done(0, 0)) == []
    (end,) = c.handle(done(1, 0, 400))
    assert isinstance(end, EpochEnd)
    assert (end.epoch, end.examples, end.correct) == (0, 900, 450)
    assert end.per_replica == {0: 500, 1: 400}
    nxt = c.advance()
    assert [(s.replica, s.epoch, s.lr) for s in nxt] == [(0, 1, 0.05), (1, 1, 0.05)]
    c.handle(done(0, 1))
    c.handle(done(1, 1))
    assert c.advance() == [Finished()]


def test_warm_start_trains_replica_0_alone_until_its_examples():
    c = make(replicas=3, warm_start=200)
    (only,) = join_all(c)
    assert only.replica == 0
    assert c.handle(Progress(0, 0, 150)) == []
    joined = c.handle(Progress(0, 0, 210))
    assert sorted(s.replica for s in joined) == [1, 2]
    assert c.handle(Progress(0, 0, 300)) == []  # nobody is started twice


def test_warm_start_ends_when_replica_0_finishes_its_shard_first():
    c = make(warm_start=10_000)
    join_all(c)
    out = c.handle(done(0, 0))
    assert [type(i) for i in out] == [StartShare] and out[0].replica == 1


def test_warm_start_applies_only_to_a_fresh_jobs_first_epoch():
    assert len(join_all(make(warm_start=200, start_epoch=1))) == 2  # a resumed job: everyone


def test_the_epoch_rule_closes_the_stragglers_and_skips_who_never_started():
    c = make(replicas=4, fraction=0.5)
    join_all(c)
    assert c.handle(done(1, 0)) == []
    out = c.handle(done(3, 0))
    assert out == [CloseShare(0, 0), CloseShare(2, 0)]
    assert c.handle(done(0, 0, 100)) == []
    (end,) = c.handle(done(2, 0, 80))
    assert end.examples == 500 + 500 + 100 + 80
    warm = make(replicas=3, fraction=0.3, warm_start=10_000)  # 1 finished shard closes it
    join_all(warm)
    out = warm.handle(done(0, 0))  # replicas 1 and 2 never started: nothing to wait for
    assert [type(i) for i in out] == [EpochEnd]


def test_late_and_duplicate_answers_change_nothing():
    c = make()
    join_all(c)
    c.handle(done(0, 0))
    assert c.handle(done(0, 0)) == []  # twice
    c.handle(done(1, 0))
    c.advance()
    assert c.handle(done(0, 0)) == [] and c.handle(Progress(1, 0, 999)) == []  # epoch 0 is over
    assert c.state_of(0) == "training"
    with pytest.raises(TypeError):
        c.handle(object())


def test_resume_starts_at_the_checkpointed_epoch():
    c = make(start_epoch=1)
    starts = join_all(c)
    assert {s.epoch for s in starts} == {1}
    c.handle(done(0, 1))
    c.handle(done(1, 1))
    assert c.advance() == [Finished()]


def test_a_dead_replicas_share_is_handed_out_again_whole_when_it_rejoins():
    c = make()
    join_all(c)
    c.handle(Progress(1, 0, 300))
    assert c.handle(Lost(1)) == [] and c.state_of(1) == "waiting"
    assert c.handle(done(0, 0)) == []  # fraction 1: the epoch waits for replica 1's shard
    (again,) = c.handle(Joined(1))
    assert (again.replica, again.epoch, again.start, again.stop) == (1, 0, 500, 1000)
    c.handle(Progress(1, 0, 100))
    (end,) = c.handle(done(1, 0, 500))
    assert end.examples == 1000 and end.per_replica == {0: 500, 1: 500}  # not 300 + 500


def test_a_replica_dead_after_the_epoch_closed_counts_as_done_with_nothing():
    c = make(replicas=3, fraction=0.5)
    join_all(c)
    c.handle(done(0, 0))
    assert c.handle(done(1, 0)) == [CloseShare(2, 0)]
    c.handle(Progress(2, 0, 40))
    (end,) = c.handle(Lost(2))  # the answer it owed will not come: the epoch ends
    assert isinstance(end, EpochEnd) and end.examples == 1000 and end.per_replica[2] == 0
    assert [s.replica for s in c.advance()] == [0, 1]  # replica 2 is not back yet
    (late,) = c.handle(Joined(2))
    assert (late.replica, late.epoch) == (2, 1)


def test_a_replica_still_away_when_the_epoch_closes_is_skipped():
    c = make(replicas=3, fraction=0.5)
    join_all(c)
    c.handle(Lost(2))
    c.handle(done(0, 0))
    (end,) = c.handle(done(1, 0))
    assert isinstance(end, EpochEnd) and end.per_replica == {0: 500, 1: 500, 2: 0}
    assert c.handle(Joined(2)) == []  # nothing until the next epoch begins


def test_a_warm_start_ends_when_replica_0_dies():
    c = make(replicas=3, warm_start=10_000)
    join_all(c)
    out = c.handle(Lost(0))
    assert sorted(s.replica for s in out) == [1, 2]
    (again,) = c.handle(Joined(0))
    assert again.replica == 0 and again.start == 0


def test_remaining_counts_down_a_share_and_the_warm_start_and_is_zero_once_closed():
    c = make(warm_start=100)
    join_all(c)  # replica 0 trains alone: its next event is the warm start's end
    assert c.remaining(0) == 100 and c.remaining(1) is None  # replica 1 trains nothing yet
    c.handle(Progress(0, 0, 60))
    assert c.remaining(0) == 40
    c.handle(Progress(0, 0, 120))  # past the warm start: replica 1 starts
    assert c.remaining(0) == 500 - 120 and c.remaining(1) == 500
    c = make(fraction=0.5)
    join_all(c)
    c.handle(done(0, 0))
    assert c.remaining(0) is None  # done: nothing to train
    assert c.remaining(1) == 0  # closed: it stops at its next chunk
