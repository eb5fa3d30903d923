"""Lock-free buffer pools: behaviour in one process, then a multi-process stress.

The stress has every process allocate and free thousands of blocks of random sizes, from numba
and from Python, and claim each block in a shared owner table with compare-and-swap: a block
handed out twice fails the claim; stamps written at both ends of a block must survive until it
is freed; at the end every free list must hold each of its blocks exactly once (none lost).
"""

import multiprocessing as mp
import pickle
from itertools import pairwise

import numpy as np
import pytest
from numba import njit

from hogwild.errors import HogwildError, SharedMemoryError
from hogwild.shm.atomics import atomic_cas
from hogwild.shm.pool import (
    BufferPool,
    DoubleFreeError,
    InvalidHandleError,
    PoolError,
    PoolExhaustedError,
    PoolRequestTooLargeError,
    handle_class,
    handle_index,
    pool_alloc,
    pool_alloc_cached,
    pool_block_id,
    pool_block_size,
    pool_free,
    pool_free_cached,
    pool_offset,
    size_class,
)
from hogwild.shm.pool_layout import (
    C_HEAD,
    C_LINK_BASE,
    CLASS_SIZES,
    EMPTY,
    ERR_BAD_HANDLE,
    ERR_DOUBLE_FREE,
    ERR_EXHAUSTED,
    HEAD_IDX_MASK,
    N_CLASSES,
    PoolLayout,
    class_base,
)
from hogwild.shm.pool_segment import SharedSegment
from tests.proc.processes import compile_start_line, run_processes, start_context, start_line

pytestmark = pytest.mark.kernel_free

START_METHODS = ["spawn", "forkserver"]


def _context(method: str) -> mp.context.BaseContext:
    return start_context(method, "hogwild.shm.pool")


def free_list(pool: BufferPool, c: int) -> list[int]:
    """The block indices on class ``c``'s free list, head first (pool must be quiescent)."""
    base = class_base(c)
    idx = int(pool.ctl[base + C_HEAD]) & HEAD_IDX_MASK
    out = []
    while idx != EMPTY and len(out) <= pool.layout.blocks[c]:
        out.append(idx)
        idx = int(pool.links[int(pool.ctl[base + C_LINK_BASE]) + idx])
    return out


# ------------------------------------------------------------------------------- one process


def test_size_classes_cover_4k_to_32m():
    assert CLASS_SIZES[0] == 4096 and CLASS_SIZES[-1] == 32 * 2**20 and N_CLASSES == 14
    assert [size_class(n) for n in (1, 4096, 4097, 8192, 2**25)] == [0, 0, 1, 1, 13]
    assert size_class(2**25 + 1) < 0 and size_class(0) < 0


def test_blocks_are_aligned_distinct_and_sized():
    with BufferPool.create({4096: 5, 8192: 3, 2**20: 2}) as pool:
        handles = [pool.allocate(n) for n in (1, 4096, 4097, 8000, 600_000, 2**20)]
        assert [pool.block_size(h) for h in handles] == [4096, 4096, 8192, 8192, 2**20, 2**20]
        extents = sorted((pool.offset(h), pool.offset(h) + pool.block_size(h)) for h in handles)
        assert all(start % 64 == 0 for start, _ in extents)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in pairwise(extents))
        assert all(end <= pool.data.size for _, end in extents)
        for h in handles:
            view = pool.view(h, np.float32)
            assert view.size == pool.block_size(h) // 4 and view.ctypes.data % 64 == 0
            view[:] = h
        for h in handles:
            assert np.all(pool.view(h, np.float32) == np.float32(h))
            pool.free(h)
        assert pool.in_use() == 0
        del view


def test_exhaustion_and_oversize_are_typed_errors_not_hangs():
    with BufferPool.create({4096: 2}) as pool:
        a, b = pool.allocate(10), pool.allocate(10)
        with pytest.raises(PoolExhaustedError, match="all 2 blocks of 4096 bytes in use"):
            pool.allocate(10)
        assert pool.try_allocate(10) is None
        with pytest.raises(PoolExhaustedError):
            pool.allocate(8192)  # a class with no blocks at all
        with pytest.raises(PoolRequestTooLargeError, match="33554433"):
            pool.allocate(2**25 + 1)
        with pytest.raises(PoolRequestTooLargeError):
            pool.allocate(0)
        assert isinstance(PoolExhaustedError("x"), HogwildError)
        pool.free(a)
        assert pool.allocate(1) == a  # LIFO reuse
        stats = pool.stats()
        assert stats[0].in_use == 2 and stats[0].high_water == 2 and stats[0].failures == 2
        assert stats[1].failures == 1
        pool.free(a)
        pool.free(b)


