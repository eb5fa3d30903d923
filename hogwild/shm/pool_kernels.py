"""The lock-free buffer pool's hot path: numba kernels on a pool's segment, by address.

Every kernel takes ``ref``, the address where the pool's segment is mapped in this process
(:attr:`hogwild.shm.pool.BufferPool.ref`): an integer, so passing it between numba functions costs
nothing (an array would cost reference-count updates worth more than the atomics). The pool
object must stay alive, and so mapped, while kernels use its ``ref``.

**Shared free lists.** Each size class's free blocks form a Treiber stack whose head word packs an
ABA tag, the list's length and its top block (:mod:`hogwild.shm.pool_layout`). Popping reads the
head (acquire), reads the top block's link, and swaps in ``(tag + 1, count - 1, next)``; pushing
writes the block's link and swaps in ``(tag + 1, count + 1, block)``. A process whose snapshot of
the head went stale fails its swap instead of corrupting the list (the tag makes a stale snapshot
differ from the current head unless exactly a multiple of 2**19 operations happened on that class
while the process was stalled between two instructions). Batches move with one swap too: a
thread walks ``k`` links from the top and swaps the head past them, or links ``k`` blocks into a
chain and swaps it in. A handed-out block's link reads ``LINK_ALLOCATED``; freeing swaps it to
``LINK_FREEING`` first, which is how a second free of one handle is refused (``ERR_DOUBLE_FREE``).

**Per-thread caches** (``pool_alloc_cached`` / ``pool_free_cached``, given ``cache``, the address
of a cache slot from :meth:`hogwild.shm.pool.BufferPool.open_cache`): a slot in the segment,
written by its one owning thread only, that keeps up to two batches of free blocks per class,
refilled from and spilled to the shared list a batch at a time, so most allocations and frees
touch no shared cache line and no atomic. Blocks parked in a cache cannot be had by others until
it spills or is flushed (``pool_flush_cache``); classes of fewer than 16 blocks are never cached.
In the cached path a double free is caught by a plain check of the block's link, not a
compare-and-swap: two threads freeing one handle at the same instant are not caught there.

Every kernel returns at once: a handle (>= 0) or a negative ``ERR_*`` code, never a wait, so numba
callers branch on the code and :class:`hogwild.shm.pool.BufferPool` turns codes into typed errors.
The only loops are compare-and-swap retries, which end as soon as no other thread changes the
same head in between (lock-free). The atomics are the ``raw_*`` intrinsics, generated inline.

Adam §3.3.1's allocator hands out buffers from lock-free pools; the per-thread caches are the
classic remedy (as in tcmalloc or Hoard) for the shared head every allocation would otherwise
contend on.
"""

from __future__ import annotations

from numba import njit

from hogwild.shm.atomics import (
    raw_add,
    raw_cas,
    raw_load,
    raw_load_relaxed,
    raw_max,
    raw_store,
    raw_store_relaxed,
)
from hogwild.shm.pool_layout import (
    C_BATCH,
    C_BLOCK_SIZE,
    C_DATA_OFF,
    C_FAILURES,
    C_HEAD,
    C_HIGH_WATER,
    C_LINK_BASE,
    C_NBLOCKS,
    CACHE_STRIDE,
    CLASS_WORDS,
    CNT_MASK,
    CNT_SHIFT,
    EMPTY,
    ERR_BAD_HANDLE,
    ERR_BAD_SIZE,
    ERR_CORRUPT,
    ERR_DOUBLE_FREE,
    ERR_EXHAUSTED,
    ERR_TOO_LARGE,
    H_LINKS_OFFSET,
    HEAD_IDX_MASK,
    HEADER_WORDS,
    IDX_MASK,
    LINK_ALLOCATED,
    LINK_CACHED,
    LINK_FREEING,
    MAX_BLOCK,
    MIN_BLOCK,
    N_CLASSES,
    S_CLASSES,
    TAG_MASK,
    TAG_SHIFT,
)

