"""Buffer-pool allocate+free rate: the lock-free pool beside a semaphore-guarded one and numpy.

Adam §3.3.1 allocates its parameter servers' buffers from lock-free pools "critical to achieving
good system scalability". This benchmark measures :class:`hogwild.shm.pool.BufferPool` in 1 and 2
processes (pinned by :mod:`hogwild.numa.placement`'s plan), two ways: **lockfree_cached** (the
fast path: each process allocates through its own cache slot, which refills from and spills to
the shared lock-free lists 16 blocks at a time) and **lockfree** (every operation on the shared
lists: one compare-and-swap each), beside, from the same run:

- **semaphore**: a real alternative pool in shared memory: the same size classes and blocks, each
  class's free blocks on a stack (an index array and a top), the same in-use and high-water
  counters, every allocate and free under one ``posix_ipc.Semaphore`` (glibc's futex-based POSIX
  semaphore; from numba through ``sem_wait``/``sem_post`` on the semaphore opened by name);
- **numpy**: ``np.empty`` of the same sizes, dropped at once (process-private malloc: no sharing,
  the floor of what allocation costs here).

All numba loops reach their pool through an address (an int), so none pays numba's array
reference counting. The semaphore pool has no per-process cache: caching in front of it would
narrow the gap to ``lockfree_cached``; ``lockfree`` against ``semaphore`` compares the lock-free
and the locked free lists alone.

Each process keeps ``--depth`` blocks outstanding and, per pair, frees the oldest and allocates a
block of the next size from a fixed random sequence (1 byte to 64 KiB, five classes). Hot paths
run two ways: a numba loop (how hogwild's kernels use pools) and a Python loop (one call per
operation). Rates are pairs per second summed over the processes, medians of ``--repeats``
interleaved repetitions of ``--seconds`` each. ``speedup_vs_semaphore_2proc`` is the cached
lock-free pool's numba rate over the semaphore pool's numba rate with 2 processes (target: >= 5);
``..._uncached`` the same for the shared lists alone.

Run: ``python bench/figures/buffer_pools.py [--seconds 0.3] [--repeats 3] [--out
bench/results/pools.json]``; it prints one JSON line.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import secrets
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import posix_ipc
from numba import njit

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.support.machine import Gang, describe_machine, versions
from bench.support.record import command_line, emit_record
from hogwild.numa.placement import plan_workers
from hogwild.numa.topology import read_topology
from hogwild.shm.atomics import raw_load_relaxed, raw_store_relaxed
from hogwild.shm.pool import BufferPool, pool_alloc, pool_alloc_cached, pool_free, pool_free_cached
from hogwild.shm.pool_segment import SharedSegment

N_CLASSES = 5  # 4 KiB .. 64 KiB
BLOCKS = 256  # per class, in both pools (the lock-free pool's caches move batches of 16)
N_SIZES = 4096
CHUNK = 20_000  # numba pairs between clock checks
PY_CHUNK = 500
KINDS = ("lockfree_cached_numba", "lockfree_numba", "semaphore_numba", "lockfree_python",
         "semaphore_python", "numpy_python", "numpy_numba")  # fmt: skip


def request_sizes(seed: int = 0) -> np.ndarray:
    """The request sizes every method allocates, in order: 1 B .. 64 KiB, five classes."""
    rng = np.random.default_rng(seed)
    cls = rng.integers(0, N_CLASSES, N_SIZES)
    top = 4096 << cls
    return rng.integers(np.where(cls == 0, 1, top // 2 + 1), top + 1).astype(np.int64)


# ------------------------------------------------------------------ the semaphore-guarded pool


class SemaphorePool:
    """A shared-memory pool whose free stacks are guarded by one POSIX semaphore.

    Words (int64) of its segment: per class ``c`` a line ``[top, in_use, high_water]`` at
    ``8 * c``, then the stacks, ``BLOCKS`` block indices per class. Handles are
    ``class << 32 | index``, as the lock-free pool's.
    """

    def __init__(self, segment: SharedSegment, sem_name: str, owner: bool):
        self.segment = segment
        self.sem_name = sem_name
        self.words = segment.array(0, np.int64, 8 * N_CLASSES + N_CLASSES * BLOCKS)
        self.ref = int(self.words.ctypes.data)
        self.sem = posix_ipc.Semaphore(sem_name)
        self.owner = owner
        libc = ctypes.CDLL(None)
        libc.sem_open.restype = ctypes.c_size_t
        libc.sem_open.argtypes = [ctypes.c_char_p, ctypes.c_int]
        self.sem_ptr = libc.sem_open(sem_name.encode(), 0)  # the same semaphore, for numba
        if not self.sem_ptr:
            raise OSError(f"sem_open({sem_name}) failed")

    @classmethod
    def create(cls) -> SemaphorePool:
        seg = SharedSegment.create("bench", 8 * (8 * N_CLASSES + N_CLASSES * BLOCKS))
        words = seg.array(0, np.int64, 8 * N_CLASSES + N_CLASSES * BLOCKS)
        for c in range(N_CLASSES):
            words[8 * c] = BLOCKS
            base = 8 * N_CLASSES + c * BLOCKS
            words[base : base + BLOCKS] = np.arange(BLOCKS)
        name = f"/hogwild-bench-sem-{os.getpid()}-{secrets.token_hex(4)}"
        posix_ipc.Semaphore(name, posix_ipc.O_CREX, initial_value=1).close()
        return cls(seg, name, owner=True)

    @classmethod
    def attach(cls, seg_name: str, sem_name: str) -> SemaphorePool:
        return cls(SharedSegment.attach(seg_name), sem_name, owner=False)

    def allocate(self, nbytes: int) -> int:
        c = max(0, (int(nbytes) - 1).bit_length() - 12)
        w = self.words
        self.sem.acquire()
        try:
            top = w[8 * c]
            if top == 0:
                raise MemoryError("semaphore pool exhausted")
            w[8 * c] = top - 1
            h = (c << 32) | int(w[8 * N_CLASSES + c * BLOCKS + top - 1])
            w[8 * c + 1] += 1
            if w[8 * c + 1] > w[8 * c + 2]:
                w[8 * c + 2] = w[8 * c + 1]
        finally:
            self.sem.release()
        return h

    def free(self, h: int) -> None:
        c = h >> 32
        w = self.words
        self.sem.acquire()
        try:
            top = w[8 * c]
            w[8 * N_CLASSES + c * BLOCKS + top] = h & 0xFFFFFFFF
            w[8 * c] = top + 1
            w[8 * c + 1] -= 1
        finally:
            self.sem.release()

    def close(self) -> None:
        self.sem.close()
        if self.owner:
            posix_ipc.unlink_semaphore(self.sem_name)
        self.segment.close()


_libc = ctypes.CDLL(None)
_sem_wait = _libc.sem_wait
_sem_wait.argtypes, _sem_wait.restype = [ctypes.c_size_t], ctypes.c_int
_sem_post = _libc.sem_post
_sem_post.argtypes, _sem_post.restype = [ctypes.c_size_t], ctypes.c_int


@njit(nogil=True)
def _sem_alloc(sem, w, nbytes):
    """Pop a block under the semaphore; ``w`` is the address of the pool's words."""
    c = 0
    while (4096 << c) < nbytes:
        c += 1
    _sem_wait(sem)
    top = raw_load_relaxed(w, 8 * c)
    if top == 0:
        _sem_post(sem)
        return -1
    raw_store_relaxed(w, 8 * c, top - 1)
    h = (c << 32) | raw_load_relaxed(w, 8 * N_CLASSES + c * BLOCKS + top - 1)
    in_use = raw_load_relaxed(w, 8 * c + 1) + 1
    raw_store_relaxed(w, 8 * c + 1, in_use)
    if in_use > raw_load_relaxed(w, 8 * c + 2):
        raw_store_relaxed(w, 8 * c + 2, in_use)
    _sem_post(sem)
    return h