def test_double_free_and_bad_handles_are_caught():
    with BufferPool.create({4096: 2}) as pool:
        h = pool.allocate(1)
        pool.free(h)
        with pytest.raises(DoubleFreeError):
            pool.free(h)
        with pytest.raises(DoubleFreeError):
            pool.free(1)  # never allocated
        for bad in (-1, 2, 14 << 32, (1 << 32) | 0):
            with pytest.raises(InvalidHandleError):
                pool.free(bad)
        assert sorted(free_list(pool, 0)) == [0, 1]


def test_high_water_mark_and_free_list_integrity():
    with BufferPool.create([8] + [1] * 13) as pool:
        hs = [pool.allocate(4096) for _ in range(6)]
        for h in hs[:4]:
            pool.free(h)
        hs2 = [pool.allocate(100) for _ in range(3)]
        stats = pool.stats()
        assert stats[0].in_use == 5 and stats[0].high_water == 6
        assert len(set(free_list(pool, 0)) | {handle_index(h) for h in hs[4:] + hs2}) == 8
        for h in hs[4:] + hs2:
            pool.free(h)
        assert sorted(free_list(pool, 0)) == list(range(8))


def test_attach_by_name_and_pickle_share_the_same_blocks():
    with BufferPool.create({4096: 4}) as pool:
        other = BufferPool.attach(pool.name)
        again = pickle.loads(pickle.dumps(pool))
        h = other.allocate(1)
        pool.view(h)[:3] = [1, 2, 3]
        assert list(again.view(h)[:3]) == [1, 2, 3]
        again.free(h)
        assert pool.in_use() == 0
        other.close()
        again.close()


def test_a_private_pool_has_no_name_to_leave_behind_and_cannot_be_handed_on():
    import os

    def ours() -> set[str]:  # this process's pool segments (other processes come and go)
        return {n for n in os.listdir("/dev/shm") if n.startswith(f"hogwild-pool-{os.getpid()}-")}

    before = ours()
    with BufferPool.create({4096: 4, 1 << 20: 2}, private=True) as pool:
        assert pool.name == "" and ours() == before
        h = pool.allocate(1 << 20)
        pool.view(h)[:3] = [7, 8, 9]
        assert list(pool.view(h)[:3]) == [7, 8, 9] and pool.in_use() == 1
        pool.free(h)
        assert pool.in_use() == 0
        with pytest.raises(TypeError, match="private pool"):
            pickle.dumps(pool)


def test_attach_rejects_a_segment_that_is_no_pool():
    with SharedSegment.create("test", 4096) as seg:
        with pytest.raises(SharedMemoryError, match="buffer pool"):
            BufferPool.attach(seg.name)
    with pytest.raises(SharedMemoryError):
        BufferPool.attach("/hogwild-test-1-1-deadbeef")


@pytest.mark.parametrize("blocks", [{5000: 1}, [1, 2, 3], -1, 2**22])
def test_layout_rejects_bad_counts(blocks):
    with pytest.raises(ValueError):
        PoolLayout.compute(blocks)


def test_large_pool_costs_address_space_not_memory():
    with BufferPool.create({2**25: 64}) as pool:  # 2 GiB of blocks, untouched
        assert pool.layout.total_bytes > 2**31
        h = pool.allocate(2**25)
        assert pool.block_size(h) == 2**25
        pool.free(h)


@njit(cache=True, nogil=True)
def _cached_round(ref, cache, n, nbytes):
    """Allocate ``n`` blocks through the cache, free them all; handles, or an error code."""
    hs = np.empty(n, np.int64)
    for i in range(n):
        hs[i] = pool_alloc_cached(ref, cache, nbytes)
        if hs[i] < 0:
            return hs[: i + 1]
    for i in range(n):
        if pool_free_cached(ref, cache, hs[i]) != 0:
            hs[i] = -99
    return hs


def test_cache_refills_spills_and_flushes_in_batches():
    with BufferPool.create({4096: 256, 8192: 8}, max_caches=4) as pool:
        cache = pool.open_cache()
        hs = _cached_round(pool.ref, cache, 100, 4096)
        assert len(set(hs.tolist())) == 100 and hs.min() >= 0
        s = pool.stats()[0]
        assert s.in_use == 0 and 0 < s.cached <= 32 and s.high_water >= 100
        hs = _cached_round(pool.ref, cache, 3, 8000)  # 8 blocks: never cached
        assert hs.min() >= 0 and pool.stats()[1].cached == 0
        h = pool_alloc_cached(pool.ref, cache, 1)
        assert pool_free_cached(pool.ref, cache, h) == 0
        assert pool_free_cached(pool.ref, cache, h) == ERR_DOUBLE_FREE
        assert pool_free_cached(pool.ref, cache, -1) == ERR_BAD_HANDLE
        assert pool.close_cache(cache) == s.cached
        assert pool.stats()[0].cached == 0
        assert sorted(free_list(pool, 0)) == list(range(256))


