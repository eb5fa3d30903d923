"""Sandblaster's portion scheduler (plugins/ps/sandblaster/portions.py), with no replica and no I/O.

Data affinity (contiguous stripes, halves stolen from the back), pushes every few portions and at
the end, backup copies of outstanding portions with the first result kept and the others
discarded and counted, the coordinator's folds of each replica's vector (no push while one is
pending; a vector left holding part of a push zeroed, never added), and replicas that leave.
"""

from __future__ import annotations

import pytest
from hogwild_plugins.ps.sandblaster.portions import (
    WAIT,
    Compute,
    Fetch,
    Fold,
    Phase,
    PortionScheduler,
    Push,
    SchedulerError,
)


def started(replicas=(0, 1), n_portions=8, batch=1, **kw) -> PortionScheduler:
    """A scheduler with ``replicas`` joined (their vectors zeroed), ``batch`` begun, every
    replica fetched."""
    s = PortionScheduler(**kw)
    for r in replicas:
        s.join(r)
    assert s.folds == [Fold(r) for r in replicas]  # zero each vector before it is pushed into
    fold_all(s)
    s.begin(batch, n_portions)
    for r in replicas:
        assert s.request(r) == Fetch(batch)
        s.fetched(r, batch)
    return s


def fold_all(s: PortionScheduler) -> list[Fold]:
    """The coordinator folds every pending vector."""
    folds = s.folds
    for fold in folds:
        s.folded(fold)
    return folds


def compute(s: PortionScheduler, r: int, loss: float = 1.0) -> tuple[int, bool]:
    """``r`` asks, must be given a portion, and finishes it: (portion, accepted)."""
    task = s.request(r)
    assert isinstance(task, Compute), task
    return task.portion, s.finished(r, task.batch, task.portion, loss)


def push(s: PortionScheduler, r: int) -> tuple[int, ...]:
    """``r`` pushes, reports it, and the coordinator folds it."""
    task = s.request(r)
    assert isinstance(task, Push), task
    s.pushed(r, task.batch, task.portions)
    assert Fold(r, task.portions) in s.folds
    fold_all(s)
    return task.portions


def test_one_replica_takes_every_portion_in_order_and_pushes_every_few():
    s = started(replicas=(7,), n_portions=7, push_every=3)
    order, pushes = [], []
    while not s.complete:
        task = s.request(7)
        if isinstance(task, Compute):
            assert not task.backup
            order.append(task.portion)
            assert s.finished(7, 1, task.portion, loss=float(task.portion))
        else:
            assert isinstance(task, Push)
            pushes.append(task.portions)
            s.pushed(7, 1, task.portions)
            assert not s.complete  # not before its fold
            assert fold_all(s) == [Fold(7, task.portions)]
    assert order == list(range(7))
    assert pushes == [(0, 1, 2), (3, 4, 5), (6,)]  # every 3, and what is left at the end
    assert s.loss == sum(range(7)) and s.phase == Phase.DONE
    assert s.request(7) == WAIT
    assert s.stats.backups == s.stats.duplicates == 0


def test_affinity_stripes_are_contiguous_and_a_free_replica_steals_the_back_half():
    s = started(replicas=(0, 1), n_portions=8, push_every=100)
    assert [compute(s, 0)[0], compute(s, 1)[0]] == [0, 4]  # stripes 0..3 and 4..7
    assert [compute(s, 0)[0] for _ in range(3)] == [1, 2, 3]  # replica 0 keeps its run
    # replica 0's stripe is empty; replica 1 has 5, 6, 7 left: 0 takes the back half (6, 7)
    assert [compute(s, 0)[0], compute(s, 0)[0]] == [6, 7]
    assert compute(s, 1)[0] == 5  # replica 1 still goes on from where it was
    assert s.done_by() == {0: 6, 1: 2}


def test_backup_copies_near_the_end_first_result_wins_the_other_is_counted():
    s = started(replicas=(0, 1, 2), n_portions=3, push_every=1, max_copies=2)
    slow = s.request(2)  # replica 2 takes portion 2 and is slow
    assert slow == Compute(1, 2, backup=False)
    for r in (0, 1):
        assert compute(s, r) == (r, True)
        assert push(s, r) == (r,)
    backup = s.request(0)  # nothing unassigned is left: a backup copy of the outstanding one
    assert backup == Compute(1, 2, backup=True)
    assert s.request(1) == WAIT  # max_copies = 2 copies of portion 2 run already
    assert s.finished(0, 1, 2, loss=5.0)  # the backup finishes first: kept
    assert push(s, 0) == (2,)
    assert s.complete and s.loss == 1.0 + 1.0 + 5.0
    assert not s.finished(2, 1, 2, loss=99.0)  # the original arrives late: discarded
    assert s.stats.backups == 1 and s.stats.duplicates == 1 and s.loss == 7.0