@njit(nogil=True)
def _sem_free(sem, w, h):
    c = h >> 32
    _sem_wait(sem)
    top = raw_load_relaxed(w, 8 * c)
    raw_store_relaxed(w, 8 * N_CLASSES + c * BLOCKS + top, h & 0xFFFFFFFF)
    raw_store_relaxed(w, 8 * c, top + 1)
    raw_store_relaxed(w, 8 * c + 1, raw_load_relaxed(w, 8 * c + 1) - 1)
    _sem_post(sem)


# -------------------------------------------------------------------------- timed numba loops
# Pools are passed by address (an int), so no loop pays numba's array reference counting.


@njit(nogil=True)
def _semaphore_pairs(sem, w, sizes, ring, start, n):
    depth = ring.shape[0]
    for i in range(start, start + n):
        k = i % depth
        if ring[k] >= 0:
            _sem_free(sem, w, ring[k])
        ring[k] = _sem_alloc(sem, w, sizes[i % sizes.shape[0]])
        if ring[k] < 0:
            return -1
    return n


@njit(cache=True, nogil=True)
def _lockfree_pairs(ref, sizes, ring, start, n):
    depth = ring.shape[0]
    for i in range(start, start + n):
        k = i % depth
        if ring[k] >= 0:
            pool_free(ref, ring[k])
        ring[k] = pool_alloc(ref, sizes[i % sizes.shape[0]])
        if ring[k] < 0:
            return -1
    return n


