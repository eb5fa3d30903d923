"""Lock-free buffer pools in shared memory: power-of-two size classes from 4 KiB to 32 MiB.

A :class:`BufferPool` carves one shared-memory segment (layout in :mod:`hogwild.shm.pool_layout`)
into fixed blocks, 14 classes of them. Each class's free blocks form a Treiber stack whose head
(one int64: ABA tag, length, top block) changes only by compare-and-swap, re-tagged on every push
and pop (details in :mod:`hogwild.shm.pool_kernels`). Any process that attached the pool
allocates and frees, from numba (the ``pool_*`` kernels, re-exported here, which take the pool's
``ctl`` and ``links`` arrays, plus a per-thread ``cache`` array for the ``_cached`` ones, the fast
path) or from Python (the methods, one numba call each, uncached).

Invariants: a block is on its class's shared free list, in one thread's cache, or handed out:
never two of these and never handed out twice. The link of a handed-out block reads
``LINK_ALLOCATED``, which is how a second ``free`` of the same handle is caught
(``DoubleFreeError``) instead of corrupting the list. A request larger than 32 MiB
(``PoolRequestTooLargeError``) or for an exhausted class (``PoolExhaustedError``) fails at once:
nothing in here waits. Per class the pool keeps, readable from any process
(:meth:`BufferPool.stats`): blocks in use (off the shared list: handed out or parked in caches,
exact, from the list head), its high-water mark, and failed requests.

Adam §3.3.1 allocates its parameter servers' buffers from such pools. What differs: our pools do
not grow (the segment is sized once; exhaustion is a typed error the caller can act on), and a
block's memory is placed on a NUMA node by whichever process touches it first (or by
``hogwild.numa.pinning.bind_memory``), not by the pool.

What the product uses: the parameter server receives arrays into a private pool
(``create(..., private=True)``); ``bench/figures/buffer_pools.py`` measures the shared one
across processes (``create``, :meth:`BufferPool.attach`, the per-thread caches). Partitions of
one model on one host will pass blocks of neurons through a shared pool (model partitioning's
block passing).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hogwild.errors import HogwildError, SharedMemoryError
from hogwild.shm.atomics import atomic_cas, atomic_load, atomic_store
from hogwild.shm.pool_kernels import (
    handle_class,
    handle_index,
    pool_alloc,
    pool_alloc_cached,
    pool_alloc_class,
    pool_block_id,
    pool_block_size,
    pool_cached_count,
    pool_flush_cache,
    pool_free,
    pool_free_cached,
    pool_in_use,
    pool_offset,
    size_class,
)
from hogwild.shm.pool_layout import (
    C_FAILURES,
    C_HIGH_WATER,
    C_NBLOCKS,
    CACHE_SLOT_WORDS,
    CLASS_SIZES,
    CTL_WORDS,
    DEFAULT_MAX_CACHES,
    ERR_BAD_HANDLE,
    ERR_CORRUPT,
    ERR_DOUBLE_FREE,
    ERR_EXHAUSTED,
    IDX_MASK,
    MAX_BLOCK,
    N_CLASSES,
    S_OWNER,
    PoolLayout,
    class_base,
)
from hogwild.shm.pool_segment import SharedSegment
from hogwild.signals import process_exists

__all__ = [
    "BufferPool",
    "ClassStats",
    "DoubleFreeError",
    "InvalidHandleError",
    "PoolCorruptedError",
    "PoolError",
    "PoolExhaustedError",
    "PoolRequestTooLargeError",
    "handle_class",
    "handle_index",
    "pool_alloc",
    "pool_alloc_cached",
    "pool_alloc_class",
    "pool_block_id",
    "pool_block_size",
    "pool_cached_count",
    "pool_flush_cache",
    "pool_free",
    "pool_free_cached",
    "pool_in_use",
    "pool_offset",
    "size_class",
]


class PoolError(HogwildError):
    """Base class of the buffer pool's failures."""


class PoolExhaustedError(PoolError):
    """Every block of the size class a request needs is handed out."""


class PoolRequestTooLargeError(PoolError, ValueError):
    """A request asks for more than the largest class (32 MiB), or for no bytes at all."""


class InvalidHandleError(PoolError, ValueError):
    """A handle does not name a block of this pool."""


class DoubleFreeError(PoolError):
    """A block was freed that is not handed out (freed twice, or never allocated)."""


class PoolCorruptedError(PoolError):
    """A free list points at a block that is handed out: the pool's memory was overwritten."""


@dataclass(frozen=True)
class ClassStats:
    """A size class's counters at one moment.

    Attributes:
        block_size: Bytes per block.
        blocks: Blocks in the class.
        in_use: Blocks handed out now (off the shared list and not parked in a cache; exact when
            no thread is allocating, a snapshot otherwise).
        cached: Free blocks parked in threads' caches.
        high_water: Most blocks ever off the shared free list at once (handed out or cached).
        failures: Requests refused because the class was exhausted.
    """

    block_size: int
    blocks: int
    in_use: int
    cached: int
    high_water: int
    failures: int


