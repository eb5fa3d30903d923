"""Per-worker counters and slots, one 64-byte cache line each.

Workers report progress (examples seen, updates applied, losses) through counters the parent
reads while they run. Packed side by side, eight workers' int64 counters would share one cache
line and every increment would steal the line from the other seven (false sharing). Here each
worker owns a *slot* of ``SLOT_WORDS`` int64 words, exactly one 64-byte line, at a 64-byte aligned
address; a slot holds up to eight fields (``field`` 0..7).

Invariant: a slot's fields are written by its worker alone (``slot_add`` is a single-writer
increment: a relaxed load and store, no lock prefix) and read by anyone with relaxed atomic loads,
so a reader sees every field's latest or a slightly older value, never a torn one. A field that
several writers share must use :func:`hogwild.shm.atomics.atomic_add` instead.

The slots live in any int64 array: the arena's counters region, a pool block, or private memory
from :func:`aligned_empty`. Adam (§3.2.1) keeps per-thread training contexts apart for the same
reason: no two threads write one cache line.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from hogwild.shm.atomics import raw_load_relaxed, raw_store_relaxed

__all__ = [
    "CACHE_LINE",
    "SLOT_WORDS",
    "PaddedSlots",
    "aligned_empty",
    "slot_add",
    "slot_load",
    "slot_store",
    "slot_sum",
    "slots_words",
]

CACHE_LINE = 64
SLOT_WORDS = CACHE_LINE // 8


def slots_words(n_slots: int) -> int:
    """Length of the int64 array that holds ``n_slots`` padded slots."""
    return n_slots * SLOT_WORDS


def aligned_empty(
    shape: int | tuple[int, ...], dtype: np.dtype | type = np.float64, align: int = CACHE_LINE
) -> np.ndarray:
    """An uninitialized array whose first element sits on an ``align``-byte boundary.

    Use it for training contexts and scratch buffers, after the worker is pinned, so the pages
    are first touched, and placed, on the worker's NUMA node.
    """
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    nbytes = max(count, 1) * dtype.itemsize
    raw = np.empty(nbytes + align, dtype=np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start : start + nbytes].view(dtype)[:count].reshape(shape)


@njit(cache=True, nogil=True, inline="always")
def slot_add(words, slot, field, value):
    """Add ``value`` to a field of the caller's own slot (single writer); returns the new value."""
    i = slot * SLOT_WORDS + field
    new = raw_load_relaxed(words, i) + value
    raw_store_relaxed(words, i, new)
    return new


@njit(cache=True, nogil=True, inline="always")
def slot_store(words, slot, field, value):
    """Set a field of the caller's own slot."""
    raw_store_relaxed(words, slot * SLOT_WORDS + field, value)


@njit(cache=True, nogil=True, inline="always")
def slot_load(words, slot, field):
    """Read a field of any slot."""
    return raw_load_relaxed(words, slot * SLOT_WORDS + field)


@njit(cache=True, nogil=True, inline="always")
def slot_sum(words, n_slots, field):
    """Sum of one field over the first ``n_slots`` slots."""
    total = 0
    for s in range(n_slots):
        total += raw_load_relaxed(words, s * SLOT_WORDS + field)
    return total


class PaddedSlots:
    """``n_slots`` padded slots over an int64 array (shared or private).

    Attributes:
        words: The flat int64 array (what numba code passes to ``slot_*``).
        n_slots: Number of slots.
    """

    def __init__(self, words: np.ndarray, n_slots: int) -> None:
        if words.dtype != np.int64 or words.ndim != 1 or words.shape[0] < slots_words(n_slots):
            need = slots_words(n_slots)
            raise ValueError(f"{n_slots} padded slots need a 1-D int64 array of {need} words")
        if words.ctypes.data % CACHE_LINE:
            raise ValueError("padded slots must start on a 64-byte boundary")
        self.words = words[: slots_words(n_slots)]
        self.n_slots = n_slots

    @classmethod
    def allocate(cls, n_slots: int) -> PaddedSlots:
        """Zeroed slots in private, 64-byte aligned memory."""
        words = aligned_empty(slots_words(n_slots), np.int64)
        words[:] = 0
        return cls(words, n_slots)

    def table(self) -> np.ndarray:
        """The slots as an ``(n_slots, 8)`` view: row = worker, column = field."""
        return self.words.reshape(self.n_slots, SLOT_WORDS)

    def add(self, slot: int, value: int, field: int = 0) -> int:
        """Add to a field of ``slot`` (the caller must be its only writer); the new value."""
        self._check(slot, field)
        return int(slot_add(self.words, slot, field, value))

    def store(self, slot: int, value: int, field: int = 0) -> None:
        """Set a field of ``slot``."""
        self._check(slot, field)
        slot_store(self.words, slot, field, value)

    def load(self, slot: int, field: int = 0) -> int:
        """Read a field of ``slot``."""
        self._check(slot, field)
        return int(slot_load(self.words, slot, field))

    def total(self, field: int = 0) -> int:
        """Sum of ``field`` over all slots."""
        if not 0 <= field < SLOT_WORDS:
            raise IndexError(f"field {field} outside 0..{SLOT_WORDS - 1}")
        return int(slot_sum(self.words, self.n_slots, field))

    def _check(self, slot: int, field: int) -> None:
        if not 0 <= slot < self.n_slots or not 0 <= field < SLOT_WORDS:
            raise IndexError(f"slot {slot} field {field} outside {self.n_slots} x {SLOT_WORDS}")
