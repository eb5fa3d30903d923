"""Where everything sits in a buffer pool's shared-memory segment.

A pool segment holds, in order:

1. the **control block**, an int64 array: a header line (magic, version, offsets), then for each
   of the 14 size classes (4 KiB, 8 KiB, ... 32 MiB) two 64-byte lines, a read-only one (block
   size, block count, data offset, first link, cache batch) and a hot one (the free-list head,
   high-water mark, failed requests), so classes never share a cache line;
2. the **links**, one int64 per block: the next free block of the same class while the block is
   on the shared free list, ``LINK_ALLOCATED`` while it is handed out, ``LINK_CACHED`` while it
   waits in a thread's cache;
3. the **cache slots**: ``max_caches`` per-thread caches of free blocks, each a whole number of
   cache lines, owned by one thread at a time (owner word: its process id);
4. the **data region**: the blocks, class after class, starting on a page boundary, so every
   block is page-aligned (hence 64-byte aligned) and never shares a cache line with another.
   Block offsets are counted from the data region's start, so no offset reaches the control
   block or the links.

A free-list head is one int64: a 19-bit ABA tag, the number of blocks on the list (22 bits) and
the top block's index (22 bits; ``EMPTY`` when the list is empty). Keeping the count in the head
makes "blocks in use" exact at no extra atomic: it changes in the same compare-and-swap as the
list. A handle packs ``class << 32 | block index`` into a non-negative int64; negative values
returned by the numba kernels are the ``ERR_*`` codes below.

Adam (§3.3.1) sizes its pools in powers of two from 4 KB to 32 MB; so do we. Adam's pools grow
on demand; ours are fixed when the segment is created and say so with a typed error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

MIN_SHIFT = 12
MAX_SHIFT = 25
N_CLASSES = MAX_SHIFT - MIN_SHIFT + 1
MIN_BLOCK = 1 << MIN_SHIFT
MAX_BLOCK = 1 << MAX_SHIFT
CLASS_SIZES = tuple(1 << s for s in range(MIN_SHIFT, MAX_SHIFT + 1))
HEAD_IDX_BITS = 22
MAX_BLOCKS_PER_CLASS = (1 << HEAD_IDX_BITS) - 2  # 4,194,302: 16 GiB of the smallest class

MAGIC = 0x686F6777696C6450  # "hogwildP"
VERSION = 2

# Header words.
(
    H_MAGIC,
    H_VERSION,
    H_NCLASSES,
    H_TOTAL_BLOCKS,
    H_LINKS_OFFSET,
    H_DATA_OFFSET,
    H_TOTAL_BYTES,
    H_CACHES_OFFSET,
    H_MAX_CACHES,
) = range(9)
HEADER_WORDS = 16
CLASS_WORDS = 16
# Read-only line of a class (offsets from the class base word).
C_BLOCK_SIZE, C_NBLOCKS, C_DATA_OFF, C_LINK_BASE, C_BATCH = range(5)
# Hot line of a class.
C_HEAD, C_HIGH_WATER, C_FAILURES = range(8, 11)
CTL_WORDS = HEADER_WORDS + N_CLASSES * CLASS_WORDS

# A handle: class << 32 | block index.
IDX_MASK = 0xFFFFFFFF
# A free-list head: tag (19 bits) << 44 | free count (22 bits) << 22 | top block (22 bits).
HEAD_IDX_MASK = (1 << HEAD_IDX_BITS) - 1
EMPTY = HEAD_IDX_MASK
CNT_SHIFT = HEAD_IDX_BITS
CNT_MASK = (1 << 22) - 1
TAG_SHIFT = 44
TAG_MASK = (1 << 19) - 1
# Link values other than a next index.
LINK_ALLOCATED = -2
LINK_FREEING = -3
LINK_CACHED = -4

# Per-thread cache slots (see pool_kernels.pool_alloc_cached), in the segment after the links:
# word S_OWNER holds the owning process id (0: free); class c's count sits at
# S_CLASSES + c * CACHE_STRIDE, its cached block indices right after.
MAX_BATCH = 16
CACHE_STRIDE = 1 + 2 * MAX_BATCH  # per class: count, then up to two batches of block indices
S_OWNER = 0
S_CLASSES = 8
CACHE_SLOT_WORDS = (S_CLASSES + N_CLASSES * CACHE_STRIDE + 7) // 8 * 8
DEFAULT_MAX_CACHES = 64

ERR_EXHAUSTED = -1
ERR_TOO_LARGE = -2
ERR_BAD_SIZE = -3
ERR_BAD_HANDLE = -4
ERR_DOUBLE_FREE = -5
ERR_CORRUPT = -6

PAGE = 4096


def _round_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def pack_head(tag: int, count: int, top: int) -> int:
    """A free-list head word from its three fields."""
    return ((tag & TAG_MASK) << TAG_SHIFT) | (count << CNT_SHIFT) | top


def cache_batch(blocks: int) -> int:
    """Blocks a per-thread cache moves at once for a class of ``blocks`` (0: never cached).

    A sixteenth of the class, at most ``MAX_BATCH``: caches (two batches each at most) then hold
    a small part of a class, and a class of fewer than 16 blocks is never cached.
    """
    return min(MAX_BATCH, blocks // 16)


def class_base(size_class: int) -> int:
    """Index in the control block of the first word of ``size_class``'s lines."""
    return HEADER_WORDS + size_class * CLASS_WORDS


