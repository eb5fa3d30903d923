"""The MPMC queue: behaviour in one process, then producers and consumers in several processes
handing pool blocks to each other, every item delivered exactly once."""

import multiprocessing as mp
import os
import pickle
import time

import numpy as np
import pytest
from numba import njit

from hogwild.errors import HogwildError, SharedMemoryError
from hogwild.shm.atomics import atomic_add, atomic_load, cpu_relax
from hogwild.shm.pool import BufferPool, pool_alloc_cached, pool_free_cached, pool_offset
from hogwild.shm.pool_layout import ERR_EXHAUSTED
from hogwild.shm.pool_segment import SharedSegment
from hogwild.shm.queue import (
    MPMCQueue,
    QueueEmptyError,
    QueueFullError,
    queue_try_get,
    queue_try_put,
    queue_words,
)
from tests.proc.processes import compile_start_line, start_context, start_line

pytestmark = pytest.mark.kernel_free

START_METHODS = ["spawn", "forkserver"]


def _context(method: str) -> mp.context.BaseContext:
    return start_context(method, "hogwild.shm.pool", "hogwild.shm.queue")


# ------------------------------------------------------------------------------- one process


def test_fifo_full_and_empty():
    with MPMCQueue.create(4) as q:
        assert [q.try_put(i) for i in range(5)] == [True] * 4 + [False]
        assert len(q) == 4
        assert [q.try_get() for _ in range(5)] == [0, 1, 2, 3, None]
        assert len(q) == 0


def test_many_laps_keep_order_and_negative_values():
    with MPMCQueue.create(8) as q:
        got = []
        for i in range(1000):
            q.put(-i)
            if len(q) == q.capacity:
                got += [q.get() for _ in range(5)]
        while len(q):
            got.append(q.get())
        assert got == [-i for i in range(1000)]


def test_blocking_calls_time_out_with_typed_errors():
    with MPMCQueue.create(2) as q:
        t0 = time.monotonic()
        with pytest.raises(QueueEmptyError):
            q.get(timeout=0.05)
        q.put(1)
        q.put(2)
        with pytest.raises(QueueFullError):
            q.put(3, timeout=0.05)
        assert time.monotonic() - t0 < 5  # bounded, not a hang
        assert isinstance(QueueFullError("x"), HogwildError)


def test_capacity_must_be_a_power_of_two():
    for bad in (0, 1, 3, 12):
        with pytest.raises(ValueError):
            MPMCQueue.over(np.zeros(queue_words(16), np.int64), bad)


def test_queue_over_a_callers_array_and_from_numba():
    words = np.zeros(queue_words(16) + 5, np.int64)
    q = MPMCQueue.over(words, 16)
    assert _fill_then_drain(words, 40) == 16  # only 16 fit; drained in order
    assert q.try_get() is None
    again = MPMCQueue(words)  # an already initialized array
    assert again.capacity == 16
    with pytest.raises(TypeError):
        pickle.dumps(q)
    with pytest.raises(ValueError):
        MPMCQueue(np.zeros(queue_words(4), np.int64))


@njit(cache=True, nogil=True)
def _fill_then_drain(words, n):
    put = 0
    for i in range(n):
        if queue_try_put(words, i):
            put += 1
    for i in range(put):
        ok, v = queue_try_get(words)
        if not ok or v != i:
            return -1
    return put


def test_attach_and_pickle_share_one_queue():
    with MPMCQueue.create(4) as q:
        other = MPMCQueue.attach(q.name)
        again = pickle.loads(pickle.dumps(q))
        other.put(7)
        assert again.get() == 7
        other.close()
        again.close()
    with SharedSegment.create("test", 4096) as seg:
        with pytest.raises(SharedMemoryError):
            MPMCQueue.attach(seg.name)


# ------------------------------------------------------------------------- many processes

N_PRODUCERS = 2
N_CONSUMERS = 2
N_ITEMS = 20_000  # per producer
CAPACITY = 32
CHUNK = 2_000
# Bookkeeping words: [0] consumed count, [8] ready count, then one "seen" counter per item.
CONSUMED, READY, SEEN = 0, 8, 16


@njit(cache=True, nogil=True)
def _produce(q, ref, cache, data64, producer, start, stop, max_spins):
    """Put items ``start..stop-1``: each a pool block stamped with its id. Returns the next."""
    for i in range(start, stop):
        item = producer * N_ITEMS + i
        spins = 0
        h = pool_alloc_cached(ref, cache, 4096)
        while h == ERR_EXHAUSTED:  # consumers free blocks as they go
            spins += 1
            if spins > max_spins:
                return i
            cpu_relax()
            h = pool_alloc_cached(ref, cache, 4096)
        if h < 0:
            return -1
        first = pool_offset(ref, h) // 8
        data64[first] = item
        data64[first + 511] = ~item
        while not queue_try_put(q, h):
            spins += 1
            if spins > max_spins:
                pool_free_cached(ref, cache, h)
                return i
            cpu_relax()
    return stop