def test_a_replica_is_never_given_a_backup_of_its_own_portion_and_late_results_are_stale():
    s = started(replicas=(0,), n_portions=1)
    assert s.request(0) == Compute(1, 0, backup=False)
    with pytest.raises(SchedulerError, match="asked for work while it holds"):
        s.request(0)
    assert s.finished(0, 1, 0, 1.0)
    push(s, 0)
    s.begin(2, 1)
    assert not s.finished(0, 1, 0, 1.0)  # a result of batch 1 during batch 2
    assert s.stats.stale == 1


def test_no_push_while_a_fold_is_pending_and_a_partial_push_is_zeroed_not_added():
    s = started(replicas=(0, 1), n_portions=8, push_every=1)
    assert compute(s, 0) == (0, True)
    assert s.request(0) == Push(1, (0,))
    s.pushed(0, 1, (0,))
    assert s.folds == [Fold(0, (0,))]
    assert compute(s, 0) == (1, True)  # computes on while its push waits to be folded
    assert s.request(0) == Compute(1, 2)  # but is not told to push into its vector again
    assert s.finished(0, 1, 2, 1.0)
    fold_all(s)
    assert s.request(0) == Push(1, (1, 2))
    assert compute(s, 1) == (4, True)
    assert s.request(1) == Push(1, (4,))
    s.pushed(0, 1, (1, 2))  # replica 0's push is complete; replica 1 dies during its own
    assert s.leave(1) == [4]  # lost: computed again
    assert s.folds == [Fold(0, (1, 2)), Fold(1)]  # replica 1's vector: zeroed, not added
    assert s.leave(0) == []  # nothing outstanding: its reported push is still folded
    assert s.folds == [Fold(0, (1, 2)), Fold(1)]
    fold_all(s)
    assert s.outstanding == [3, 4, 5, 6, 7] and s.loss == 3.0
    s.join(1)  # the same number again: its vector is zeroed first, then it may push
    assert s.folds == [Fold(1)]
    with pytest.raises(SchedulerError, match="is not pending"):
        s.folded(Fold(1, (4,)))


def test_a_replica_fetches_on_its_first_request_of_each_batch_even_if_it_joins_late():
    s = PortionScheduler()
    s.join(0)
    assert s.request(0) == WAIT  # no batch yet
    s.begin(1, 2)
    assert s.phase == Phase.RUN and s.request(0) == Fetch(1)
    s.fetched(0, 1)
    assert s.request(0) == Compute(1, 0)
    s.join(1)  # mid-batch: fetches and takes part
    assert s.request(1) == Fetch(1)
    s.fetched(1, 1)
    assert s.request(1) == Compute(1, 1)


def test_a_replica_that_leaves_loses_only_its_outstanding_portions():
    s = started(replicas=(0, 1), n_portions=8, push_every=2)
    assert [compute(s, 1)[0] for _ in range(2)] == [4, 5]
    assert push(s, 1) == (4, 5)  # pushed: safe on the shards
    assert compute(s, 1) == (6, True)  # accepted, not pushed
    assert s.request(1) == Compute(1, 7)  # running
    assert s.leave(1) == [6, 7]
    assert s.stats.lost == 2
    got = []
    while not s.complete:
        task = s.request(0)
        if isinstance(task, Compute):
            got.append(task.portion)
            s.finished(0, 1, task.portion, 1.0)
        else:
            s.pushed(0, 1, task.portions)
            fold_all(s)
    assert got == [0, 1, 2, 3, 6, 7]  # its own stripe, then the lost ones, in order
    assert s.loss == 8.0
    assert not s.finished(1, 1, 7, 1.0)  # the departed replica's late result: stale
    with pytest.raises(SchedulerError, match="has not joined"):
        s.request(1)


def test_a_backup_keeps_a_portion_alive_when_its_first_runner_leaves():
    s = started(replicas=(0, 1), n_portions=2, push_every=1)
    assert s.request(1) == Compute(1, 1)
    assert compute(s, 0) == (0, True)
    push(s, 0)
    assert s.request(0) == Compute(1, 1, backup=True)
    assert s.leave(1) == []  # portion 1 still runs on replica 0
    assert s.finished(0, 1, 1, 1.0)
    push(s, 0)
    assert s.complete and s.stats.lost == 0


def test_reports_that_break_the_protocol_are_refused():
    s = started(replicas=(0,), n_portions=2)
    with pytest.raises(SchedulerError, match="was given None"):
        s.finished(0, 1, 1, 1.0)
    with pytest.raises(SchedulerError, match="begun while batch 1"):
        s.begin(2, 2)
    with pytest.raises(SchedulerError, match="joined twice"):
        s.join(0)
    with pytest.raises(ValueError):
        PortionScheduler(push_every=0)
