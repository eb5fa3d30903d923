"""What a data server delivers and how it checks requests, without a network.

A :class:`~hogwild.data.resident.Delivery` gives, for idx files and an LMDB cache (one and three
channels), with and without augmentation, exactly the batches a worker's own feed renders (the
training variants of (seed, epoch, index), the test split's centre view), whether rendered on
demand or read from epochs rendered ahead; the render-ahead follows the latest epoch asked for and
holds at most ``keep`` epochs; a RAM budget leaves the rest of a cache in LMDB. The data's id
names its content, augmentation and (when augmenting) seed. A
:class:`~hogwild.data.server.DataServer`'s handler, called directly, refuses every mutated field
of a request with the error code and a message naming it.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from hogwild.data.augment import AugmentSpec
from hogwild.data.cache import open_cache
from hogwild.data.feed import ArrayReader, WorkerFeed
from hogwild.data.idx import write_idx
from hogwild.data.ingest import ingest_arrays
from hogwild.data.resident import Delivery, load_source
from hogwild.data.server import DataServer
from hogwild.net.address import parse_address
from hogwild.net.router import Incoming
from hogwild.net.wire import DType, ErrorCode, Header, MsgType, WireError

# it calls kernels tests.warm_kernels compiles: it runs once they are in numba's cache
pytestmark = pytest.mark.warmed_kernels

WAIT_S = 30.0
RGB_AUGMENT = "crop=16,hflip,rotate=10"


@pytest.fixture(scope="module")
def idx_dir(tmp_path_factory):
    """A small MNIST re-cut: 700 training and 300 test digits of noise."""
    root = tmp_path_factory.mktemp("idx")
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 700), ("t10k", 300)):
        write_idx(root / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28), np.uint8))
        write_idx(root / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, n, dtype=np.uint8))
    return root


@pytest.fixture(scope="module")
def rgb_cache(tmp_path_factory):
    """An LMDB cache of 600 training and 150 test 20x24 RGB images."""
    out = tmp_path_factory.mktemp("cache") / "rgb"
    rng = np.random.default_rng(1)
    splits = {
        name: (rng.integers(0, 256, (n, 20, 24, 3), np.uint8), rng.integers(0, 4, n))
        for name, n in (("train", 600), ("test", 150))
    }
    ingest_arrays(out, splits)
    return out


def _local_reader(kind: str, path, split: str):
    if kind == "cache":
        return open_cache(path, split)
    data = load_source(str(path)).splits[split].reader
    return ArrayReader(data.images.copy(), data.labels.copy())


def _feed_reads(reader, spec, seed: int, epoch: int, idx: np.ndarray, train: bool):
    """What a worker's own feed (augmenting, channels first) gives for ``idx``."""
    images, labels = [], []
    with WorkerFeed(reader, batch=128, augment=spec, seed=seed, train=train) as feed:
        feed.start_epoch(epoch, idx)
        for batch in feed:
            images.append(batch.images.copy())
            labels.append(batch.labels.copy())
    return np.concatenate(images), np.concatenate(labels)


def _delivered(delivery: Delivery, split: str, epoch: int, idx: np.ndarray):
    images = np.empty((len(idx), *delivery.shape), np.uint8)
    labels = np.empty(len(idx), np.int32)
    delivery.fill(split, epoch, idx, images, labels)
    return images, labels


def _wait_rendered(delivery: Delivery, epochs: set[str]) -> dict:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        state = delivery.state()["render_ahead"]
        done = {e for e, fraction in state["epochs"].items() if fraction == 1.0}
        if epochs <= done:
            return state
        time.sleep(0.02)
    raise AssertionError(f"epochs {epochs} not rendered in {WAIT_S} s: {state}")


@pytest.mark.parametrize(
    "kind, augment",
    [("idx", ""), ("idx", "mnist"), ("cache", ""), ("cache", RGB_AUGMENT)],
)
def test_delivered_batches_equal_a_workers_own_reads(kind, augment, idx_dir, rgb_cache):
    path = rgb_cache if kind == "cache" else idx_dir
    spec = AugmentSpec.parse(augment) if augment else None
    delivery = Delivery(load_source(str(path)), augment=spec, seed=5)
    rng = np.random.default_rng(2)
    try:
        expected = {}
        for split, epochs in (("train", (0, 3)), ("test", (0,))):
            reader = _local_reader(kind, path, split)
            try:
                for epoch in epochs:
                    idx = rng.permutation(len(reader.labels))[:257]  # batches of 128: a ragged end
                    want = _feed_reads(reader, spec, 5, epoch, idx, split == "train")
                    got = _delivered(delivery, split, epoch, idx)  # rendered on demand
                    np.testing.assert_array_equal(got[0], want[0])
                    np.testing.assert_array_equal(got[1], want[1])
                    expected[split, epoch] = idx, want
            finally:
                if hasattr(reader, "close"):
                    reader.close()
        if not augment:
            assert delivery.render is None and delivery.served["stored"] == 3
            return
        delivery.start()
        _wait_rendered(delivery, {"3", "4"})  # the latest epoch asked for, and the next
        idx, want = expected["train", 3]
        got = _delivered(delivery, "train", 3, idx)  # from the epoch rendered ahead
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        assert delivery.served["rendered"] == 1 and delivery.served["on_demand"] == 2
    finally:
        delivery.close()


