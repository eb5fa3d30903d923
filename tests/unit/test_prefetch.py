"""The prefetch thread and a worker's feed: order, buffer reuse, running ahead, errors, timeouts,
cancellation and shutdown. No timings: waits are on events, each with a timeout."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from hogwild.data.augment import Augmenter, AugmentSpec
from hogwild.data.feed import ArrayReader, WorkerFeed, compile_data_kernels
from hogwild.data.prefetch import Prefetcher, PrefetchTimeoutError

# it calls kernels tests.warm_kernels compiles: it runs once they are in numba's cache
pytestmark = pytest.mark.warmed_kernels

WAIT_S = 10.0


def _allocate():
    return np.zeros(4, np.int64)


def _copy_fetch(request, buffer):
    buffer[: len(request)] = request


def _chunks(n, size=4):
    return [np.arange(lo, min(lo + size, n)) for lo in range(0, n, size)]


def test_batches_arrive_in_order_in_reused_buffers():
    with Prefetcher(_copy_fetch, _allocate, depth=2) as prefetcher:
        prefetcher.start(_chunks(40))
        seen, slots, ids = [], set(), set()
        for batch in prefetcher:
            seen.extend(batch.buffers[: len(batch.request)].tolist())
            slots.add(batch.slot)
            ids.add(id(batch.buffers))
        assert seen == list(range(40))
        assert slots == {0, 1, 2} and len(ids) == 3  # depth + 1 buffers, allocated once
        assert prefetcher.batches == 10 and prefetcher.wait_s >= 0.0
        with pytest.raises(RuntimeError, match="no sequence started"):
            prefetcher.get()  # the sequence is over; nothing is pending


def test_the_thread_fetches_ahead_of_the_consumer():
    fetched = []
    progressed = threading.Condition()

    def fetch(request, buffer):
        with progressed:
            fetched.append(int(request[0]))
            progressed.notify_all()

    with Prefetcher(fetch, _allocate, depth=3) as prefetcher:
        prefetcher.start(_chunks(40))
        first = prefetcher.get()
        assert first.request[0] == 0
        with progressed:  # while batch 0 is in use, batches 1..3 get fetched, and no more
            assert progressed.wait_for(lambda: len(fetched) >= 4, WAIT_S)
        assert fetched == [0, 4, 8, 12]
        prefetcher.cancel()


def test_sequences_queue_so_the_next_epoch_is_ready_early():
    with Prefetcher(_copy_fetch, _allocate, depth=2) as prefetcher:
        prefetcher.start(_chunks(8))
        prefetcher.start(_chunks(8, size=2))
        first = [b.request.tolist() for b in prefetcher]
        second = [b.request.tolist() for b in prefetcher]
        assert first == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert second == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_fetch_errors_reach_the_consumer_in_order():
    def fetch(request, buffer):
        if request[0] == 8:
            raise OSError("disk on fire")
        buffer[: len(request)] = request

    with Prefetcher(fetch, _allocate) as prefetcher:
        prefetcher.start(_chunks(20))
        assert prefetcher.get().request[0] == 0
        assert prefetcher.get().request[0] == 4
        with pytest.raises(OSError, match="disk on fire"):
            prefetcher.get()
        prefetcher.start(_chunks(4))  # the thread survives for the next sequence
        assert [b.request[0] for b in prefetcher] == [0]


def test_a_stalled_fetch_times_out_instead_of_hanging():
    release = threading.Event()

    def fetch(request, buffer):
        release.wait(WAIT_S)

    prefetcher = Prefetcher(fetch, _allocate, timeout_s=0.2)
    try:
        prefetcher.start(_chunks(8))
        with pytest.raises(PrefetchTimeoutError, match="no batch from the prefetch thread"):
            prefetcher.get()
    finally:
        release.set()
        prefetcher.close()
    assert not prefetcher.alive


def test_cancel_drops_the_rest_of_an_epoch():
    with Prefetcher(_copy_fetch, _allocate, depth=2) as prefetcher:
        prefetcher.start(_chunks(400))
        prefetcher.start(_chunks(400))
        assert prefetcher.get().request[0] == 0
        prefetcher.cancel()
        prefetcher.start([np.array([1000, 1001])])
        got = [b.buffers[:2].tolist() for b in prefetcher]
        assert got == [[1000, 1001]]


def test_misuse_is_reported():
    prefetcher = Prefetcher(_copy_fetch, _allocate)
    with pytest.raises(RuntimeError, match="no sequence started"):
        prefetcher.get()
    prefetcher.close()
    assert not prefetcher.alive
    with pytest.raises(RuntimeError, match="closed"):
        prefetcher.start(_chunks(4))
    with pytest.raises(ValueError, match="depth"):
        Prefetcher(_copy_fetch, _allocate, depth=0)


def _mnist_like(n=50, shape=(12, 10)):
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (n, *shape), dtype=np.uint8), rng.integers(0, 10, n)


def test_feed_delivers_augmented_batches_of_the_shard():
    images, labels = _mnist_like()
    spec = AugmentSpec.parse("translate=0.1,rotate=10,crop=8")
    order = np.random.default_rng(1).permutation(50)[:23]
    with WorkerFeed(ArrayReader(images, labels), batch=5, augment=spec, seed=3) as feed:
        assert feed.output_shape == (1, 8, 8)
        for epoch in (0, 1):
            feed.start_epoch(epoch, order)
            # A batch is lent until the next one is asked for: keep copies.
            batches = [(b.images.copy(), b.labels.copy(), b.epoch) for b in feed]
            assert [len(b[1]) for b in batches] == [5, 5, 5, 5, 3]
            assert {b[2] for b in batches} == {epoch}
            got = np.concatenate([b[0] for b in batches])
            np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), labels[order])
            expected = np.empty((23, 8, 8), np.uint8)
            Augmenter(spec, 3)(images[order], expected, epoch, order)
            np.testing.assert_array_equal(got[:, 0], expected)
        assert feed.wait_s >= 0.0


def test_feed_without_augmentation_and_for_evaluation():
    images, labels = _mnist_like(shape=(12, 10))
    reader = ArrayReader(images, labels)
    with WorkerFeed(reader, batch=8) as feed:
        feed.start_epoch(0, np.arange(20))
        got = np.concatenate([b.images.copy() for b in feed])
        np.testing.assert_array_equal(got[:, 0], images[:20])
    rgb = np.random.default_rng(2).integers(0, 256, (9, 6, 6, 3), dtype=np.uint8)
    spec = AugmentSpec.parse("hflip,crop=4")
    with WorkerFeed(ArrayReader(rgb, np.arange(9)), batch=4, augment=spec, train=False) as feed:
        feed.start_epoch(5, np.arange(9))
        got = np.concatenate([b.images.copy() for b in feed])
        np.testing.assert_array_equal(got, rgb[:, 1:5, 1:5].transpose(0, 3, 1, 2))  # centre view


def test_array_reader_validates():
    with pytest.raises(ValueError, match="uint8"):
        ArrayReader(np.zeros((2, 3, 3), np.float32), np.zeros(2))
    with pytest.raises(ValueError, match="labels"):
        ArrayReader(np.zeros((2, 3, 3), np.uint8), np.zeros(3))
    reader = ArrayReader(np.zeros((2, 3, 3), np.uint8), np.zeros(2, np.int32))
    out, labels = np.empty((2, 3, 3, 1), np.uint8), np.empty(2, np.int32)
    with pytest.raises(IndexError, match="record index 2 outside 0..1"):
        reader.read([0, 2], out, labels)


def test_data_kernels_compile_ahead_of_the_workers():
    compile_data_kernels()  # what the parent runs before starting workers; idempotent
    compile_data_kernels()