class BufferPool:
    """A lock-free pool of shared-memory blocks that any attached process allocates from.

    Create it in the owning process, hand it to others (it pickles as its name: unpickling
    attaches), and free every block from whichever process holds it. Numba code calls the
    ``pool_*`` kernels with :attr:`ref` (and a cache slot from :meth:`open_cache` for the fast
    ``_cached`` ones), and finds a block at ``data[pool_offset(ref, h):]``, of
    ``pool_block_size(ref, h)`` bytes.

    Attributes:
        name: The segment's name.
        layout: Where everything sits in the segment.
        ref: This process's address of the segment: what the numba kernels take.
        ctl: The control block (int64): headers, free-list heads, counters.
        links: One int64 per block: free-list links.
        data: The data region as bytes; a block sits at ``data[offset : offset + size]``.
    """

    def __init__(self, segment: SharedSegment, layout: PoolLayout) -> None:
        self._segment = segment
        self.name = segment.name
        self.layout = layout
        self.ctl = segment.array(0, np.int64, CTL_WORDS)
        self.ref = int(self.ctl.ctypes.data)
        self.links = segment.array(layout.links_offset, np.int64, max(layout.total_blocks, 1))
        self._slots = segment.array(
            layout.caches_offset, np.int64, max(1, CACHE_SLOT_WORDS * layout.max_caches)
        )
        self.data = segment.array(
            layout.data_start, np.uint8, layout.total_bytes - layout.data_start
        )
        self._open_caches: set[int] = set()

    @classmethod
    def create(
        cls,
        blocks: int | Sequence[int] | Mapping[int, int],
        max_caches: int = DEFAULT_MAX_CACHES,
        private: bool = False,
    ) -> BufferPool:
        """Create a pool in a new segment owned (and removed on close or exit) by this process.

        ``private``: for this process's threads alone (a parameter server's receive buffers), in
        memory without a name (:meth:`SharedSegment.private`): nothing in ``/dev/shm`` to fill
        or to leave behind. Such a pool cannot be handed to another process.

        Args:
            blocks: Blocks per class: one count for all 14 classes, 14 counts (4 KiB first), or
                ``{block_size_bytes: count}``. Pages are backed only when first written, so
                generous counts cost address space, not memory.
            max_caches: Per-thread cache slots (about 3.7 KiB each), for all processes together.

        Raises:
            ValueError: Bad counts. hogwild.errors.SharedMemoryError: No room for the segment.
        """
        layout = PoolLayout.compute(blocks, max_caches)
        if private:
            segment = SharedSegment.private(layout.total_bytes)
        else:
            segment = SharedSegment.create("pool", layout.total_bytes)
        pool = cls(segment, layout)
        layout.initialize(pool.ctl, pool.links)
        return pool

    @classmethod
    def attach(cls, name: str) -> BufferPool:
        """Attach a pool another process created.

        Raises:
            hogwild.errors.SharedMemoryError: No such segment, or it holds no pool.
        """
        segment = SharedSegment.attach(name)
        try:
            layout = PoolLayout.read(segment.array(0, np.int64, CTL_WORDS))
        except ValueError as exc:
            segment.close()
            raise SharedMemoryError(f"{name}: {exc}") from exc
        return cls(segment, layout)

    def __reduce__(self):
        if not self.name:
            raise TypeError("a private pool (create(private=True)) cannot go to another process")
        return (BufferPool.attach, (self.name,))

    def allocate(self, nbytes: int) -> int:
        """A handle to a free block of at least ``nbytes`` bytes (from the shared lists).

        Raises:
            PoolRequestTooLargeError: ``nbytes`` is above 32 MiB or not positive.
            PoolExhaustedError: Every block of that class is handed out or cached.
        """
        handle = pool_alloc(self.ref, nbytes)
        if handle < 0:
            self._raise_alloc(handle, nbytes)
        return handle

    def try_allocate(self, nbytes: int) -> int | None:
        """Like :meth:`allocate`, but None when the class is exhausted."""
        handle = pool_alloc(self.ref, nbytes)
        if handle == ERR_EXHAUSTED:
            return None
        if handle < 0:
            self._raise_alloc(handle, nbytes)
        return handle

    def _raise_alloc(self, code: int, nbytes: int) -> None:
        if code == ERR_CORRUPT:
            raise PoolCorruptedError(
                f"buffer pool {self.name}: the free list of {CLASS_SIZES[size_class(nbytes)]}-byte "
                "blocks points at a block in use; something wrote over the pool's control memory"
            )
        if code == ERR_EXHAUSTED:
            c = size_class(nbytes)
            have = self.layout.blocks[c]
            state = f"all {have} blocks of" if have else "there are no blocks of"
            raise PoolExhaustedError(
                f"buffer pool {self.name}: {state} {CLASS_SIZES[c]} bytes in use "
                f"(request of {nbytes} bytes); create the pool with more blocks in that class"
            )
        raise PoolRequestTooLargeError(
            f"buffer pool {self.name}: cannot serve a request of {nbytes} bytes; "
            f"expected 1 to {MAX_BLOCK} bytes (the largest class)"
        )

    def free(self, handle: int) -> None:
        """Return a block to the shared lists.

        Raises:
            InvalidHandleError: ``handle`` names no block of this pool.
            DoubleFreeError: The block is not handed out.
        """
        self._raise_free(pool_free(self.ref, handle), handle)

    def _raise_free(self, code: int, handle: int) -> None:
        if code == ERR_BAD_HANDLE:
            raise InvalidHandleError(f"buffer pool {self.name}: {handle} is not a block handle")
        if code == ERR_DOUBLE_FREE:
            raise DoubleFreeError(
                f"buffer pool {self.name}: block {handle} (class {CLASS_SIZES[handle >> 32]} B, "
                f"index {handle & IDX_MASK}) is not allocated: freed twice?"
            )

    # ---------------------------------------------------------------------- cache slots

    def open_cache(self) -> int:
        """Claim a per-thread cache slot for the ``pool_*_cached`` kernels; its address.

        One thread uses a slot at a time. Slots of processes that died are reclaimed (their
        blocks returned) when no slot is free.

        Raises:
            PoolError: Every slot is held by a live process.
        """
        pid = os.getpid()
        for reclaim in (False, True):
            for s in range(self.layout.max_caches):
                word = s * CACHE_SLOT_WORDS + S_OWNER
                owner = int(atomic_load(self._slots, word))
                if owner and not (reclaim and not process_exists(owner)):
                    continue
                if atomic_cas(self._slots, word, owner, pid) == owner:
                    address = self._slot_address(s)
                    pool_flush_cache(self.ref, address)  # a dead owner's blocks, if any
                    self._open_caches.add(address)
                    return address
        raise PoolError(
            f"buffer pool {self.name}: all {self.layout.max_caches} cache slots are in use by "
            "live processes; close caches or create the pool with more max_caches"
        )

    def close_cache(self, cache: int) -> int:
        """Return a slot's blocks to the shared lists and release the slot; how many blocks."""
        returned = int(pool_flush_cache(self.ref, cache))
        s = (cache - self._slot_address(0)) // (8 * CACHE_SLOT_WORDS)
        atomic_store(self._slots, s * CACHE_SLOT_WORDS + S_OWNER, 0)
        self._open_caches.discard(cache)
        return returned

    def _slot_address(self, s: int) -> int:
        return self.ref + self.layout.caches_offset + 8 * CACHE_SLOT_WORDS * s

    def _cached(self, c: int) -> int:
        return sum(
            int(pool_cached_count(self._slot_address(s), c))
            for s in range(self.layout.max_caches)
            if atomic_load(self._slots, s * CACHE_SLOT_WORDS + S_OWNER)
        )

    # ---------------------------------------------------------------------- blocks, stats

    def _check(self, handle: int) -> int:
        c, idx = handle >> 32, handle & IDX_MASK
        if handle < 0 or c >= N_CLASSES or idx >= self.layout.blocks[c]:
            raise InvalidHandleError(f"buffer pool {self.name}: {handle} is not a block handle")
        return c

    def offset(self, handle: int) -> int:
        """Byte offset of a block in :attr:`data` (64-byte, in fact page, aligned)."""
        c = self._check(handle)
        return self.layout.data_offsets[c] + (handle & IDX_MASK) * CLASS_SIZES[c]

    def block_size(self, handle: int) -> int:
        """Size in bytes of the block ``handle`` names."""
        return CLASS_SIZES[self._check(handle)]

    def view(self, handle: int, dtype: np.dtype | type = np.uint8) -> np.ndarray:
        """The whole block as a 1-D array of ``dtype`` (shares memory with the segment)."""
        start = self.offset(handle)
        block = self.data[start : start + self.block_size(handle)]
        return block.view(dtype)

    def stats(self) -> list[ClassStats]:
        """Counters of every size class, smallest first."""
        out = []
        for c in range(N_CLASSES):
            base = class_base(c)
            cached = self._cached(c)
            out.append(
                ClassStats(
                    block_size=CLASS_SIZES[c],
                    blocks=int(self.ctl[base + C_NBLOCKS]),
                    in_use=int(pool_in_use(self.ref, c)) - cached,
                    cached=cached,
                    high_water=int(atomic_load(self.ctl, base + C_HIGH_WATER)),
                    failures=int(atomic_load(self.ctl, base + C_FAILURES)),
                )
            )
        return out

    def in_use(self) -> int:
        """Blocks handed out now, over all classes."""
        return sum(s.in_use for s in self.stats())

    def close(self) -> None:
        """Close this object's caches and detach; the owner also removes the segment's name.

        Views (and ``ref``) stay valid until the arrays are dropped.
        """
        for cache in list(self._open_caches):
            self.close_cache(cache)
        self._segment.close()

    def __enter__(self) -> BufferPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