def test_cached_exhaustion_is_an_error_code():
    with BufferPool.create({4096: 16}) as pool:  # batch of 1
        cache = pool.open_cache()
        hs = _cached_round(pool.ref, cache, 17, 4096)
        assert len(hs) == 17 and hs[-1] == ERR_EXHAUSTED and pool.stats()[0].failures == 1


def test_cache_slots_run_out_then_dead_owners_are_reclaimed():
    with BufferPool.create({4096: 64}, max_caches=2) as pool:
        a, b = pool.open_cache(), pool.open_cache()
        with pytest.raises(PoolError, match="all 2 cache slots"):
            pool.open_cache()
        hs = _cached_round(pool.ref, a, 10, 4096)
        assert hs.min() >= 0 and pool.stats()[0].cached > 0
        pool._slots[0] = 2**22 + 4321  # slot a now "belongs" to a process that does not exist
        c = pool.open_cache()
        assert c == a and pool.stats()[0].cached == 0  # reclaimed, its blocks back
        pool.close_cache(b)


# ------------------------------------------------------------------------- many processes

STRESS_BLOCKS = {4096: 256, 8192: 24, 16384: 24, 32768: 12, 65536: 12, 131072: 6, 2**20: 3}
STRESS_CLASSES = 9  # classes 0..8 are requested; 7 (512 KiB) has no blocks: always exhausted
N_HOT_OPS = 30_000
N_OPS = 20_000
MAX_HOLD = 16
PY_OPS = 1_000


@njit(cache=True, nogil=True)
def _claim(ref, owner, h, old, new):
    return atomic_cas(owner, pool_block_id(ref, h), old, new) == old


@njit(cache=True, nogil=True)
def _stamp(ref, h):
    first = pool_offset(ref, h) // 8
    return first, first + pool_block_size(ref, h) // 8 - 1


@njit(cache=True, nogil=True)
def _release(ref, cache, data64, owner, wid, h):
    first, last = _stamp(ref, h)
    if data64[first] != (wid << 32) | h or data64[last] != ~((wid << 32) | h):
        return -100  # someone else wrote into our block
    if not _claim(ref, owner, h, wid + 1, 0):
        return -101
    err = pool_free_cached(ref, cache, h) if cache else pool_free(ref, h)
    return -102 if err else 0