@njit(cache=True, nogil=True)
def _cached_pairs(ref, cache, sizes, ring, start, n):
    depth = ring.shape[0]
    for i in range(start, start + n):
        k = i % depth
        if ring[k] >= 0:
            pool_free_cached(ref, cache, ring[k])
        ring[k] = pool_alloc_cached(ref, cache, sizes[i % sizes.shape[0]])
        if ring[k] < 0:
            return -1
    return n


@njit(cache=True, nogil=True)
def _numpy_pairs(sizes, sink, start, n):
    for i in range(start, start + n):
        a = np.empty(sizes[i % sizes.shape[0]], np.uint8)
        sink[0] += a.shape[0]  # keeps the allocation from being optimised away
    return n


_ATTACHED: dict = {}


def _pools(pool_name: str, seg_name: str, sem_name: str):
    """This member's attachments: (pool, its cache slot, semaphore pool), made once."""
    key = (pool_name, seg_name, sem_name)
    if key not in _ATTACHED:
        pool = BufferPool.attach(pool_name)
        _ATTACHED[key] = (pool, pool.open_cache(), SemaphorePool.attach(seg_name, sem_name))
    return _ATTACHED[key]


def detach(*, ready):
    """Last task of a member: return its cache's blocks and detach."""
    ready()
    for pool, cache, spool in _ATTACHED.values():
        pool.close_cache(cache)
        pool.close()
        spool.close()
    _ATTACHED.clear()
    return 0


def measure(kind, names, sizes, depth, seconds, active, *, ready):
    """One gang member's share of one measurement: ``(pairs, seconds)`` (0 pairs if idle)."""
    pool, cache, spool = _pools(*names)
    ring = np.full(depth, -1, np.int64)
    sink = np.zeros(1, np.int64)
    ops = {
        "lockfree_cached_numba": lambda i, n: _cached_pairs(pool.ref, cache, sizes, ring, i, n),
        "lockfree_numba": lambda i, n: _lockfree_pairs(pool.ref, sizes, ring, i, n),
        "semaphore_numba": lambda i, n: _semaphore_pairs(
            spool.sem_ptr, spool.ref, sizes, ring, i, n
        ),
        "numpy_numba": lambda i, n: _numpy_pairs(sizes, sink, i, n),
        "lockfree_python": lambda i, n: _python_pairs(pool, sizes, ring, i, n),
        "semaphore_python": lambda i, n: _python_pairs(spool, sizes, ring, i, n),
        "numpy_python": lambda i, n: _numpy_python(sizes, i, n),
    }
    op = ops[kind]
    chunk = CHUNK if kind.endswith("numba") else PY_CHUNK
    op(0, 2 * depth)  # warm up (compile or load), and leave the ring full
    ready()
    if not active:
        _drain(kind, pool, spool, ring)
        return 0, seconds
    done = 2 * depth
    t0 = time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        if op(done, chunk) < 0:
            raise RuntimeError(f"{kind}: pool exhausted")
        done += chunk
    _drain(kind, pool, spool, ring)
    return done - 2 * depth, elapsed


