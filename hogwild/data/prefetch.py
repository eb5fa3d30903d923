"""A background thread that fetches batches ahead of the training loop (Adam section 3.1).

Adam's trainers request images "in advance in batches using a background thread so that the
main training threads always have the required image data in memory". A :class:`Prefetcher`
owns a ring of ``depth + 1`` preallocated buffer sets and one daemon thread. The thread takes the
next request of the current sequence (typically an array of record indices), waits for a free
buffer set, fills it with ``fetch(request, buffers)`` and hands it over; the consumer takes
filled sets in order (:meth:`Prefetcher.get`, or iteration) and gives each back implicitly by
asking for the next. Up to ``depth`` sets are ready while the consumer works on one, so in the
steady state the consumer never blocks; the seconds it did block are summed in
:attr:`Prefetcher.wait_s` (the trainer reports them as ``data_wait_s``).

Sequences are queued with :meth:`Prefetcher.start` (one per epoch, say); the thread moves on to
the next sequence as soon as the current one is fetched, so the next epoch's first batches are
ready when its loop begins.

Invariants: no allocation in the steady state (the buffer sets are allocated once, by the
caller's ``allocate``); every blocking wait has a timeout, so a stalled fetch surfaces as a
:class:`PrefetchTimeoutError` instead of a hang; an exception raised by ``fetch`` is re-raised in
the consumer, in order, where the failed batch would have been; :meth:`Prefetcher.close` stops
and joins the thread on every exit path (it is a context manager).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from hogwild.errors import DataError

DEFAULT_TIMEOUT_S = 120.0
"""How long :meth:`Prefetcher.get` waits for a batch before giving up."""

_POLL_S = 0.05
_END = object()


class PrefetchTimeoutError(DataError):
    """No batch arrived within the timeout: the fetch is stalled or far too slow."""


@dataclass
class Batch:
    """One filled buffer set, lent to the consumer until its next :meth:`Prefetcher.get`.

    Attributes:
        request: What was fetched (the index array passed in the sequence).
        buffers: The buffer set ``allocate()`` made, filled by ``fetch``.
        slot: Which buffer set of the ring this is.
    """

    request: Any
    buffers: Any
    slot: int


class Prefetcher:
    """Fetch a sequence of requests into a ring of preallocated buffers, ahead of the consumer.

    Args:
        fetch: ``fetch(request, buffers)`` fills ``buffers`` for ``request``; called on the
            prefetch thread only. Exceptions are passed on to the consumer.
        allocate: Makes one buffer set (any object: a tuple of arrays, say); called
            ``depth + 1`` times, here.
        depth: How many batches may be ready ahead of the one in use.
        timeout_s: How long :meth:`get` waits for one batch before raising.
        name: The thread's name.
    """

    def __init__(
        self,
        fetch: Callable[[Any, Any], None],
        allocate: Callable[[], Any],
        *,
        depth: int = 2,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        name: str = "hogwild-prefetch",
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self._fetch = fetch
        self.timeout_s = timeout_s
        self._buffers = [allocate() for _ in range(depth + 1)]
        self._free: queue.Queue[int] = queue.Queue()
        for slot in range(depth + 1):
            self._free.put(slot)
        self._ready: queue.Queue = queue.Queue()
        self._sequences: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._lent: int | None = None
        self._pending = 0  # sequences started and not yet consumed to their end
        self._generation = 0  # bumped by cancel(): older sequences and batches are dropped
        self.wait_s = 0.0
        self.batches = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def start(self, requests: Iterable[Any]) -> None:
        """Queue a sequence of requests; fetching begins as soon as earlier sequences are done."""
        self._check_open()
        self._pending += 1
        self._sequences.put((self._generation, requests))

    def cancel(self) -> None:
        """Abandon every started sequence (an epoch that ended early), keeping the thread.

        Batches already fetched are dropped; the fetch in progress, if any, completes and is
        dropped too. The next :meth:`start` begins afresh.
        """
        self._check_open()
        self._give_back()
        self._generation += 1
        self._pending = 0
        self._drop_stale()

    def _drop_stale(self) -> None:
        """Return the slots of ready batches from cancelled sequences to the ring."""
        kept = []
        while True:
            try:
                item = self._ready.get_nowait()
            except queue.Empty:
                break
            if item[0] == self._generation:
                kept.append(item)
            elif item[1] is not None:
                self._free.put(item[1])
        for item in kept:
            self._ready.put(item)

    def get(self, timeout_s: float | None = None) -> Batch | None:
        """The next filled batch of the oldest sequence, or None at that sequence's end.

        The batch returned by the previous call is given back to the ring first, so the caller
        must be done with it.

        Raises:
            PrefetchTimeoutError: Nothing arrived within ``timeout_s`` (default: the
                prefetcher's ``timeout_s``).
            RuntimeError: No sequence was started, or the prefetcher is closed.
            Exception: Whatever ``fetch`` raised for this batch.
        """
        self._check_open()
        self._give_back()
        if self._pending == 0:
            raise RuntimeError("no sequence started: call start(requests) first")
        limit = self.timeout_s if timeout_s is None else timeout_s
        started = time.perf_counter()
        while True:
            try:
                generation, slot, payload = self._ready.get_nowait()
            except queue.Empty:
                generation, slot, payload = self._wait_ready(started, limit)
            if generation == self._generation:
                break
            if slot is not None:  # a batch of a cancelled sequence
                self._free.put(slot)
        self.wait_s += time.perf_counter() - started
        if payload is _END:
            self._pending -= 1
            return None
        if isinstance(payload, BaseException):
            self._pending -= 1  # the thread abandons the rest of a sequence that failed
            raise payload
        request = payload
        self._lent = slot
        self.batches += 1
        return Batch(request, self._buffers[slot], slot)

    def _wait_ready(self, started: float, limit: float):
        while True:
            remaining = limit - (time.perf_counter() - started)
            if remaining <= 0:
                raise PrefetchTimeoutError(
                    f"no batch from the prefetch thread in {limit:.0f} s: the data source is "
                    "stalled or far too slow"
                )
            try:
                return self._ready.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                if not self._thread.is_alive():
                    raise RuntimeError("the prefetch thread is not running") from None

    def __iter__(self) -> Iterator[Batch]:
        """The batches of the oldest started sequence, in order."""
        while (batch := self.get()) is not None:
            yield batch

    def _give_back(self) -> None:
        if self._lent is not None:
            self._free.put(self._lent)
            self._lent = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                generation, requests = self._sequences.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            try:
                for request in requests:
                    if generation != self._generation:
                        break  # cancelled
                    slot = self._take_free()
                    if slot is None:
                        return
                    try:
                        self._fetch(request, self._buffers[slot])
                    except BaseException:
                        self._free.put(slot)
                        raise
                    self._ready.put((generation, slot, request))
            except BaseException as exc:  # hand it to the consumer, in order
                self._ready.put((generation, None, exc))
                continue
            self._ready.put((generation, None, _END))

    def _take_free(self) -> int | None:
        while not self._stop.is_set():
            try:
                return self._free.get(timeout=_POLL_S)
            except queue.Empty:
                continue
        return None

    def _check_open(self) -> None:
        if self._stop.is_set():
            raise RuntimeError("the prefetcher is closed")

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the thread (after the fetch in progress, if any) and wait for it."""
        self._stop.set()
        self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        """Whether the prefetch thread is running."""
        return self._thread.is_alive()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