@njit(cache=True, nogil=True)
def _stress(ref, cache, data64, owner, wid, n_ops, seed, n_classes, max_hold):
    """Random allocate/free; ``cache`` 0 uses the shared lists only. Refusals, or an error < 0."""
    np.random.seed(seed)
    held = np.empty(max_hold, np.int64)
    n_held = 0
    exhausted = 0
    for _ in range(n_ops):
        if n_held == max_hold or (n_held > 0 and np.random.random() < 0.5):
            k = np.random.randint(n_held)
            h = held[k]
            held[k] = held[n_held - 1]
            n_held -= 1
            err = _release(ref, cache, data64, owner, wid, h)
            if err:
                return err
        else:
            c = np.random.randint(n_classes)
            size = 4096 << c
            nbytes = np.random.randint(size // 2 + 1, size + 1) if c else np.random.randint(1, 4097)
            h = pool_alloc_cached(ref, cache, nbytes) if cache else pool_alloc(ref, nbytes)
            if h == ERR_EXHAUSTED:
                exhausted += 1
                continue
            if h < 0 or pool_block_size(ref, h) < nbytes or handle_class(h) != c:
                return -103
            if not _claim(ref, owner, h, 0, wid + 1):
                return -104  # handed out twice
            first, last = _stamp(ref, h)
            data64[first] = (wid << 32) | h
            data64[last] = ~((wid << 32) | h)
            held[n_held] = h
            n_held += 1
    for k in range(n_held):
        err = _release(ref, cache, data64, owner, wid, held[k])
        if err:
            return err
    return exhausted


def _python_stress(pool: BufferPool, data64, owner, wid: int, exhausted: int) -> int:
    """The same as ``_stress``, through the pool's Python methods."""
    rng = np.random.default_rng(wid)
    held: list[int] = []
    for _ in range(PY_OPS):
        if held and (len(held) == MAX_HOLD or rng.random() < 0.5):
            h = held.pop(int(rng.integers(len(held))))
            err = _release(pool.ref, 0, data64, owner, wid, h)
            if err:
                return err
            continue
        h = pool.try_allocate(int(rng.integers(1, 2**17)))
        if h is None:
            exhausted += 1
            continue
        if not _claim(pool.ref, owner, h, 0, wid + 1):
            return -104
        first, last = _stamp(pool.ref, h)
        data64[first], data64[last] = (wid << 32) | h, ~((wid << 32) | h)
        held.append(h)
    for h in held:
        err = _release(pool.ref, 0, data64, owner, wid, h)
        if err:
            return err
    return exhausted


def _compile_python_calls() -> None:
    """Compile what :func:`_python_stress` calls from Python (``_claim``, ``_stamp``,
    ``_release``), with its argument types, by one block's round trip on a throwaway one-block
    pool of the same numba types, so that the pool under test is left untouched (its class 0's
    high-water mark shows the children's use alone): the children load them from numba's cache
    instead of each compiling them at once on the same cores (from a cold cache, under
    ``spawn``, every child did)."""
    with BufferPool.create({4096: 1}) as pool:
        owner = np.zeros(pool.layout.total_blocks, np.int64)
        data64 = pool.data.view(np.int64)
        h = pool.try_allocate(4096)
        claimed = h is not None and _claim(pool.ref, owner, h, 0, 1)
        if not claimed:
            raise AssertionError(f"the throwaway pool's block {h} could not be claimed")
        first, last = _stamp(pool.ref, h)
        data64[first], data64[last] = h, ~h  # worker 0's stamps: (0 << 32) | h
        released = _release(pool.ref, 0, data64, owner, 0, h)
        if released:
            raise AssertionError(f"the throwaway pool's block {h} was not released: {released}")
        del data64


def _stress_worker(pool: BufferPool, seg_name: str, wid: int, n_procs: int) -> None:
    seg = SharedSegment.attach(seg_name)
    owner = seg.array(0, np.int64, pool.layout.total_blocks)
    results = seg.array(8 * pool.layout.total_blocks, np.int64, 16)
    data64 = pool.data.view(np.int64)
    cache = pool.open_cache()
    _stress(pool.ref, cache, data64, owner, wid, 0, 0, 1, 1)  # load before the start line
    start_line(results, 15, n_procs)
    outcome = 0
    for use, hot_hold in ((0, 4), (cache, 40)):  # shared lists only, then through a cache
        # Hot phase: everyone on the 4 KiB class, where races on one list head are likeliest
        # (holding up to 40 blocks, the cache refills and spills batches of 16 all the time);
        # then random sizes over nine classes, one of them empty.
        for n_ops, n_classes, hold in (
            (N_HOT_OPS, 1, hot_hold),
            (N_OPS, STRESS_CLASSES, MAX_HOLD),
        ):
            if outcome >= 0:
                got = _stress(pool.ref, use, data64, owner, wid, n_ops, 7 + wid, n_classes, hold)
                outcome = got if got < 0 else outcome + got
    pool.close_cache(cache)
    if outcome >= 0:
        outcome = _python_stress(pool, data64, owner, wid, outcome)
    results[wid] = outcome
    del owner, results, data64
    seg.close()
    pool.close()


@pytest.mark.parametrize("method", START_METHODS)
def test_multiprocess_stress_no_block_twice_none_lost(method):
    n_procs = 3
    with BufferPool.create(STRESS_BLOCKS) as pool:
        n = pool.layout.total_blocks
        with SharedSegment.create("test", 8 * (n + 16)) as seg:
            owner = seg.array(0, np.int64, n)
            results = seg.array(8 * n, np.int64, 16)
            results[:n_procs] = -999
            # compiled here, once (no call changes anything: tests/proc/processes.py)
            compile_start_line(results)
            data64, cache = pool.data.view(np.int64), pool.open_cache()
            _stress(pool.ref, cache, data64, owner, 0, 0, 0, 1, 1)
            pool.close_cache(cache)
            del data64
            _compile_python_calls()
            codes = run_processes(
                _context(method),
                _stress_worker,
                [(pool, seg.name, w, n_procs) for w in range(n_procs)],
            )
            assert codes == [0] * n_procs
            outcomes = results[:n_procs].copy()
            assert np.all(outcomes >= 0), outcomes  # no double handout, overwrite or bad free
            assert np.all(owner == 0)
            del owner, results
        stats = pool.stats()
        assert sum(s.failures for s in stats) == int(outcomes.sum())  # every refusal counted
        assert stats[7].failures > 0  # the empty class refused, and nothing hung
        for c, s in enumerate(stats):
            assert s.in_use == 0
            assert s.high_water <= s.blocks
            assert sorted(free_list(pool, c)) == list(range(s.blocks))  # none lost, none twice
            assert s.cached == 0
            if s.blocks:
                assert s.high_water > 0
