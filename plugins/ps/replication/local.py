"""Work queued on this server's own update engine by the replication, and waiting for it.

The replication applies work here from three threads: the network thread (or the copy's
refresher thread, for a message that waited for etcd) queues a copy's committed updates and a
snapshot's restore, the replication thread a primary's admitted updates, the
updates a new primary had prepared, and barriers before a snapshot is read. Each shard's queue is
applied in order, so a :class:`~hogwild_plugins.ps.work.Barrier` queued after a shard's
updates is done only once they are. Nothing waits without a bound: ``LOCAL_APPLY_S``.
"""

from __future__ import annotations

import threading
import time

from hogwild_plugins.ps.work import Barrier

from hogwild.errors import HogwildError
from hogwild.net.wire import ErrorCode, WireError

__all__ = ["LOCAL_APPLY_S", "Countdown", "LocalApplier"]

LOCAL_APPLY_S = 30.0


class Countdown:
    """Waits until ``n`` local applications finished (the engine calls :meth:`done`)."""

    def __init__(self, n: int) -> None:
        self.left, self.cond = n, threading.Condition()

    def done(self) -> None:
        with self.cond:
            self.left -= 1
            if self.left <= 0:
                self.cond.notify_all()

    def wait(self, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.left <= 0, timeout)


class LocalApplier:
    """Queues work on ``server``'s update engine (see the module docstring)."""

    def __init__(self, server) -> None:
        self.server = server

    def hold(self, n: int) -> list[int]:
        """Up to ``n`` of the engine's free slots, taken now (never waiting): queue into them
        with :meth:`apply_held`, give back the rest with :meth:`release`."""
        engine, slots = self.server.engine, []
        while len(slots) < n:
            slot = engine.reserve()
            if slot is None:
                break
            slots.append(slot)
        return slots

    def release(self, slots: list[int]) -> None:
        """Give back held slots that were not used."""
        for slot in slots:
            self.server.engine.unreserve(slot)
        slots.clear()

    def apply_held(self, works: list, slots: list[int], countdown: Countdown | None = None) -> None:
        """Queue ``works`` in order into ``slots`` (from :meth:`hold`: one each; those used are
        taken off the list)."""
        if len(works) > len(slots):
            raise AssertionError(f"{len(works)} works for {len(slots)} held slots")
        engine = self.server.engine
        for work in works:
            self._answered_here(work, countdown)
            engine.put(slots.pop(), work)

    @staticmethod
    def _answered_here(work, countdown: Countdown | None) -> None:
        work.acked = work.replicated = True  # the replication answers, not the engine
        if countdown is not None:
            chained = work.free
            work.free = (
                countdown.done if chained is None else (lambda c=chained: (c(), countdown.done()))
            )

    def apply(self, works: list, countdown: Countdown | None = None) -> None:
        """Queue ``works`` on the engine, in order (waiting for free slots, up to
        ``LOCAL_APPLY_S``: the replication thread only); the replication answers them, not the
        engine. ``countdown`` counts each one applied."""
        engine = self.server.engine
        for work in works:
            self._answered_here(work, countdown)
            deadline = time.monotonic() + LOCAL_APPLY_S
            slot = engine.reserve()
            while slot is None:
                if time.monotonic() > deadline:
                    raise WireError("the update engine's queues stayed full", ErrorCode.BUSY)
                time.sleep(0.001)
                slot = engine.reserve()
            engine.put(slot, work)

    def apply_and_wait(self, works: list, what: str) -> None:
        """Queue ``works`` on the engine and wait until each is applied.

        Raises:
            HogwildError: Not applied within ``LOCAL_APPLY_S`` (naming ``what``).
        """
        done = Countdown(len(works))
        self.apply(works, done)
        if not done.wait(LOCAL_APPLY_S):
            raise HogwildError(f"{what}: not applied within {LOCAL_APPLY_S:g} s")

    def barrier(self, shards: list[int]) -> None:
        """Wait until the update engine applied everything queued for ``shards`` (a copy just
        promoted may still have commits queued by the network thread)."""
        works = [Barrier(self.server.local[s]) for s in shards]
        self.apply_and_wait(works, f"shards {shards}: the queued updates")
