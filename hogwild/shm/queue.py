"""A bounded multi-producer, multi-consumer queue of int64 values in shared memory.

The queue is Dmitry Vyukov's bounded MPMC ring: ``capacity`` (a power of two) cells, each a
sequence number and a value, plus an enqueue and a dequeue position on cache lines of their own.
A producer claims position ``p`` by compare-and-swapping the enqueue position when cell
``p % capacity`` has sequence ``p``, writes the value, then publishes it by storing sequence
``p + 1`` (release); a consumer claims ``p`` when the cell's sequence is ``p + 1``, reads the value,
and frees the cell for the next lap by storing ``p + capacity``. Every item put is got exactly
once, in FIFO order per position. The whole state is one int64 array, so the queue lives in its
own segment (:meth:`MPMCQueue.create`) or in any shared int64 array (:meth:`MPMCQueue.over`),
and numba code drives it with :func:`queue_try_put` / :func:`queue_try_get`, given either that
array or, cheaper (no reference counting), its address :attr:`MPMCQueue.ref`.

What it carries is an int64: typically a :mod:`hogwild.shm.pool` block handle, so buffers move
between processes without copying. ``try_*`` never wait; ``put`` and ``get`` spin briefly, then
sleep with backoff, and raise :class:`QueueFullError` / :class:`QueueEmptyError` at their timeout:
no wait is unbounded. A producer killed between claiming a cell and publishing it leaves that
cell unreadable (consumers then time out): the queue is lock-free for live processes only.

Adam (§3.3.1) uses lock-free queues on its parameter servers' network and update paths; this is
the shared-memory, cross-process version of those queues.

What the product uses: the parameter server's update engine keeps its queues in private arrays
(:meth:`MPMCQueue.over`) and drives them from numba (:func:`queue_try_put`, :func:`queue_try_get`).
The cross-process face -- a queue in a segment of its own (:meth:`MPMCQueue.create`), attached
by name or by pickling in another process (:meth:`MPMCQueue.attach`), and the blocking
:meth:`~MPMCQueue.put` / :meth:`~MPMCQueue.get` -- is used by nothing yet; it is kept for model
partitioning's block passing (partitions on one host hand each other pool blocks of neurons
through these queues), and tested across processes in ``tests/proc/test_queue.py``.
"""

from __future__ import annotations

import time

import numpy as np
from numba import njit

from hogwild.errors import HogwildError, SharedMemoryError
from hogwild.shm.atomics import (
    raw_cas,
    raw_load,
    raw_load_relaxed,
    raw_relax,
    raw_store,
    raw_store_relaxed,
)
from hogwild.shm.pool_segment import SharedSegment

__all__ = [
    "MPMCQueue",
    "QueueEmptyError",
    "QueueFullError",
    "QueueTimeoutError",
    "queue_init",
    "queue_size",
    "queue_try_get",
    "queue_try_put",
    "queue_words",
]

QUEUE_MAGIC = 0x686F67776C645155  # "hogwldQU"
Q_MAGIC, Q_CAPACITY, Q_MASK = 0, 1, 2
Q_ENQ = 8  # own cache line
Q_DEQ = 16  # own cache line
Q_CELLS = 24  # cells: (sequence, value) pairs


class QueueTimeoutError(HogwildError):
    """A blocking queue operation ran out of time."""


class QueueFullError(QueueTimeoutError):
    """The queue stayed full until the timeout."""


class QueueEmptyError(QueueTimeoutError):
    """The queue stayed empty until the timeout."""


def queue_words(capacity: int) -> int:
    """Length of the int64 array a queue of ``capacity`` items needs."""
    return Q_CELLS + 2 * capacity


def _check_capacity(capacity: int) -> None:
    if capacity < 2 or capacity & (capacity - 1):
        raise ValueError(f"queue capacity must be a power of two >= 2, got {capacity}")


def queue_init(words: np.ndarray, capacity: int) -> None:
    """Initialize an empty queue of ``capacity`` items in ``words`` (int64, before any use)."""
    _check_capacity(capacity)
    if words.dtype != np.int64 or words.ndim != 1 or words.shape[0] < queue_words(capacity):
        raise ValueError(f"a queue of {capacity} needs {queue_words(capacity)} int64 words")
    words[: queue_words(capacity)] = 0
    words[Q_CAPACITY] = capacity
    words[Q_MASK] = capacity - 1
    words[Q_CELLS : Q_CELLS + 2 * capacity : 2] = np.arange(capacity, dtype=np.int64)
    words[Q_MAGIC] = QUEUE_MAGIC


@njit(cache=True, nogil=True, inline="always")
def queue_try_put(q, value):
    """Append ``value`` unless the queue is full; True if it was appended."""
    mask = raw_load_relaxed(q, Q_MASK)
    pos = raw_load_relaxed(q, Q_ENQ)
    while True:
        cell = Q_CELLS + 2 * (pos & mask)
        seq = raw_load(q, cell)
        dif = seq - pos
        if dif == 0:
            seen = raw_cas(q, Q_ENQ, pos, pos + 1)
            if seen == pos:
                raw_store_relaxed(q, cell + 1, value)
                raw_store(q, cell, pos + 1)
                return True
            pos = seen
        elif dif < 0:
            return False
        else:
            pos = raw_load_relaxed(q, Q_ENQ)


