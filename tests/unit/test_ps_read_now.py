"""A pull answered by the network thread itself (UpdateEngine.read_now), without sockets: only
when no write is queued or being applied for its shard, and then it sees every write queued
before it."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hogwild_plugins.ps import kernels
from hogwild_plugins.ps.engine import UpdateEngine
from hogwild_plugins.ps.work import (
    AddToVector,
    Assign,
    Barrier,
    Kind,
    Pull,
    PushDeltas,
    PushVectors,
    Restore,
    Shard,
    Snapshot,
    SnapshotRound,
    VectorOp,
    Work,
)

from hogwild.net.wire import Header, MsgType

# it calls kernels tests.warm_kernels compiles: it runs once they are in numba's cache
pytestmark = pytest.mark.warmed_kernels

FLOATS = 16


def _engine() -> UpdateEngine:
    shards = [
        Shard(i, i * FLOATS, np.full(FLOATS, float(i), np.float32), np.zeros(0, np.float32))
        for i in range(2)
    ]
    return UpdateEngine(shards, rule=kernels.RULE_SGD, lr=1.0, mu=0.0, eps=0.0, threads=1)


def _push(engine: UpdateEngine, local: int, delta: np.ndarray) -> None:
    header = Header(MsgType.PUSH_DELTAS, job=1, target=local)
    work = PushDeltas(local, header, offset=0, length=FLOATS, delta=delta, keep=delta, acked=True)
    assert engine.submit(work)


def _pull(engine: UpdateEngine, local: int):
    return engine.read_now(
        Pull(local, Header(MsgType.PULL, job=1, target=local), offset=0, length=FLOATS)
    )


def test_a_pull_waits_for_a_pending_write_and_then_sees_it():
    engine = _engine()
    _push(engine, 0, np.ones(FLOATS, np.float32))  # queued; the threads are not running yet
    assert _pull(engine, 0) is None  # a write is pending: the pull must queue behind it
    header, [values] = _pull(engine, 1)  # the other shard has none: answered now
    assert header.type == MsgType.DATA and header.version == 0 and (values == 1.0).all()
    engine.start()
    try:
        deadline = time.monotonic() + 10.0
        while engine.shards[0].writes_done != engine.shards[0].writes_queued:
            assert time.monotonic() < deadline, "the update thread did not apply the push"
            time.sleep(0.001)
        header, [values] = _pull(engine, 0)
        assert header.version == 1 and (values == 1.0).all()  # 0 + lr * 1
        values[:] = 7.0  # the reply is a copy: the shard is not changed through it
        assert (engine.shards[0].values == 1.0).all()
        assert engine.pulls_at_once == 2
    finally:
        engine.stop()


def test_a_failed_write_still_settles_its_shard():
    engine = _engine()
    bad = PushVectors(  # no layer
        0,
        Header(MsgType.PUSH_VECTORS, job=1, target=0),
        layer=None,
        first_row=0,
        length=0,
        activations=None,
        errors_by_row=None,
        acked=True,
    )
    assert engine.submit(bad)
    engine.start()
    try:
        deadline = time.monotonic() + 10.0
        while not engine.failures:
            assert time.monotonic() < deadline, "the bad vector operation did not fail"
            time.sleep(0.001)
        while _pull(engine, 0) is None:  # settled despite the failure: pulls go straight again
            assert time.monotonic() < deadline, "a failed write left its shard pending"
            time.sleep(0.001)
    finally:
        engine.stop()


def _records() -> dict[int, Work]:
    """One record of every kind of work, for shard 0 (answering a PULL header)."""
    header = Header(MsgType.PULL, job=1, target=0)
    zeros = np.zeros(FLOATS, np.float32)
    return {
        Kind.DELTAS: PushDeltas(0, header, offset=0, length=FLOATS, delta=zeros),
        Kind.VECTORS: PushVectors(
            0, header, layer=None, first_row=0, length=0, activations=None, errors_by_row=None
        ),
        Kind.PULL: Pull(0, header, offset=0, length=FLOATS),
        Kind.ASSIGN: Assign(0, header, offset=0, length=FLOATS, values=zeros),
        Kind.VECOP: VectorOp(0, header, op=kernels.VECTOR_OPS["dot"], names=("params", "params")),
        Kind.SNAPSHOT: Snapshot(0, header, round=SnapshotRound(1)),
        Kind.RESTORE: Restore(0, header, values=zeros, state=zeros),
        Kind.BARRIER: Barrier(0, header),
        Kind.INTO: AddToVector(0, header, name="g", offset=0, length=FLOATS, delta=zeros),
    }


def test_every_kind_has_one_record_class():
    kinds = {value for name, value in vars(Kind).items() if name.isupper()}
    records = _records()
    assert len(kinds) == 9 and set(records) == kinds
    assert all(record.kind == kind for kind, record in records.items())
    assert len({type(record) for record in records.values()}) == 9
    writes = {kind for kind, record in records.items() if record.writes}
    assert writes == {Kind.DELTAS, Kind.VECTORS, Kind.ASSIGN, Kind.VECOP, Kind.RESTORE, Kind.INTO}


@pytest.mark.parametrize("kind", range(9))
def test_only_a_queued_write_makes_a_pull_wait(kind):
    """Queued before the threads start, so nothing is applied: the counts alone decide."""
    engine = _engine()
    record = _records()[kind]
    assert engine.submit(record)
    reply = _pull(engine, 0)
    if record.writes:
        assert reply is None
    else:
        header, [values] = reply
        assert header.version == 0 and (values == 0.0).all()
    assert _pull(engine, 1) is not None  # the other shard has nothing queued