def test_render_ahead_follows_the_latest_epoch_asked_for_and_holds_at_most_keep(idx_dir):
    delivery = Delivery(load_source(str(idx_dir)), augment=AugmentSpec.parse("mnist"), keep=2)
    idx = np.arange(0, 700, 7, dtype=np.int64)
    try:
        delivery.start()
        _wait_rendered(delivery, {"0", "1"})
        on_demand = _delivered(delivery, "train", 7, idx)  # epoch 7 asked for: 7 and 8 next
        state = _wait_rendered(delivery, {"7", "8"})
        assert set(state["epochs"]) == {"7", "8"} and state["latest_requested"] == 7
        assert state["rendered_records"] >= 4 * 700 and state["failure"] is None
        np.testing.assert_array_equal(_delivered(delivery, "train", 7, idx)[0], on_demand[0])
        assert delivery.served == {"rendered": 1, "on_demand": 1, "stored": 0}
        delivery.render.recent_s = 0.3
        _delivered(delivery, "train", 2**32 - 1, idx[:1])  # one far-off epoch: forgotten soon
        deadline = time.monotonic() + WAIT_S
        while delivery.render.latest != 9 and time.monotonic() < deadline:
            _delivered(delivery, "train", 9, idx[:1])  # what the replicas keep asking for
            time.sleep(0.05)
        assert _wait_rendered(delivery, {"9", "10"})["latest_requested"] == 9
    finally:
        delivery.close()


def test_a_ram_budget_leaves_the_rest_of_a_cache_in_lmdb(rgb_cache):
    image = 20 * 24 * 3
    source = load_source(str(rgb_cache), ram_budget_bytes=100 * image)
    assert source.splits["train"].resident < 100 and source.splits["test"].resident == 0
    delivery = Delivery(source, augment=AugmentSpec.parse(RGB_AUGMENT), ram_budget_bytes=0)
    try:
        assert delivery.render is None
        assert delivery.state()["render_ahead"] == {"enabled": False, "why": "no room for a "
                                                    "rendered epoch"}  # fmt: skip
        idx = np.arange(50, 600, 3, dtype=np.int64)  # in RAM and in LMDB
        with open_cache(rgb_cache, "train") as reader:
            want = _feed_reads(reader, AugmentSpec.parse(RGB_AUGMENT), 0, 2, idx, True)
        np.testing.assert_array_equal(_delivered(delivery, "train", 2, idx)[0], want[0])
    finally:
        delivery.close()
    whole = load_source(str(rgb_cache))  # no budget: all of it
    assert {s.resident for s in whole.splits.values()} == {600, 150}


def test_the_data_id_names_the_content_the_augmentation_and_its_seed(idx_dir, rgb_cache):
    mnist = AugmentSpec.parse("mnist")

    def data_id(path, spec=None, seed=0):
        delivery = Delivery(load_source(str(path)), augment=spec, seed=seed)
        delivery.close()
        return delivery.data_id

    assert data_id(idx_dir, mnist, 3) == data_id(idx_dir, mnist, 3)
    assert data_id(idx_dir, mnist, 3) != data_id(idx_dir, mnist, 4)
    assert data_id(idx_dir, None, 3) == data_id(idx_dir, None, 4)  # the seed changes nothing
    assert data_id(idx_dir) != data_id(idx_dir, mnist) != data_id(rgb_cache, mnist)


# ---------------------------------------------------------------------- the handler's checks


@pytest.fixture(scope="module")
def server(idx_dir):
    """A data server that is never started: its handler called directly (no sockets)."""
    server = DataServer(Delivery(load_source(str(idx_dir))), parse_address("127.0.0.1:0"))
    yield server
    server.stop()


def _batch(server, n: int = 4, **changes) -> Header:
    header = Header(MsgType.BATCH, job=server.data_id, target=0, aux=2, dtype=DType.INT64,
                    shape=(n,), frames=1)  # fmt: skip
    return header._replace(**changes)


def _call(server, header: Header, frames=None):
    if frames is None:
        frames = [np.arange(header.shape[0], dtype=np.int64)] if header.shape else []
    return server.handle(Incoming(b"client", header, frames, 0.0))


def test_a_valid_batch_request_is_queued_for_a_serve_thread(server):
    assert _call(server, _batch(server)) is None  # answered later by a serve thread
    header, split, idx, _ = server._queue.get_nowait()
    assert (header.aux, split, idx.tolist()) == (2, "train", [0, 1, 2, 3])