@njit(cache=True, nogil=True)
def _consume(q, ref, cache, data64, book, total, max_spins):
    """Take blocks until ``total`` were consumed by everyone (or ``max_spins`` idle tries)."""
    spins = 0
    while atomic_load(book, CONSUMED) < total:
        ok, h = queue_try_get(q)
        if not ok:
            spins += 1
            if spins > max_spins:
                return 1
            cpu_relax()
            continue
        first = pool_offset(ref, h) // 8
        item = data64[first]
        if data64[first + 511] != ~item or item < 0 or item >= total:
            return -2  # block contents damaged in transit
        atomic_add(book, SEEN + item, 1)
        if pool_free_cached(ref, cache, h) != 0:
            return -3
        atomic_add(book, CONSUMED, 1)
    return 0


def _wait_for_everyone(book, n: int) -> None:
    start_line(book, READY, n)


def _producer(q: MPMCQueue, pool: BufferPool, seg_name: str, producer: int, n_procs: int) -> None:
    seg = SharedSegment.attach(seg_name)
    book = seg.array(0, np.int64, SEEN + N_PRODUCERS * N_ITEMS)
    data64 = pool.data.view(np.int64)
    cache = pool.open_cache()
    _produce(q.ref, pool.ref, cache, data64, producer, 0, 0, 1)
    _wait_for_everyone(book, n_procs)
    deadline = time.monotonic() + 40
    i = 0
    while i < N_ITEMS:
        i = _produce(q.ref, pool.ref, cache, data64, producer, i, N_ITEMS, 100_000)
        if i < 0 or time.monotonic() > deadline:
            os._exit(3)
        os.sched_yield()
    pool.close_cache(cache)


def _consumer(q: MPMCQueue, pool: BufferPool, seg_name: str, n_procs: int) -> None:
    seg = SharedSegment.attach(seg_name)
    book = seg.array(0, np.int64, SEEN + N_PRODUCERS * N_ITEMS)
    data64 = pool.data.view(np.int64)
    total = N_PRODUCERS * N_ITEMS
    cache = pool.open_cache()
    _consume(q.ref, pool.ref, cache, data64, book, 0, 1)
    _wait_for_everyone(book, n_procs)
    deadline = time.monotonic() + 40
    while True:
        status = _consume(q.ref, pool.ref, cache, data64, book, total, 100_000)
        if status == 0:
            pool.close_cache(cache)
            return
        if status < 0 or time.monotonic() > deadline:
            os._exit(4)
        os.sched_yield()


@pytest.mark.parametrize("method", START_METHODS)
def test_every_item_delivered_exactly_once_across_processes(method):
    total = N_PRODUCERS * N_ITEMS
    n_procs = N_PRODUCERS + N_CONSUMERS
    with (
        MPMCQueue.create(CAPACITY) as q,
        BufferPool.create({4096: 2 * CAPACITY}) as pool,
        SharedSegment.create("test", 8 * (SEEN + total)) as seg,
    ):
        book = seg.array(0, np.int64, SEEN + total)
        # compiled here, once (no call changes anything: tests/proc/processes.py)
        compile_start_line(book)
        data64, cache = pool.data.view(np.int64), pool.open_cache()
        _produce(q.ref, pool.ref, cache, data64, 0, 0, 0, 1)
        _consume(q.ref, pool.ref, cache, data64, book, 0, 1)
        pool.close_cache(cache)
        del data64
        args = [(q, pool, seg.name, p, n_procs) for p in range(N_PRODUCERS)]
        args += [(q, pool, seg.name, n_procs)] * N_CONSUMERS
        ctx = _context(method)
        procs = [ctx.Process(target=_producer, args=a) for a in args[:N_PRODUCERS]]
        procs += [ctx.Process(target=_consumer, args=a) for a in args[N_PRODUCERS:]]
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + 90
        try:
            for proc in procs:
                proc.join(max(0.1, deadline - time.monotonic()))
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
                    proc.join()
        assert [p.exitcode for p in procs] == [0] * n_procs
        seen = book[SEEN:].copy()
        assert book[CONSUMED] == total
        assert np.all(seen == 1), (np.flatnonzero(seen != 1)[:10], seen[seen != 1][:10])
        assert len(q) == 0 and q.try_get() is None
        assert pool.in_use() == 0 and sum(s.cached for s in pool.stats()) == 0
        del book
