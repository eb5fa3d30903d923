"""Labels are class indices the training kernels write at unchecked: each is checked where it
enters (an ingest, an LMDB cache's label array and records, a data server's reply), and one out
of range is a clear error naming where it came from, never an out-of-bounds write.
"""

from __future__ import annotations

import lmdb
import numpy as np
import pytest

from hogwild.data.cache import open_cache
from hogwild.data.ingest import ingest_arrays
from hogwild.data.layout import labels_key, record_key, records_db
from hogwild.data.remote import RemoteReader
from hogwild.errors import DataError
from hogwild.net.address import parse_address
from hogwild.net.router import Reply, Router, json_reply
from hogwild.net.wire import DType, MsgType

HOSTILE = 2**31 - 1


@pytest.fixture
def cache(tmp_path):
    """A cache of 20 training and 5 test 6x6 grey images, 4 classes."""
    rng = np.random.default_rng(3)
    splits = {
        name: (rng.integers(0, 256, (n, 6, 6), np.uint8), rng.integers(0, 4, n))
        for name, n in (("train", 20), ("test", 5))
    }
    ingest_arrays(tmp_path / "c", splits, classes=("a", "b", "c", "d"))
    return tmp_path / "c"


def _tamper(path, *, record: int | None = None, labels_at: int | None = None) -> None:
    env = lmdb.open(str(path), max_dbs=16, subdir=True)
    try:
        with env.begin(write=True) as txn:
            if record is not None:
                db = env.open_db(records_db("train").encode(), txn=txn, create=False)
                raw = bytearray(txn.get(record_key(record), db=db))
                raw[16:20] = HOSTILE.to_bytes(4, "little", signed=True)
                txn.put(record_key(record), bytes(raw), db=db)
            if labels_at is not None:
                meta = env.open_db(b"meta", txn=txn, create=False)
                labels = np.frombuffer(txn.get(labels_key("train"), db=meta), "<i4").copy()
                labels[labels_at] = HOSTILE
                txn.put(labels_key("train"), labels.tobytes(), db=meta)
    finally:
        env.close()


@pytest.mark.parametrize("native", [False, True])
def test_a_cache_record_with_a_hostile_label_is_refused_at_read(cache, native):
    _tamper(cache, record=7)
    reader = open_cache(cache, "train", native=native)
    try:
        out = np.zeros((20, 6, 6, 1), np.uint8)
        labels = np.zeros(20, np.int32)
        reader.read(np.arange(5), out, labels)  # records before it read as ever
        with pytest.raises(DataError, match=r"record 7 .*label 2147483647.*0\.\.3"):
            reader.read(np.arange(20), out, labels)
    finally:
        reader.close()


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("cut", [1, -1])  # a byte short, a byte long
def test_a_cache_record_of_the_wrong_size_is_refused_at_read(cache, native, cut):
    """An image's bytes are read into rows of the cache's shape: a record of another size is
    an error naming it, never copied past its row."""
    env = lmdb.open(str(cache), max_dbs=16, subdir=True)
    try:
        with env.begin(write=True) as txn:
            db = env.open_db(records_db("train").encode(), txn=txn, create=False)
            raw = txn.get(record_key(9), db=db)
            txn.put(record_key(9), raw[:-cut] if cut > 0 else raw + b"\0", db=db)
    finally:
        env.close()
    reader = open_cache(cache, "train", native=native)
    try:
        out = np.zeros((20, 6, 6, 1), np.uint8)
        labels = np.zeros(20, np.int32)
        with pytest.raises(DataError, match=r"record 9 .*\d+ bytes, expected \d+"):
            reader.read(np.arange(20), out, labels)
    finally:
        reader.close()


def test_a_cache_label_array_with_a_hostile_label_is_refused_at_open(cache):
    _tamper(cache, labels_at=11)
    with pytest.raises(DataError, match=r"record 11 .*label 2147483647.*0\.\.3"):
        open_cache(cache, "train")


def test_ingest_refuses_a_label_outside_the_classes(tmp_path):
    images = np.zeros((3, 6, 6), np.uint8)
    with pytest.raises(DataError, match=r"train.*record 2 .*label 9.*0\.\.1"):
        ingest_arrays(tmp_path / "x", {"train": (images, np.array([0, 1, 9]))}, classes=("a", "b"))
    with pytest.raises(DataError, match=r"record 1 .*label -1"):
        ingest_arrays(tmp_path / "y", {"train": (images, np.array([0, -1, 1]))})


class LyingDataServer:
    """A data server (a real :class:`Router` on loopback) that describes 4 classes of 6x6 grey
    images and answers every batch with images and the label ``HOSTILE`` for its third record."""

    dedup_types = frozenset()
    receives_into_buffers = False

    def buffers(self, header):
        return None

    def release(self, buffers) -> None:
        pass

    def tick(self, now: float) -> None:
        pass

    def handle(self, request):
        h = request.header
        if h.type == MsgType.CONTROL:
            return json_reply(h, {
                "role": "data", "data_id": 77, "shape": [1, 6, 6], "stored_shape": [6, 6, 1],
                "splits": {"train": 20, "test": 5}, "classes": ["a", "b", "c", "d"],
                "max_records": 1000, "seed": 0, "augment": None,
            })  # fmt: skip
        n = h.shape[0]
        labels = np.zeros(n, np.int32)
        labels[min(2, n - 1)] = HOSTILE
        reply = h.reply(MsgType.DATA, aux=h.aux, dtype=DType.UINT8, shape=(n, 1, 6, 6), frames=2)
        return Reply(reply, [np.zeros((n, 36), np.uint8), labels])


def test_a_data_server_reply_with_a_hostile_label_is_refused():
    router = Router(parse_address("tcp://127.0.0.1:0"), LyingDataServer())
    address = router.start()
    try:
        with RemoteReader([f"127.0.0.1:{address.port}"], "train", timeout_s=1.0) as reader:
            out = np.zeros((4, 1, 6, 6), np.uint8)
            labels = np.zeros(4, np.int32)
            with pytest.raises(DataError, match=r"record 2 .*label 2147483647.*0\.\.3"):
                reader.read(np.arange(4), out, labels)
    finally:
        router.stop()
        router.close()