def _drain(kind, pool, spool, ring):
    for h in ring:
        if h >= 0 and kind.startswith("lockfree"):
            pool.free(int(h))
        elif h >= 0 and kind.startswith("semaphore"):
            spool.free(int(h))
    ring[:] = -1


def _python_pairs(pool, sizes, ring, start, n):
    depth = len(ring)
    sizes_list = sizes.tolist()
    for i in range(start, start + n):
        k = i % depth
        if ring[k] >= 0:
            pool.free(int(ring[k]))
        ring[k] = pool.allocate(sizes_list[i % N_SIZES])
    return n


def _numpy_python(sizes, start, n):
    sizes_list = sizes.tolist()
    for i in range(start, start + n):
        a = np.empty(sizes_list[i % N_SIZES], np.uint8)
        del a
    return n


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=0.3, help="per measurement (s)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repetitions")
    parser.add_argument("--depth", type=int, default=4, help="blocks outstanding per process")
    parser.add_argument("--out", type=Path, help="also write the JSON line to this file")
    args = parser.parse_args(argv)

    topology = read_topology()
    plan = plan_workers(topology, 2)
    sizes = request_sizes()
    pool = BufferPool.create([BLOCKS] * N_CLASSES + [0] * 9)
    spool = SemaphorePool.create()
    names = (pool.name, spool.segment.name, spool.sem_name)
    samples: dict[str, list[float]] = {f"{k}_{p}proc": [] for k in KINDS for p in (1, 2)}
    try:
        with Gang(2, cpu_sets=[[p.cpu] for p in plan], name="bench-pools") as gang:
            for rep in range(args.repeats):
                order = KINDS[rep % len(KINDS) :] + KINDS[: rep % len(KINDS)]
                for kind in order:
                    for procs in (1, 2):
                        per_rank = [
                            (kind, names, sizes, args.depth, args.seconds, rank < procs)
                            for rank in range(2)
                        ]
                        _, answers = gang.run(measure, per_rank)
                        rate = sum(pairs / secs for pairs, secs in answers)
                        samples[f"{kind}_{procs}proc"].append(rate)
            gang.run(detach, [(), ()])
        assert pool.in_use() == 0, pool.stats()
    finally:
        pool.close()
        spool.close()
    rates = {k: round(statistics.median(v)) for k, v in samples.items()}

    def ratio(ours: str, theirs: str, procs: int) -> float:
        return round(rates[f"{ours}_{procs}proc"] / rates[f"{theirs}_{procs}proc"], 2)

    result = {
        "benchmark": "pools",
        "command": command_line(__file__, argv or sys.argv[1:]),
        "unit": "allocate+free pairs per second, summed over processes (median)",
        "sizes": "1 B .. 64 KiB, 5 classes, fixed random sequence",
        "depth": args.depth,
        "seconds_per_measurement": args.seconds,
        "repeats": args.repeats,
        "pinned_cpus": [p.cpu for p in plan],
        "rates": rates,
        "rates_min_max": {k: [round(min(v)), round(max(v))] for k, v in samples.items()},
        "speedup_vs_semaphore_2proc": ratio("lockfree_cached_numba", "semaphore_numba", 2),
        "speedup_vs_semaphore_2proc_uncached": ratio("lockfree_numba", "semaphore_numba", 2),
        "speedup_vs_semaphore_2proc_python": ratio("lockfree_python", "semaphore_python", 2),
        "speedup_vs_semaphore_1proc": ratio("lockfree_cached_numba", "semaphore_numba", 1),
        "speedup_vs_semaphore_1proc_uncached": ratio("lockfree_numba", "semaphore_numba", 1),
        "target_speedup_2proc": 5.0,
        "machine": describe_machine(),
        "versions": {**versions(), "posix_ipc": posix_ipc.VERSION},
    }
    emit_record(result, args.out)
    return result


if __name__ == "__main__":
    main()