def normalize_blocks(blocks: int | Sequence[int] | Mapping[int, int]) -> tuple[int, ...]:
    """Blocks per class, as a 14-tuple.

    Args:
        blocks: One count for every class; or 14 counts, smallest class first; or a mapping from
            block size in bytes (a power of two, 4 KiB to 32 MiB) to count, other classes empty.

    Raises:
        ValueError: A count is negative or too large, a size is not a class, or the sequence has
            the wrong length.
    """
    if isinstance(blocks, Mapping):
        counts = [0] * N_CLASSES
        for size, count in blocks.items():
            if size not in CLASS_SIZES:
                raise ValueError(
                    f"pool block size {size} is not a class: expected a power of two "
                    f"from {MIN_BLOCK} to {MAX_BLOCK}"
                )
            counts[CLASS_SIZES.index(size)] = int(count)
    elif isinstance(blocks, int | np.integer):
        counts = [int(blocks)] * N_CLASSES
    else:
        counts = [int(c) for c in blocks]
        if len(counts) != N_CLASSES:
            raise ValueError(f"expected {N_CLASSES} block counts (4 KiB first), got {len(counts)}")
    for size, count in zip(CLASS_SIZES, counts, strict=True):
        if not 0 <= count <= MAX_BLOCKS_PER_CLASS:
            raise ValueError(f"pool class {size} B: block count {count} out of range")
    return tuple(counts)


@dataclass(frozen=True)
class PoolLayout:
    """Offsets of a pool segment's parts, all in bytes from the segment's start.

    Attributes:
        blocks: Blocks per class, smallest class first.
        links_offset: Start of the links array.
        caches_offset: Start of the cache slots.
        max_caches: Number of cache slots.
        data_start: Start of the data region (page-aligned).
        data_offsets: Start of each class's first block, from ``data_start``.
        total_blocks: Sum of ``blocks``.
        total_bytes: Size of the whole segment.
    """

    blocks: tuple[int, ...]
    links_offset: int
    caches_offset: int
    max_caches: int
    data_start: int
    data_offsets: tuple[int, ...]
    total_blocks: int
    total_bytes: int

    @classmethod
    def compute(
        cls,
        blocks: int | Sequence[int] | Mapping[int, int],
        max_caches: int = DEFAULT_MAX_CACHES,
    ) -> PoolLayout:
        """The layout of a pool with ``blocks`` per class (see :func:`normalize_blocks`).

        Raises:
            ValueError: Bad counts, or a negative ``max_caches``.
        """
        counts = normalize_blocks(blocks)
        if max_caches < 0:
            raise ValueError(f"max_caches must be >= 0, got {max_caches}")
        total_blocks = sum(counts)
        links_offset = _round_up(CTL_WORDS * 8, 64)
        caches_offset = _round_up(links_offset + 8 * max(total_blocks, 1), 64)
        data_start = _round_up(caches_offset + 8 * CACHE_SLOT_WORDS * max_caches, PAGE)
        offsets = []
        cursor = 0
        for size, count in zip(CLASS_SIZES, counts, strict=True):
            offsets.append(cursor)
            cursor += size * count
        total = data_start + max(cursor, PAGE)
        return cls(
            counts,
            links_offset,
            caches_offset,
            max_caches,
            data_start,
            tuple(offsets),
            total_blocks,
            total,
        )

    def initialize(self, ctl: np.ndarray, links: np.ndarray) -> None:
        """Write the header and build every class's free list (blocks in address order)."""
        ctl[:] = 0
        ctl[H_MAGIC] = MAGIC
        ctl[H_VERSION] = VERSION
        ctl[H_NCLASSES] = N_CLASSES
        ctl[H_TOTAL_BLOCKS] = self.total_blocks
        ctl[H_LINKS_OFFSET] = self.links_offset
        ctl[H_TOTAL_BYTES] = self.total_bytes
        ctl[H_DATA_OFFSET] = self.data_start
        ctl[H_CACHES_OFFSET] = self.caches_offset
        ctl[H_MAX_CACHES] = self.max_caches
        link_base = 0
        for c, (size, count) in enumerate(zip(CLASS_SIZES, self.blocks, strict=True)):
            base = class_base(c)
            ctl[base + C_BLOCK_SIZE] = size
            ctl[base + C_NBLOCKS] = count
            ctl[base + C_DATA_OFF] = self.data_offsets[c]
            ctl[base + C_LINK_BASE] = link_base
            ctl[base + C_BATCH] = cache_batch(count)
            if count:
                links[link_base : link_base + count - 1] = np.arange(1, count, dtype=np.int64)
                links[link_base + count - 1] = EMPTY
            ctl[base + C_HEAD] = pack_head(0, count, 0) if count else pack_head(0, 0, EMPTY)
            link_base += count

    @classmethod
    def read(cls, ctl: np.ndarray) -> PoolLayout:
        """The layout recorded in an initialized control block.

        Raises:
            ValueError: The control block is not a pool's (bad magic or version).
        """
        if int(ctl[H_MAGIC]) != MAGIC or int(ctl[H_VERSION]) != VERSION:
            raise ValueError("shared segment does not hold a hogwild buffer pool of this version")
        counts = tuple(int(ctl[class_base(c) + C_NBLOCKS]) for c in range(N_CLASSES))
        offsets = tuple(int(ctl[class_base(c) + C_DATA_OFF]) for c in range(N_CLASSES))
        return cls(
            counts,
            int(ctl[H_LINKS_OFFSET]),
            int(ctl[H_CACHES_OFFSET]),
            int(ctl[H_MAX_CACHES]),
            int(ctl[H_DATA_OFFSET]),
            offsets,
            int(ctl[H_TOTAL_BLOCKS]),
            int(ctl[H_TOTAL_BYTES]),
        )