__all__ = [
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

_jit = njit(cache=True, nogil=True, inline="always")


@_jit
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


@_jit
def handle_class(handle):
    """The size class a handle belongs to."""
    return handle >> 32


@_jit
def handle_index(handle):
    """The block index within its class of a handle."""
    return handle & IDX_MASK


@_jit
def _word(ref, i):
    return raw_load_relaxed(ref, i)


@_jit
def _links(ref):
    """Address of the links array."""
    return ref + _word(ref, H_LINKS_OFFSET)


@_jit
def _new_head(old, count_delta, top):
    tag = ((old >> TAG_SHIFT) + 1) & TAG_MASK
    count = ((old >> CNT_SHIFT) & CNT_MASK) + count_delta
    return (tag << TAG_SHIFT) | (count << CNT_SHIFT) | top


@_jit
def _note_taken(ref, base, count_after):
    """Raise the class's high-water mark to the blocks now off the shared list."""
    in_use = _word(ref, base + C_NBLOCKS) - count_after
    if in_use > raw_load_relaxed(ref, base + C_HIGH_WATER):
        raw_max(ref, base + C_HIGH_WATER, in_use)


@_jit
def _pop_batch(ref, c, want, out, at):
    """Take up to ``want`` blocks off class ``c``'s shared list into words ``out[at:]``.

    One compare-and-swap for the whole batch. Returns how many it took: 0 when the list is
    empty, ``ERR_CORRUPT`` when the list is corrupt.
    """
    base = HEADER_WORDS + c * CLASS_WORDS
    links = _links(ref) + 8 * _word(ref, base + C_LINK_BASE)
    while True:
        old = raw_load(ref, base + C_HEAD)
        top = old & HEAD_IDX_MASK
        if top == EMPTY:
            return 0
        k = min(want, (old >> CNT_SHIFT) & CNT_MASK)
        cur = top
        stale = False
        for j in range(k):
            raw_store_relaxed(out, at + j, cur)
            nxt = raw_load(links, cur)
            if nxt < 0 or (nxt == EMPTY and j < k - 1):
                stale = True  # taken under us since we read the head
                break
            cur = nxt
        if stale:
            # The head must have moved on (our acquire load of the link orders their swap
            # first); if it has not, the list is corrupt: fail rather than spin forever.
            if raw_load(ref, base + C_HEAD) == old:
                return ERR_CORRUPT
            continue
        new = _new_head(old, -k, cur)
        if raw_cas(ref, base + C_HEAD, old, new) == old:
            _note_taken(ref, base, (new >> CNT_SHIFT) & CNT_MASK)
            return k


@_jit
def _push_chain(ref, c, blocks, at, k):
    """Put the ``k`` blocks in words ``blocks[at:]`` (marked free already) on class ``c``'s list."""
    base = HEADER_WORDS + c * CLASS_WORDS
    links = _links(ref) + 8 * _word(ref, base + C_LINK_BASE)
    for j in range(k - 1):
        raw_store_relaxed(
            links, raw_load_relaxed(blocks, at + j), raw_load_relaxed(blocks, at + j + 1)
        )
    first = raw_load_relaxed(blocks, at)
    last = raw_load_relaxed(blocks, at + k - 1)
    while True:
        old = raw_load(ref, base + C_HEAD)
        raw_store_relaxed(links, last, old & HEAD_IDX_MASK)
        if raw_cas(ref, base + C_HEAD, old, _new_head(old, k, first)) == old:
            return


@_jit
def pool_alloc_class(ref, c):
    """Pop a block of class ``c``: its handle, or ``ERR_EXHAUSTED`` / ``ERR_CORRUPT``."""
    base = HEADER_WORDS + c * CLASS_WORDS
    links = _links(ref) + 8 * _word(ref, base + C_LINK_BASE)
    while True:
        old = raw_load(ref, base + C_HEAD)
        top = old & HEAD_IDX_MASK
        if top == EMPTY:
            raw_add(ref, base + C_FAILURES, 1)
            return ERR_EXHAUSTED
        nxt = raw_load(links, top)
        if nxt < 0:  # taken under us; see _pop_batch
            if raw_load(ref, base + C_HEAD) == old:
                return ERR_CORRUPT
            continue
        new = _new_head(old, -1, nxt)
        if raw_cas(ref, base + C_HEAD, old, new) == old:
            raw_store(links, top, LINK_ALLOCATED)
            _note_taken(ref, base, (new >> CNT_SHIFT) & CNT_MASK)
            return (c << 32) | top


@_jit
def pool_alloc(ref, nbytes):
    """Allocate a block of at least ``nbytes``: its handle (>= 0) or a negative ``ERR_*`` code."""
    c = size_class(nbytes)
    if c < 0:
        return c
    return pool_alloc_class(ref, c)


@_jit
def _check_handle(ref, handle):
    """The class base word of a valid handle, or ``ERR_BAD_HANDLE``."""
    if handle < 0:
        return ERR_BAD_HANDLE
    c = handle >> 32
    if c >= N_CLASSES:
        return ERR_BAD_HANDLE
    base = HEADER_WORDS + c * CLASS_WORDS
    if (handle & IDX_MASK) >= _word(ref, base + C_NBLOCKS):
        return ERR_BAD_HANDLE
    return base


@_jit
def pool_free(ref, handle):
    """Return a handed-out block to the shared list: 0, ``ERR_BAD_HANDLE``, ``ERR_DOUBLE_FREE``."""
    base = _check_handle(ref, handle)
    if base < 0:
        return base
    links = _links(ref) + 8 * _word(ref, base + C_LINK_BASE)
    idx = handle & IDX_MASK
    if raw_cas(links, idx, LINK_ALLOCATED, LINK_FREEING) != LINK_ALLOCATED:
        return ERR_DOUBLE_FREE
    while True:
        old = raw_load(ref, base + C_HEAD)
        raw_store_relaxed(links, idx, old & HEAD_IDX_MASK)
        if raw_cas(ref, base + C_HEAD, old, _new_head(old, 1, idx)) == old:
            return 0


@_jit
def pool_alloc_cached(ref, cache, nbytes):
    """Like ``pool_alloc``, served from the thread's cache slot at address ``cache``."""
    c = size_class(nbytes)
    if c < 0:
        return c
    base = HEADER_WORDS + c * CLASS_WORDS
    batch = _word(ref, base + C_BATCH)
    if batch == 0:
        return pool_alloc_class(ref, c)
    at = S_CLASSES + c * CACHE_STRIDE
    n = raw_load_relaxed(cache, at)
    if n == 0:
        n = _pop_batch(ref, c, batch, cache, at + 1)
        if n <= 0:
            if n == 0:
                raw_add(ref, base + C_FAILURES, 1)
                return ERR_EXHAUSTED
            return n
    idx = raw_load_relaxed(cache, at + n)
    raw_store_relaxed(cache, at, n - 1)
    links = _links(ref) + 8 * _word(ref, base + C_LINK_BASE)
    raw_store_relaxed(links, idx, LINK_ALLOCATED)
    return (c << 32) | idx


@_jit
def pool_free_cached(ref, cache, handle):
    """Like ``pool_free``, into the thread's cache slot; spills a batch when it is full."""
    base = _check_handle(ref, handle)
    if base < 0:
        return base
    batch = _word(ref, base + C_BATCH)
    if batch == 0:
        return pool_free(ref, handle)
    links = _links(ref) + 8 * _word(ref, base + C_LINK_BASE)
    idx = handle & IDX_MASK
    if raw_load_relaxed(links, idx) != LINK_ALLOCATED:
        return ERR_DOUBLE_FREE
    raw_store_relaxed(links, idx, LINK_CACHED)
    c = handle >> 32
    at = S_CLASSES + c * CACHE_STRIDE
    n = raw_load_relaxed(cache, at)
    if n == 2 * batch:  # full: the oldest batch goes back to the shared list
        _push_chain(ref, c, cache, at + 1, batch)
        for j in range(batch):
            raw_store_relaxed(cache, at + 1 + j, raw_load_relaxed(cache, at + 1 + batch + j))
        n = batch
    raw_store_relaxed(cache, at + 1 + n, idx)
    raw_store_relaxed(cache, at, n + 1)
    return 0


@_jit
def pool_flush_cache(ref, cache):
    """Return every block parked in the cache slot to the shared lists; how many it returned."""
    total = 0
    for c in range(N_CLASSES):
        at = S_CLASSES + c * CACHE_STRIDE
        n = raw_load_relaxed(cache, at)
        if n > 0:
            _push_chain(ref, c, cache, at + 1, n)
            raw_store_relaxed(cache, at, 0)
            total += n
    return total


@_jit
def pool_cached_count(cache, c):
    """Blocks of class ``c`` parked in the cache slot at ``cache``."""
    return raw_load_relaxed(cache, S_CLASSES + c * CACHE_STRIDE)


@_jit
def pool_in_use(ref, c):
    """Blocks of class ``c`` off the shared list now (handed out or parked in caches)."""
    base = HEADER_WORDS + c * CLASS_WORDS
    free = (raw_load(ref, base + C_HEAD) >> CNT_SHIFT) & CNT_MASK
    return _word(ref, base + C_NBLOCKS) - free


@_jit
def pool_offset(ref, handle):
    """Byte offset of a block in the pool's data region (no validation)."""
    base = HEADER_WORDS + (handle >> 32) * CLASS_WORDS
    return _word(ref, base + C_DATA_OFF) + (handle & IDX_MASK) * _word(ref, base + C_BLOCK_SIZE)


@_jit
def pool_block_id(ref, handle):
    """A block's index among all the pool's blocks (0 .. total_blocks - 1), for side tables."""
    return _word(ref, HEADER_WORDS + (handle >> 32) * CLASS_WORDS + C_LINK_BASE) + (
        handle & IDX_MASK
    )


@_jit
def pool_block_size(ref, handle):
    """Size in bytes of the block a handle names."""
    return _word(ref, HEADER_WORDS + (handle >> 32) * CLASS_WORDS + C_BLOCK_SIZE)
