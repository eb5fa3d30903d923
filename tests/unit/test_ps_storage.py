"""The LMDB store: rounds written in one transaction, recovery, foreign and corrupt stores, and
the buckets' marks (the newest epoch of each bucket's record a replicated server saw)."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hogwild_plugins.ps.storage import (
    MARK,
    MARK_MAGIC,
    RECORD_MAGIC,
    Flusher,
    ShardStore,
    StoreError,
    mark_key,
)

JOB = {"job": "t", "n_params": 3000, "shard_floats": 1024, "rule": "momentum"}


def shard_items(version: int):
    return [
        (s, version, np.full(n, version + s, np.float32), np.full(n, -version, np.float32))
        for s, n in ((0, 1024), (2, 952))
    ]


def test_round_trip(tmp_path):
    store = ShardStore(tmp_path, **JOB)
    assert store.write(shard_items(7)) > 2 * 4 * 1976
    store.close()
    store = ShardStore(tmp_path, **JOB)
    loaded = store.load([0, 1, 2], {0: 1024, 1: 1024, 2: 952}, 1)
    store.close()
    assert sorted(loaded) == [0, 2]
    version, values, state = loaded[2]
    assert version == 7 and (values == 9).all() and (state == -7).all() and values.size == 952


def test_a_foreign_store_is_refused_naming_the_file(tmp_path):
    ShardStore(tmp_path, **JOB).close()
    for change in ({"job": "other"}, {"n_params": 3001}, {"rule": "adagrad"}):
        with pytest.raises(StoreError, match=r"data\.mdb: this store belongs to another job"):
            ShardStore(tmp_path, **(JOB | change))


def test_a_corrupt_record_is_detected(tmp_path):
    store = ShardStore(tmp_path, **JOB)
    store.write(shard_items(3))
    store.close()
    raw = bytearray((tmp_path / "data.mdb").read_bytes())
    at = raw.find(RECORD_MAGIC)
    assert at >= 0
    raw[at + 200] ^= 0xFF  # a byte of the values
    (tmp_path / "data.mdb").write_bytes(bytes(raw))
    store = ShardStore(tmp_path, **JOB)
    try:
        with pytest.raises(StoreError, match=r"data\.mdb: record shard/0000000\d: checksum"):
            store.load([0, 2], {0: 1024, 2: 952}, 1)
    finally:
        store.close()


def test_a_file_that_is_not_lmdb_is_refused(tmp_path):
    (tmp_path / "data.mdb").write_bytes(b"\0" * 65536)
    with pytest.raises(StoreError, match=r"data\.mdb: cannot open"):
        ShardStore(tmp_path, **JOB)


class FakeRound:
    def __init__(self, items, applied):
        self.items, self.applied_updates = items, applied


def test_flusher_writes_rounds_and_reports_the_loss_window(tmp_path):
    store = ShardStore(tmp_path, **JOB)
    rounds = [FakeRound(shard_items(5), 40), None]
    flusher = Flusher(lambda full: rounds.pop(0), store, interval_s=3600)
    assert flusher.flush()
    window = flusher.window(applied_updates=55)
    assert window["updates"] == 15 and window["flushes"] == 1 and window["error"] is None
    assert flusher.flushed_versions == {0: 5, 2: 5}
    assert not flusher.flush()  # a thread did not answer: an error, kept for the status
    assert "did not hand over" in flusher.window(55)["error"]
    store.close()


# --------------------------------------------------------------------------- buckets' marks


def test_marks_survive_the_process_beside_the_shards_and_only_grow_where_written(tmp_path):
    store = ShardStore(tmp_path, **JOB)
    assert store.marks(4) == {}  # a store without marks remembers no bucket
    store.write(shard_items(3))
    store.mark({0: (2, 1, 0x7001), 3: (7, 2, 0x7002)})
    store.mark({0: (5, 0, 2**63 - 1)})
    store.close()
    store = ShardStore(tmp_path, **JOB)
    try:
        assert store.marks(4) == {0: (5, 0, 2**63 - 1), 3: (7, 2, 0x7002)}
        assert sorted(store.load([0, 1, 2], {0: 1024, 1: 1024, 2: 952}, 1)) == [0, 2]
    finally:
        store.close()


def corrupt_mark(tmp_path, at: int, value: int) -> None:
    store = ShardStore(tmp_path, **JOB)
    store.mark({2: (9, 1, 0x7001)})
    store.close()
    raw = bytearray((tmp_path / "data.mdb").read_bytes())
    where = raw.find(MARK_MAGIC)
    assert where >= 0
    raw[where + at] = value
    (tmp_path / "data.mdb").write_bytes(bytes(raw))


@pytest.mark.parametrize(
    ("at", "value", "message"),
    [
        (0, ord("X"), r"corrupt mark \(magic"),
        (10, 0x55, r"checksum mismatch"),  # a byte of the epoch
        (20, 0x55, r"checksum mismatch"),  # a byte of the primary
        (32, 0x55, r"checksum mismatch"),  # a byte of the CRC
    ],
)
def test_a_corrupt_mark_is_refused_naming_the_file_and_key(tmp_path, at, value, message):
    corrupt_mark(tmp_path, at, value)
    store = ShardStore(tmp_path, **JOB)
    try:
        with pytest.raises(StoreError, match=rf"data\.mdb: record bucket/00000002: {message}"):
            store.marks(4)
    finally:
        store.close()


def test_a_mark_of_a_bucket_the_job_does_not_have_is_refused(tmp_path):
    store = ShardStore(tmp_path, **JOB)
    try:
        store.mark({6: (1, 0, 0x7000)})
        with pytest.raises(StoreError, match=r"bucket/00000006: marks bucket 6, expected 6 in "):
            store.marks(4)
    finally:
        store.close()


def test_a_mark_of_another_format_is_refused(tmp_path):
    store = ShardStore(tmp_path, **JOB)
    try:
        head = MARK.pack(MARK_MAGIC, 2, 1, 3, 0, 0x7000)
        with store.env.begin(write=True) as txn:  # as a later hogwild would write it
            txn.put(mark_key(1), head + struct.pack("<I", zlib.crc32(head)))
        with pytest.raises(StoreError, match=r"bucket/00000001: a mark of format 2"):
            store.marks(4)
    finally:
        store.close()


def test_a_mark_naming_a_server_the_job_does_not_have_is_refused(tmp_path):
    store = ShardStore(tmp_path, **JOB)
    try:
        store.mark({2: (1, 9, 0x7009)})
        assert store.marks(4) == {2: (1, 9, 0x7009)}  # the job's servers not given: not checked
        with pytest.raises(StoreError, match=r"bucket/00000002: primary 9, expected one of the "):
            store.marks(4, n_servers=3)
    finally:
        store.close()
