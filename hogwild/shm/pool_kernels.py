"""The lock-free buffer pool's hot path: numba kernels over a pool's ``ctl`` and ``links`` arrays.

Each size class's free blocks form a Treiber stack whose head packs a 31-bit ABA tag above a
32-bit block index (:mod:`hogwild.shm.pool_layout`). Popping reads the head (acquire), reads the
top block's link, and swaps in ``(tag + 1, next)``; pushing writes the block's link and swaps in
``(tag + 1, block)``. A stalled process whose snapshot of the head went stale fails its swap
instead of corrupting the list, until the tag wraps after 2**31 operations on that class while it
stalls. A handed-out block's link reads ``LINK_ALLOCATED``; freeing swaps it to ``LINK_FREEING``
first, which is how a second free of one handle is refused (``ERR_DOUBLE_FREE``).

Every kernel returns at once: a handle (>= 0) or a negative ``ERR_*`` code, never a wait, so numba
callers branch on the code and :class:`hogwild.shm.pool.BufferPool` turns codes into typed errors.
The only loops are the compare-and-swap retries, which end as soon as no other process changes
the same head in between (lock-free).

Adam §3.3.1's allocator hands out buffers from such lock-free pools; see :mod:`hogwild.shm.pool`.
"""

from __future__ import annotations

from numba import njit

from hogwild.shm.atomics import (
    atomic_add,
    atomic_cas,
    atomic_load,
    atomic_load_relaxed,
    atomic_max,
    atomic_store,
    atomic_store_relaxed,
)
from hogwild.shm.pool_layout import (
    C_BLOCK_SIZE,
    C_DATA_OFF,
    C_FAILURES,
    C_HEAD,
    C_HIGH_WATER,
    C_IN_USE,
    C_LINK_BASE,
    C_NBLOCKS,
    CLASS_WORDS,
    EMPTY,
    ERR_BAD_HANDLE,
    ERR_BAD_SIZE,
    ERR_CORRUPT,
    ERR_DOUBLE_FREE,
    ERR_EXHAUSTED,
    ERR_TOO_LARGE,
    HEADER_WORDS,
    IDX_MASK,
    LINK_ALLOCATED,
    LINK_FREEING,
    MAX_BLOCK,
    MIN_BLOCK,
    N_CLASSES,
    TAG_MASK,
)

__all__ = [
    "handle_class",
    "handle_index",
    "pool_alloc",
    "pool_alloc_class",
    "pool_block_id",
    "pool_block_size",
    "pool_free",
    "pool_offset",
    "size_class",
]


@njit(cache=True, nogil=True)
def size_class(nbytes):
    """The class serving ``nbytes`` (0 for <= 4 KiB), or ``ERR_TOO_LARGE`` / ``ERR_BAD_SIZE``."""
    if nbytes <= 0:
        return ERR_BAD_SIZE
    if nbytes > MAX_BLOCK:
        return ERR_TOO_LARGE
    c = 0
    size = MIN_BLOCK
    while size < nbytes:
        size <<= 1
        c += 1
    return c


@njit(cache=True, nogil=True)
def handle_class(handle):
    """The size class a handle belongs to."""
    return handle >> 32


@njit(cache=True, nogil=True)
def handle_index(handle):
    """The block index within its class of a handle."""
    return handle & IDX_MASK


@njit(cache=True, nogil=True)
def pool_alloc_class(ctl, links, c):
    """Pop a block of class ``c``: its handle, or ``ERR_EXHAUSTED`` / ``ERR_CORRUPT``."""
    base = HEADER_WORDS + c * CLASS_WORDS
    link_base = ctl[base + C_LINK_BASE]
    while True:
        old = atomic_load(ctl, base + C_HEAD)
        idx = old & IDX_MASK
        if idx == EMPTY:
            atomic_add(ctl, base + C_FAILURES, 1)
            return ERR_EXHAUSTED
        nxt = atomic_load(links, link_base + idx)
        if nxt < 0:
            # Someone popped the block since we read the head, so the head must have moved on
            # (the acquire load above orders their swap before this re-read). If it has not,
            # the list is corrupt (memory scribbled over): fail instead of spinning forever.
            if atomic_load(ctl, base + C_HEAD) == old:
                return ERR_CORRUPT
            continue
        new = ((((old >> 32) + 1) & TAG_MASK) << 32) | nxt
        if atomic_cas(ctl, base + C_HEAD, old, new) == old:
            atomic_store(links, link_base + idx, LINK_ALLOCATED)
            in_use = atomic_add(ctl, base + C_IN_USE, 1) + 1
            if in_use > atomic_load_relaxed(ctl, base + C_HIGH_WATER):
                atomic_max(ctl, base + C_HIGH_WATER, in_use)
            return (c << 32) | idx


@njit(cache=True, nogil=True)
def pool_alloc(ctl, links, nbytes):
    """Allocate a block of at least ``nbytes``: its handle (>= 0) or a negative ``ERR_*`` code."""
    c = size_class(nbytes)
    if c < 0:
        return c
    return pool_alloc_class(ctl, links, c)


@njit(cache=True, nogil=True)
def pool_free(ctl, links, handle):
    """Return a handed-out block to its free list: 0, ``ERR_BAD_HANDLE`` or ``ERR_DOUBLE_FREE``."""
    if handle < 0:
        return ERR_BAD_HANDLE
    c = handle >> 32
    idx = handle & IDX_MASK
    if c >= N_CLASSES:
        return ERR_BAD_HANDLE
    base = HEADER_WORDS + c * CLASS_WORDS
    if idx >= ctl[base + C_NBLOCKS]:
        return ERR_BAD_HANDLE
    link = ctl[base + C_LINK_BASE] + idx
    if atomic_cas(links, link, LINK_ALLOCATED, LINK_FREEING) != LINK_ALLOCATED:
        return ERR_DOUBLE_FREE
    while True:
        old = atomic_load(ctl, base + C_HEAD)
        atomic_store_relaxed(links, link, old & IDX_MASK)
        new = ((((old >> 32) + 1) & TAG_MASK) << 32) | idx
        if atomic_cas(ctl, base + C_HEAD, old, new) == old:
            break
    atomic_add(ctl, base + C_IN_USE, -1)
    return 0


@njit(cache=True, nogil=True)
def pool_offset(ctl, handle):
    """Byte offset of a block in the pool's data region (no validation)."""
    base = HEADER_WORDS + (handle >> 32) * CLASS_WORDS
    return ctl[base + C_DATA_OFF] + (handle & IDX_MASK) * ctl[base + C_BLOCK_SIZE]


@njit(cache=True, nogil=True)
def pool_block_id(ctl, handle):
    """A block's index among all the pool's blocks (0 .. total_blocks - 1), for side tables."""
    return ctl[HEADER_WORDS + (handle >> 32) * CLASS_WORDS + C_LINK_BASE] + (handle & IDX_MASK)


@njit(cache=True, nogil=True)
def pool_block_size(ctl, handle):
    """Size in bytes of the block a handle names."""
    return ctl[HEADER_WORDS + (handle >> 32) * CLASS_WORDS + C_BLOCK_SIZE]
