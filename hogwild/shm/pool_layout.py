"""Where everything sits in a buffer pool's shared-memory segment.

A pool segment holds, in order:

1. the **control block**, an int64 array: a header line (magic, version, offsets), then for each
   of the 14 size classes (4 KiB, 8 KiB, ... 32 MiB) two 64-byte lines, a read-only one (block
   size, block count, data offset, first link) and a hot one (the free-list head, blocks in use,
   high-water mark, failed requests), so classes never share a cache line;
2. the **links**, one int64 per block: the next free block of the same class while the block is
   free, ``LINK_ALLOCATED`` while it is handed out;
3. the **data region**: the blocks, class after class, starting on a page boundary, so every
   block is page-aligned (hence 64-byte aligned) and never shares a cache line with another.
   Block offsets are counted from the data region's start, so no offset reaches the control
   block or the links.

A free-list head packs a 31-bit ABA tag above a 32-bit block index (``EMPTY`` when the class is
exhausted). A handle packs ``class << 32 | block index`` into a non-negative int64; negative
values returned by the numba kernels are the ``ERR_*`` codes below.

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
MAX_BLOCKS_PER_CLASS = (1 << 32) - 2

MAGIC = 0x686F6777696C6450  # "hogwildP"
VERSION = 1

# Header words.
H_MAGIC, H_VERSION, H_NCLASSES, H_TOTAL_BLOCKS, H_LINKS_OFFSET, H_DATA_OFFSET, H_TOTAL_BYTES = (
    range(7)
)
HEADER_WORDS = 8
CLASS_WORDS = 16
# Read-only line of a class (offsets from the class base word).
C_BLOCK_SIZE, C_NBLOCKS, C_DATA_OFF, C_LINK_BASE = range(4)
# Hot line of a class.
C_HEAD, C_IN_USE, C_HIGH_WATER, C_FAILURES = range(8, 12)
CTL_WORDS = HEADER_WORDS + N_CLASSES * CLASS_WORDS

IDX_MASK = 0xFFFFFFFF
EMPTY = IDX_MASK
TAG_MASK = 0x7FFFFFFF
LINK_ALLOCATED = -2
LINK_FREEING = -3

ERR_EXHAUSTED = -1
ERR_TOO_LARGE = -2
ERR_BAD_SIZE = -3
ERR_BAD_HANDLE = -4
ERR_DOUBLE_FREE = -5
ERR_CORRUPT = -6

PAGE = 4096


def _round_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


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
        data_start: Start of the data region (page-aligned).
        data_offsets: Start of each class's first block, from ``data_start``.
        total_blocks: Sum of ``blocks``.
        total_bytes: Size of the whole segment.
    """

    blocks: tuple[int, ...]
    links_offset: int
    data_start: int
    data_offsets: tuple[int, ...]
    total_blocks: int
    total_bytes: int

    @classmethod
    def compute(cls, blocks: int | Sequence[int] | Mapping[int, int]) -> PoolLayout:
        """The layout of a pool with ``blocks`` per class (see :func:`normalize_blocks`)."""
        counts = normalize_blocks(blocks)
        total_blocks = sum(counts)
        links_offset = _round_up(CTL_WORDS * 8, 64)
        data_start = _round_up(links_offset + 8 * max(total_blocks, 1), PAGE)
        offsets = []
        cursor = 0
        for size, count in zip(CLASS_SIZES, counts, strict=True):
            offsets.append(cursor)
            cursor += size * count
        total = data_start + max(cursor, PAGE)
        return cls(counts, links_offset, data_start, tuple(offsets), total_blocks, total)

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
        link_base = 0
        for c, (size, count) in enumerate(zip(CLASS_SIZES, self.blocks, strict=True)):
            base = class_base(c)
            ctl[base + C_BLOCK_SIZE] = size
            ctl[base + C_NBLOCKS] = count
            ctl[base + C_DATA_OFF] = self.data_offsets[c]
            ctl[base + C_LINK_BASE] = link_base
            if count:
                links[link_base : link_base + count - 1] = np.arange(1, count, dtype=np.int64)
                links[link_base + count - 1] = EMPTY
            ctl[base + C_HEAD] = 0 if count else EMPTY
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
            int(ctl[H_DATA_OFFSET]),
            offsets,
            int(ctl[H_TOTAL_BLOCKS]),
            int(ctl[H_TOTAL_BYTES]),
        )