@pytest.mark.parametrize(
    "changes, frames, code, words",
    [
        ({"job": 12345}, None, ErrorCode.WRONG_JOB, "job id 0x3039"),
        ({"job": 0}, None, ErrorCode.WRONG_JOB, "from a describe request"),
        ({"target": 2}, None, ErrorCode.BAD_TARGET, "target 2"),
        ({"target": 1, "aux": 3}, None, ErrorCode.BAD_VALUE, "epoch (aux) 3"),
        ({"dtype": DType.INT32}, None, ErrorCode.BAD_FRAMES, "INT32"),
        ({"shape": (2, 2)}, None, ErrorCode.BAD_FRAMES, "[2, 2]"),
        ({"frames": 2}, None, ErrorCode.BAD_FRAMES, "2 frame(s)"),
        ({"shape": (200_000,)}, [], ErrorCode.BAD_RANGE, "at most 10699 images"),
        ({"version": 1}, None, ErrorCode.BAD_VALUE, "version must be 0"),
        ({"offset": 9}, None, ErrorCode.BAD_VALUE, "offset must be 0"),
        ({"code": 3}, None, ErrorCode.BAD_VALUE, "code must be 0"),
        ({"lease": 1}, None, ErrorCode.BAD_VALUE, "lease must be 0"),
        ({"a": 0.5}, None, ErrorCode.BAD_VALUE, "a must be 0"),
        ({"b": -1.0}, None, ErrorCode.BAD_VALUE, "b must be 0"),
        ({"flags": 1}, None, ErrorCode.BAD_VALUE, "only RESEND"),
        ({}, [np.arange(3, dtype=np.int64)], ErrorCode.BAD_FRAMES, "24 bytes, expected 32"),
        ({}, [np.array([0, 1, 700, 2])], ErrorCode.BAD_RANGE, "record index 700 is outside"),
        ({}, [np.array([0, -1, 5, 2])], ErrorCode.BAD_RANGE, "record index -1 is outside"),
    ],
)
def test_every_field_of_a_batch_request_is_checked(server, changes, frames, code, words):
    with pytest.raises(WireError) as caught:
        _call(server, _batch(server, **changes), frames)
    assert caught.value.code == code
    assert words in str(caught.value)
    assert server._queue.empty()


def _control(text: bytes, **changes) -> Header:
    header = Header(MsgType.CONTROL, dtype=DType.UINT8, shape=(len(text),), frames=1)
    return header._replace(**changes)


def test_describe_status_and_ping_are_answered_on_the_network_thread(server):
    text = b'{"op": "describe"}'
    reply = _call(server, _control(text), [text])
    described = json.loads(bytes(reply.frames[0]))
    assert reply.header.type == MsgType.JSON and described["data_id"] == server.data_id
    assert described["shape"] == [1, 28, 28] and described["splits"] == {"train": 700, "test": 300}
    assert described["augment"] is None and described["max_records"] == 10699  # 8 MiB
    status = json.loads(bytes(_call(server, Header(MsgType.STATUS, job=server.data_id)).frames[0]))
    assert status["role"] == "data" and status["render_ahead"]["enabled"] is False
    assert _call(server, Header(MsgType.PING)).header.version == server.data_id


@pytest.mark.parametrize(
    "header, frames, code, words",
    [
        (_control(b"{op"), [b"{op"], ErrorCode.BAD_VALUE, "not UTF-8 JSON"),
        (_control(b"\xff\xfe"), [b"\xff\xfe"], ErrorCode.BAD_VALUE, "not UTF-8 JSON"),
        (_control(b"[1]"), [b"[1]"], ErrorCode.BAD_VALUE, 'expected {"op": "describe"}'),
        (_control(b'{"op":"x"}'), [b'{"op":"x"}'], ErrorCode.BAD_VALUE, "expected"),
        (_control(b'{"op":"status","x":1}'), [b'{"op":"status","x":1}'], ErrorCode.BAD_VALUE, ""),
        (_control(b"{}", target=1), [b"{}"], ErrorCode.BAD_VALUE, "target must be 0"),
        (_control(b"{}", job=77), [b"{}"], ErrorCode.WRONG_JOB, "job id 0x4d"),
        (_control(b"{}", dtype=DType.INT64), [b"{}"], ErrorCode.BAD_FRAMES, "one UTF-8 JSON"),
        (_control(b"x" * 5000), [b"x" * 5000], ErrorCode.BAD_FRAMES, "at most 4096"),
        (
            Header(MsgType.PING, dtype=DType.UINT8, shape=(1,), frames=1),
            [b"x"],
            ErrorCode.BAD_FRAMES,
            "PING takes no frames",
        ),  # fmt: skip
        (Header(MsgType.PULL), [], ErrorCode.UNEXPECTED, "does not take PULL"),
        (Header(MsgType.ACK), [], ErrorCode.UNEXPECTED, "does not take ACK"),
    ],
)
def test_bad_control_requests_and_foreign_messages_are_refused(server, header, frames, code, words):
    with pytest.raises(WireError) as caught:
        _call(server, header, frames)
    assert caught.value.code == code
    assert words in str(caught.value)
