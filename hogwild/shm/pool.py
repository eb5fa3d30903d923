"""Lock-free buffer pools in shared memory: power-of-two size classes from 4 KiB to 32 MiB.

A :class:`BufferPool` carves one shared-memory segment (layout in :mod:`hogwild.shm.pool_layout`)
into fixed blocks, 14 classes of them. Each class's free blocks form a Treiber stack: the head is
one int64 holding a 31-bit tag and a 32-bit block index, swapped with compare-and-swap and
re-tagged on every push and pop, so a stalled thread whose snapshot of the head went stale (the
ABA problem) fails its swap instead of corrupting the list (until the tag wraps after 2**31
operations on that class while it stalls). Any process that attached the pool allocates and frees,
from numba (the ``pool_*`` kernels of :mod:`hogwild.shm.pool_kernels`, re-exported here, which
take the pool's ``ctl`` and ``links`` arrays) or from Python (the methods, one numba call each).

Invariants: a block is on its class's free list or handed out, never both and never twice; the
link of a handed-out block reads ``LINK_ALLOCATED``, which is how a second ``free`` of the same
handle is caught (``DoubleFreeError``) instead of corrupting the list. A request larger than
32 MiB (``PoolRequestTooLargeError``) or for an exhausted class (``PoolExhaustedError``) fails at
once: nothing in here waits. Per class the pool counts blocks in use, their high-water mark and
failed requests, with atomics, readable from any process (:meth:`BufferPool.stats`).

Adam §3.3.1 allocates its parameter servers' buffers from such pools. What differs: our pools do
not grow (the segment is sized once; exhaustion is a typed error the caller can act on), and a
block's memory is placed on a NUMA node by whichever process touches it first (or by
``hogwild.numa.pinning.bind_memory``), not by the pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hogwild.errors import HogwildError, SharedMemoryError
from hogwild.shm.atomics import atomic_load
from hogwild.shm.pool_kernels import (
    handle_class,
    handle_index,
    pool_alloc,
    pool_alloc_class,
    pool_block_id,
    pool_block_size,
    pool_free,
    pool_offset,
    size_class,
)
from hogwild.shm.pool_layout import (
    C_FAILURES,
    C_HIGH_WATER,
    C_IN_USE,
    C_NBLOCKS,
    CLASS_SIZES,
    CTL_WORDS,
    ERR_BAD_HANDLE,
    ERR_CORRUPT,
    ERR_DOUBLE_FREE,
    ERR_EXHAUSTED,
    IDX_MASK,
    MAX_BLOCK,
    N_CLASSES,
    PoolLayout,
    class_base,
)
from hogwild.shm.pool_segment import SharedSegment

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
    "pool_alloc_class",
    "pool_block_id",
    "pool_block_size",
    "pool_free",
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
        in_use: Blocks handed out now.
        high_water: Most blocks ever handed out at once.
        failures: Requests refused because the class was exhausted.
    """

    block_size: int
    blocks: int
    in_use: int
    high_water: int
    failures: int


class BufferPool:
    """A lock-free pool of shared-memory blocks that any attached process allocates from.

    Create it in the owning process, hand it to others (it pickles as its name: unpickling
    attaches), and free every block from whichever process holds it. Numba code calls the
    ``pool_*`` kernels with :attr:`ctl` and :attr:`links`, and reads a block at
    ``data[pool_offset(ctl, h) : pool_offset(ctl, h) + pool_block_size(ctl, h)]``.

    Attributes:
        name: The segment's name.
        layout: Where everything sits in the segment.
        ctl: The control block (int64): headers, free-list heads, counters.
        links: One int64 per block: free-list links.
        data: The data region as bytes; a block sits at ``data[offset : offset + size]``.
    """

    def __init__(self, segment: SharedSegment, layout: PoolLayout) -> None:
        self._segment = segment
        self.name = segment.name
        self.layout = layout
        self.ctl = segment.array(0, np.int64, CTL_WORDS)
        self.links = segment.array(layout.links_offset, np.int64, max(layout.total_blocks, 1))
        self.data = segment.array(
            layout.data_start, np.uint8, layout.total_bytes - layout.data_start
        )

    @classmethod
    def create(cls, blocks: int | Sequence[int] | Mapping[int, int]) -> BufferPool:
        """Create a pool in a new segment owned (and removed on close or exit) by this process.

        Args:
            blocks: Blocks per class: one count for all 14 classes, 14 counts (4 KiB first), or
                ``{block_size_bytes: count}``. Pages are backed only when first written, so
                generous counts cost address space, not memory.

        Raises:
            ValueError: Bad counts. hogwild.errors.SharedMemoryError: No room for the segment.
        """
        layout = PoolLayout.compute(blocks)
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
        return (BufferPool.attach, (self.name,))

    def allocate(self, nbytes: int) -> int:
        """A handle to a free block of at least ``nbytes`` bytes.

        Raises:
            PoolRequestTooLargeError: ``nbytes`` is above 32 MiB or not positive.
            PoolExhaustedError: Every block of that class is handed out.
        """
        handle = pool_alloc(self.ctl, self.links, nbytes)
        if handle < 0:
            self._raise_alloc(handle, nbytes)
        return handle

    def try_allocate(self, nbytes: int) -> int | None:
        """Like :meth:`allocate`, but None when the class is exhausted."""
        handle = pool_alloc(self.ctl, self.links, nbytes)
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
        """Return a block to the pool.

        Raises:
            InvalidHandleError: ``handle`` names no block of this pool.
            DoubleFreeError: The block is not handed out.
        """
        code = pool_free(self.ctl, self.links, handle)
        if code == ERR_BAD_HANDLE:
            raise InvalidHandleError(f"buffer pool {self.name}: {handle} is not a block handle")
        if code == ERR_DOUBLE_FREE:
            raise DoubleFreeError(
                f"buffer pool {self.name}: block {handle} (class {CLASS_SIZES[handle >> 32]} B, "
                f"index {handle & IDX_MASK}) is not allocated: freed twice?"
            )

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
            out.append(
                ClassStats(
                    block_size=CLASS_SIZES[c],
                    blocks=int(self.ctl[base + C_NBLOCKS]),
                    in_use=int(atomic_load(self.ctl, base + C_IN_USE)),
                    high_water=int(atomic_load(self.ctl, base + C_HIGH_WATER)),
                    failures=int(atomic_load(self.ctl, base + C_FAILURES)),
                )
            )
        return out

    def in_use(self) -> int:
        """Blocks handed out now, over all classes."""
        return sum(s.in_use for s in self.stats())

    def close(self) -> None:
        """Detach; the owner also removes the segment's name (views stay valid until dropped)."""
        self._segment.close()

    def __enter__(self) -> BufferPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