@njit(cache=True, nogil=True, inline="always")
def queue_try_get(q):
    """Take the oldest value: ``(True, value)``, or ``(False, 0)`` when the queue is empty."""
    mask = raw_load_relaxed(q, Q_MASK)
    pos = raw_load_relaxed(q, Q_DEQ)
    while True:
        cell = Q_CELLS + 2 * (pos & mask)
        seq = raw_load(q, cell)
        dif = seq - (pos + 1)
        if dif == 0:
            seen = raw_cas(q, Q_DEQ, pos, pos + 1)
            if seen == pos:
                value = raw_load_relaxed(q, cell + 1)
                raw_store(q, cell, pos + mask + 1)
                return True, value
            pos = seen
        elif dif < 0:
            return False, 0
        else:
            pos = raw_load_relaxed(q, Q_DEQ)


@njit(cache=True, nogil=True, inline="always")
def queue_size(q):
    """Items in the queue at about this moment (exact when nobody is using it)."""
    n = raw_load(q, Q_ENQ) - raw_load(q, Q_DEQ)
    return max(0, min(n, raw_load_relaxed(q, Q_CAPACITY)))


@njit(cache=True, nogil=True)
def _put_spin(q, value, spins):
    for _ in range(spins):
        if queue_try_put(q, value):
            return True
        raw_relax()
    return False


@njit(cache=True, nogil=True)
def _get_spin(q, spins):
    for _ in range(spins):
        ok, value = queue_try_get(q)
        if ok:
            return True, value
        raw_relax()
    return False, 0


class MPMCQueue:
    """A bounded lock-free MPMC queue of int64 values shared between processes.

    Attributes:
        words: The queue's whole state (int64).
        ref: Its address in this process, what numba code passes to ``queue_try_*`` (valid while
            this object lives).
        capacity: Most items it holds.
        name: Its segment's name when it owns one (pickling attaches by it), else None.
    """

    SPINS = 256
    """Tries before a blocking ``put``/``get`` starts to sleep."""

    def __init__(self, words: np.ndarray, segment: SharedSegment | None = None) -> None:
        if words.dtype != np.int64 or words.ndim != 1 or int(words[Q_MAGIC]) != QUEUE_MAGIC:
            raise ValueError("array does not hold an initialized hogwild queue")
        self.words = words
        self.ref = int(words.ctypes.data)
        self.capacity = int(words[Q_CAPACITY])
        self._segment = segment
        self.name = segment.name if segment is not None else None

    @classmethod
    def over(cls, words: np.ndarray, capacity: int | None = None) -> MPMCQueue:
        """A queue in an existing int64 array: initialized there when ``capacity`` is given."""
        if capacity is not None:
            queue_init(words, capacity)
        return cls(words)

    @classmethod
    def create(cls, capacity: int) -> MPMCQueue:
        """A new empty queue in a segment of its own, owned by this process.

        Used by nothing yet; kept for model partitioning's block passing.
        """
        _check_capacity(capacity)
        n = queue_words(capacity)
        segment = SharedSegment.create("queue", 8 * n)
        words = segment.array(0, np.int64, n)
        queue_init(words, capacity)
        return cls(words, segment)

    @classmethod
    def attach(cls, name: str) -> MPMCQueue:
        """Attach a queue another process created with :meth:`create`.

        Used by nothing yet; kept for model partitioning's block passing.
        """
        segment = SharedSegment.attach(name)
        words = segment.array(0, np.int64, segment.size // 8)
        try:
            return cls(words, segment)
        except ValueError as exc:
            segment.close()
            raise SharedMemoryError(f"{name}: {exc}") from exc

    def __reduce__(self):
        if self.name is None:
            raise TypeError("a queue over a caller's array pickles with that array; share it")
        return (MPMCQueue.attach, (self.name,))

    def try_put(self, value: int) -> bool:
        """Append ``value`` if there is room; never waits."""
        return bool(queue_try_put(self.words, value))

    def try_get(self) -> int | None:
        """The oldest value, or None if the queue is empty; never waits."""
        ok, value = queue_try_get(self.words)
        return int(value) if ok else None

    def put(self, value: int, timeout: float = 10.0) -> None:
        """Append ``value``, waiting up to ``timeout`` seconds for room.

        Raises:
            QueueFullError: Still full after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        pause = 20e-6
        while not _put_spin(self.words, value, self.SPINS):
            if time.monotonic() >= deadline:
                raise QueueFullError(
                    f"queue {self.name or '(in array)'} of {self.capacity} stayed full "
                    f"for {timeout} s"
                )
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

    def get(self, timeout: float = 10.0) -> int:
        """The oldest value, waiting up to ``timeout`` seconds for one.

        Raises:
            QueueEmptyError: Still empty after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        pause = 20e-6
        while True:
            ok, value = _get_spin(self.words, self.SPINS)
            if ok:
                return int(value)
            if time.monotonic() >= deadline:
                raise QueueEmptyError(
                    f"queue {self.name or '(in array)'} stayed empty for {timeout} s"
                )
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

    def __len__(self) -> int:
        return int(queue_size(self.words))

    def close(self) -> None:
        """Detach; the owner also removes the segment's name."""
        if self._segment is not None:
            self._segment.close()

    def __enter__(self) -> MPMCQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
