"""The LMDB store: rounds written in one transaction, recovery, foreign and corrupt stores."""

from __future__ import annotations

import numpy as np
import pytest
from hogwild_plugins.ps.storage import RECORD_MAGIC, Flusher, ShardStore, StoreError

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
