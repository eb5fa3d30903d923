"""Where a parameter server receives the arrays of its requests: pool blocks or in place.

With ``recv = "pool"`` the router receives a push's frames into blocks of a private
:class:`~hogwild.shm.pool.BufferPool` (one copy, from ZeroMQ's message into a block that is then
in this core's cache when the update reads it); the block goes back to the pool once the update
applied it (:meth:`ReceivePool.free_later`), or at once when the request is refused
(:meth:`ReceivePool.release`). A request larger than the largest block, or one that finds every
block of its size in flight, is received in place instead (counted in ``misses``), never refused.
``"inplace"`` uses ZeroMQ's message buffers (no copy); :func:`recv_mode` decides ``"auto"``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["RECV_MODES", "ReceivePool", "recv_mode"]

RECV_MODES = ("auto", "pool", "inplace")
BLOCKS_PER_SIZE = 32


def recv_mode(recv: str, copies: int, cpus: int) -> str:
    """``recv``, with ``"auto"`` decided: pool blocks for one copy on two CPUs or more; in place
    otherwise. The copy into a block pays when ZeroMQ's I/O thread and the network thread run on
    different cores (the update then reads the block from its own core's cache, not the
    other's); on one CPU they share the cache and it is pure cost. With copies, a primary
    forwards the frames it received, so they stay in place."""
    if recv != "auto":
        return recv
    return "pool" if copies == 1 and cpus >= 2 else "inplace"


class ReceivePool:
    """Blocks to receive a server's request frames into (see the module docstring).

    Args:
        shard_floats: The largest shard's size in floats (the largest block holds two).
    """

    def __init__(self, shard_floats: int) -> None:
        from hogwild.shm.pool import BufferPool

        largest = max(shard_floats * 4, 4 << 20)
        sizes = [4096 << i for i in range(14) if (4096 << i) <= max(4096, 2 * largest)]
        self.pool = BufferPool.create({size: BLOCKS_PER_SIZE for size in sizes}, private=True)
        self.largest_block = sizes[-1]
        self.misses = 0  # requests received in place because no block of their size was free
        self._handles: dict[int, int] = {}

    def buffers(self, sizes: list[int]) -> list | None:
        """One block per frame of ``sizes`` bytes, or None: receive this request in place."""
        if max(sizes) > self.largest_block:
            return None  # larger than the pool's blocks: received in place
        out = []
        for nbytes in sizes:
            handle = self.pool.try_allocate(nbytes)
            if handle is None:  # every block of the size is in flight: in place, as with copies
                self.release(out)
                self.misses += 1
                return None
            block = self.pool.view(handle)[:nbytes]
            self._handles[block.ctypes.data] = handle
            out.append(block)
        return out

    def release(self, buffers: list) -> None:
        """Give ``buffers`` back now (their request was refused or answered)."""
        for block in buffers:
            handle = self._handles.pop(block.ctypes.data, None)
            if handle is not None:
                self.pool.free(handle)

    def free_later(self, frames: list) -> Callable[[], object] | None:
        """What gives ``frames``' blocks back once their update is applied (None: they were
        received in place)."""
        if not frames or not isinstance(frames[0], np.ndarray):
            return None
        handles = [self._handles.pop(f.ctypes.data) for f in frames]
        pool = self.pool
        return lambda: [pool.free(h) for h in handles]

    def close(self) -> None:
        self.pool.close()
