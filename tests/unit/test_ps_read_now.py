"""A pull answered by the network thread itself (UpdateEngine.read_now), without sockets: only
when no write is queued or being applied for its shard, and then it sees every write queued
before it."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hogwild_plugins.ps import kernels
from hogwild_plugins.ps.engine import _READS, _WRITES, Kind, Shard, UpdateEngine, Work

from hogwild.net.wire import Header, MsgType

FLOATS = 16


def _engine() -> UpdateEngine:
    shards = [
        Shard(i, i * FLOATS, np.full(FLOATS, float(i), np.float32), np.zeros(0, np.float32))
        for i in range(2)
    ]
    return UpdateEngine(shards, rule=kernels.RULE_SGD, lr=1.0, mu=0.0, eps=0.0, threads=1)


def _push(engine: UpdateEngine, local: int, delta: np.ndarray) -> None:
    header = Header(MsgType.PUSH_DELTAS, job=1, target=local)
    work = Work(Kind.DELTAS, local, header, length=FLOATS, data=delta, keep=delta, acked=True)
    assert engine.submit(work)


def _pull(engine: UpdateEngine, local: int):
    return engine.read_now(
        Work(Kind.PULL, local, Header(MsgType.PULL, job=1, target=local), length=FLOATS)
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
    bad = Work(
        Kind.VECTORS, 0, Header(MsgType.PUSH_VECTORS, job=1, target=0), acked=True
    )  # no layer
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


def test_every_kind_is_either_a_write_or_a_read():
    kinds = {value for name, value in vars(Kind).items() if name.isupper()}
    assert len(kinds) == 9 and _WRITES | _READS == kinds and not _WRITES & _READS


@pytest.mark.parametrize("kind", sorted(_WRITES | _READS))
def test_only_a_queued_write_makes_a_pull_wait(kind):
    """Queued before the threads start, so nothing is applied: the counts alone decide."""
    engine = _engine()
    assert engine.submit(Work(kind, 0, Header(MsgType.PULL, job=1, target=0), length=FLOATS))
    reply = _pull(engine, 0)
    if kind in _WRITES:
        assert reply is None
    else:
        header, [values] = reply
        assert header.version == 0 and (values == 0.0).all()
    assert _pull(engine, 1) is not None  # the other shard has nothing queued
