"""A push of deltas applied by the network thread itself (UpdateEngine.claim_idle and
apply_claimed), without sockets: only while the shard's update thread is between batches and no
write is pending for the shard; what it applies equals what the update thread would have, and
the counts stay aligned (a pull after it goes straight, the flusher's snapshot sees it whole)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from hogwild_plugins.ps import kernels
from hogwild_plugins.ps.engine import UpdateEngine
from hogwild_plugins.ps.work import AddToVector, PushDeltas, Shard

from hogwild.net.wire import Header, MsgType

# it calls kernels tests.warm_kernels compiles: it runs once they are in numba's cache
pytestmark = pytest.mark.warmed_kernels

FLOATS = 4096


def _engine(rule: int = kernels.RULE_SGD, shards: int = 2) -> UpdateEngine:
    state = FLOATS if kernels.STATE_ARRAYS[rule] else 0
    made = [
        Shard(i, i * FLOATS, np.zeros(FLOATS, np.float32), np.zeros(state, np.float32))
        for i in range(shards)
    ]
    return UpdateEngine(made, rule=rule, lr=0.5, mu=0.9, eps=1e-6, threads=1)


def _work(local: int, delta: np.ndarray, offset: int = 0, coef: float = 1.0) -> PushDeltas:
    header = Header(MsgType.PUSH_DELTAS, job=1, target=local)
    return PushDeltas(local, header, offset=offset, length=delta.size, delta=delta, coef=coef)


def _wait_settled(engine: UpdateEngine, local: int) -> None:
    shard, deadline = engine.shards[local], time.monotonic() + 10.0
    while shard.writes_done != shard.writes_queued:
        assert time.monotonic() < deadline, "the update thread did not apply the queued push"
        time.sleep(0.001)


@pytest.mark.parametrize("rule", sorted(kernels.RULES.values()))
def test_applied_at_once_equals_applied_by_the_update_thread(rule):
    rng = np.random.default_rng(rule)
    pushes = [
        (rng.standard_normal(n).astype(np.float32), offset, coef)
        for n, offset, coef in ((FLOATS, 0, 1.0), (1000, 3000 - 1000, 0.7), (17, 5, 0.25))
    ]
    direct, queued = _engine(rule), _engine(rule)
    queued.start()
    try:
        for delta, offset, coef in pushes:
            claimed = direct.claim_idle(0)
            assert claimed is not None  # the threads never started: idle, nothing pending
            try:
                direct.apply_claimed(_work(0, delta, offset, coef))
            finally:
                claimed.release()
            queued.submit(_work(0, delta, offset, coef))
            _wait_settled(queued, 0)
    finally:
        queued.stop()
    for a, b in ((direct.shards[0].values, queued.shards[0].values),
                 (direct.shards[0].state, queued.shards[0].state)):  # fmt: skip
        np.testing.assert_array_equal(a, b)
    shard = direct.shards[0]
    assert shard.applied == 3 and shard.writes_done == shard.writes_queued == 3
    assert direct.pushes_at_once == 3 and direct.applied == [3]
    assert direct.updated == [FLOATS + 1000 + 17]


def test_not_claimed_while_a_write_is_pending_for_the_shard():
    engine = _engine()
    assert engine.submit(_work(0, np.ones(FLOATS, np.float32)))  # queued; threads not started
    assert engine.claim_idle(0) is None  # it must queue behind the pending write
    claimed = engine.claim_idle(1)  # the other shard has none pending
    assert claimed is not None
    claimed.release()
    engine.start()
    try:
        _wait_settled(engine, 0)
        claimed = engine.claim_idle(0)
        assert claimed is not None
        claimed.release()
    finally:
        engine.stop()


def test_not_claimed_while_the_thread_processes_a_batch_and_a_snapshot_sees_it_whole():
    """The update thread holds the busy lock through a batch: here a snapshot that waits, inside
    its batch, until the test has tried to claim the shard."""
    engine = _engine()
    engine.start()
    try:
        inside, tried = threading.Event(), threading.Event()
        real = engine._snapshot

        def slow_snapshot(t, round_):
            inside.set()
            assert tried.wait(10.0)
            real(t, round_)

        engine._snapshot = slow_snapshot
        taken = []
        snapper = threading.Thread(target=lambda: taken.append(engine.snapshot(timeout=20.0)))
        snapper.start()
        assert inside.wait(10.0), "the snapshot did not start"
        assert engine.claim_idle(0) is None  # the thread is inside its batch
        tried.set()
        snapper.join(20.0)
        assert taken and taken[0] is not None and taken[0].items == []  # nothing changed yet
        claimed = engine.claim_idle(0)  # the batch is over
        assert claimed is not None
        try:
            engine.apply_claimed(_work(0, np.full(FLOATS, 2.0, np.float32)))
        finally:
            claimed.release()
        round_ = engine.snapshot(timeout=10.0)
        [(index, version, values, _)] = round_.items
        assert index == 0 and version == 1 and (values == 1.0).all()  # lr 0.5 * 2
    finally:
        engine.stop()


def test_a_push_that_fails_at_once_still_settles_its_shard():
    engine = _engine()
    claimed = engine.claim_idle(0)
    bad = _work(0, np.ones(FLOATS, np.float32))
    bad.delta = None  # the kernel cannot take it
    try:
        with pytest.raises(Exception):  # noqa: B017 - whatever numba raises for the bad type
            engine.apply_claimed(bad)
    finally:
        claimed.release()
    shard = engine.shards[0]
    assert shard.writes_done == shard.writes_queued == 1 and shard.applied == 1
    assert engine.claim_idle(0) is not None  # not left pending for ever


def test_an_acknowledged_write_that_fails_is_counted_apart():
    """A write acknowledged when queued that its thread cannot apply (one named vector too many:
    admission, which holds the room, is what a bug would skip) is a failure after the
    acknowledgement: counted in ``failed_after_ack`` and said in ``failures``; a write refused
    before any acknowledgement is not."""
    engine = _engine()
    shard = engine.shards[0]
    shard.max_vectors = 0  # no room for any named vector
    header = Header(MsgType.PUSH_DELTAS, job=1, target=0)
    delta = np.ones(8, np.float32)
    acked = AddToVector(0, header, name="x", offset=0, length=8, delta=delta)
    acked.acked = True  # as the network thread acknowledges a queued push
    unacked = AddToVector(0, header, name="y", offset=0, length=8, delta=delta.copy())
    engine.start()
    try:
        assert engine.submit(acked) and engine.submit(unacked)
        _wait_settled(engine, 0)
    finally:
        engine.stop()
    assert engine.failed_after_ack == 1 and shard.vectors == {}
    assert len(engine.failures) == 1 and "named vectors" in engine.failures[0]
