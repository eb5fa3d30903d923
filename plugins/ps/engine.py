"""Update threads: they own the shards, apply queued work in order, and answer through repliers.

Each shard belongs to one update thread (shard ``i`` of the server to thread ``i mod T``). The
network thread (or a benchmark, or the flusher) submits work (one record per kind, see
:mod:`~hogwild_plugins.ps.work`): the record goes into a slot of a fixed table and the slot's
number into the owning thread's lock-free queue (:class:`hogwild.shm.queue.MPMCQueue`, Vyukov's
bounded ring), whose free slots are themselves an MPMC queue: no lock on the path. A thread
drains up to :data:`MAX_BATCH` items at a time; the deltas queued for one shard are applied
together, block by cache-sized block (Adam 3.3.1's opportunistic batching), the rest one by one
in order, each by its kind's applier (:mod:`~hogwild_plugins.ps.appliers`): pulls see every
change queued before them (a client that pushed and then pulls sees its push). Work that was
given a version (every write with replication, ``copies > 1``) advances the shard's applied
version.

Threads pin themselves to their CPUs (the ``--node``'s) before touching their shards, so the
first touch puts the shards' pages on that node (or ``bind_memory`` already did, with libnuma).

A pull of a shard with no write queued or being applied needs no update thread: with one copy of
every shard, only the network thread queues writes, so while it copies the values
(:meth:`UpdateEngine.read_now`) nothing can start writing them; it answers at once, saving the
hand-over to the update thread and back (two thread wake-ups per pull). Each shard counts the
writes queued for it and the writes its thread finished (:attr:`Shard.writes_queued`,
:attr:`Shard.writes_done`); equal counts mean no write is pending.

A push of deltas for a shard whose thread is idle needs no update thread either
(:meth:`UpdateEngine.claim_idle`, :meth:`UpdateEngine.apply_claimed`): the caller takes the
thread's busy lock (which the thread holds while it processes a batch; the caller only tries
it, and a thread that took a batch off its queue while the caller holds it waits that long),
finds no write pending for the shard, and applies the delta itself. The order of writes is
kept (nothing was queued for the shard before it; whatever comes later queues behind it or is
applied by the same caller), a snapshot is never taken halfway through it (the thread would
need the lock), and a push is applied with one thread wake-up fewer on each side. Under load
the thread is busy or writes are pending, and pushes queue and are batched as above; only
pushes of deltas are applied this way (API (b)'s products take milliseconds, which the network
thread must not spend).

A :class:`SnapshotRound` asks every thread for copies of its shards changed since the last round
(values, rule state, applied version), taken between two updates: the flusher writes those.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
from hogwild_plugins.ps import kernels
from hogwild_plugins.ps.appliers import (
    APPLIERS,
    Rule,
    Tally,
    ack_reply,
    apply_delta_run,
    pull_reply,
)
from hogwild_plugins.ps.work import Kind, Pull, PushDeltas, Shard, Snapshot, SnapshotRound, Work
from numba import njit

from hogwild.errors import HogwildError
from hogwild.net.wire import ErrorCode, WireError
from hogwild.numa.pinning import pin_to_cpus
from hogwild.shm.queue import MPMCQueue, queue_try_get, queue_try_put, queue_words

__all__ = ["UpdateEngine"]

MAX_BATCH = 64
IDLE_WAIT_S = 0.05


@njit(cache=True)
def _put(q, value):
    """Append to the queue at address ``q`` (keeps the GIL: see :func:`_get`)."""
    return queue_try_put(q, value)


@njit(cache=True)
def _get(q):
    """Take from the queue at address ``q``: -1 when it is empty.

    Unlike the ``nogil`` queue kernels, these keep the GIL: a call of a few nanoseconds that
    releases the GIL hands it to another thread and then waits, up to Python's switch interval,
    to get it back, which is what made the queues slow from Python threads.
    """
    ok, value = queue_try_get(q)
    return value if ok else -1


def _named(work: Work) -> str:
    """A write as a failure names it: its kind, its client's sender and sequence number."""
    h = work.header
    return f"{type(work).__name__} {h.sender}:{h.seq}" if h is not None else type(work).__name__


class UpdateEngine:
    """The update threads of one server and their queues.

    Args:
        shards: The server's shards (``thread`` is assigned here).
        rule, lr, mu, eps: The update rule and its factors.
        threads: Number of update threads.
        cpus: CPUs the threads pin themselves to (None: no pinning).
        replier: Makes a thread's replier (None: replies are dropped, as in a benchmark).
        capacity: Work slots (a power of two); a full table makes ``submit`` refuse.
        scratch_floats: Each thread's API (b) scratch: at least one row of the widest fully
            connected layer (a vector push is acknowledged when queued: it must then apply).
    """

    def __init__(
        self,
        shards: Sequence[Shard],
        *,
        rule: int,
        lr: float,
        mu: float,
        eps: float,
        threads: int = 1,
        cpus: set[int] | None = None,
        replier: Callable[[], object] | None = None,
        capacity: int = 4096,
        scratch_floats: int = kernels.SCRATCH_FLOATS,
    ) -> None:
        self.shards = list(shards)
        self.rule = Rule(rule, lr, mu, eps)
        self.n_threads = max(1, min(threads, len(self.shards) or 1))
        for i, shard in enumerate(self.shards):
            shard.thread = i % self.n_threads
        self.cpus, self._make_replier = cpus, replier
        self._slots: list[Work | None] = [None] * capacity
        self._free = MPMCQueue.over(np.zeros(queue_words(capacity), np.int64), capacity)
        for slot in range(capacity):
            self._free.try_put(slot)
        self._free_q = self._free.ref
        self.queues = [
            MPMCQueue.over(np.zeros(queue_words(capacity), np.int64), capacity)
            for _ in range(self.n_threads)
        ]
        self._wake = [threading.Event() for _ in range(self.n_threads)]
        # held by a thread while it processes a batch; tried (never waited for) by claim_idle
        self._busy = [threading.Lock() for _ in range(self.n_threads)]
        self._stop = threading.Event()
        self._ready = threading.Barrier(self.n_threads + 1)
        self._threads: list[threading.Thread] = []
        self.tallies = [Tally() for _ in range(self.n_threads)]
        self.batches = [0] * self.n_threads
        self.pulls_at_once = 0  # pulls answered by the caller of read_now
        self.pushes_at_once = 0  # pushes applied by the caller of apply_claimed
        self.failures: list[str] = []
        # writes acknowledged (queued) that then failed to apply: each is a bug, and the shard
        # no longer holds what its clients were told (in the status: ``failed_after_ack``)
        self.failed_after_ack = 0
        # told of each such failure (the shard, what failed): the server stops its bucket
        self.on_failed_after_ack: Callable[[Shard, str], None] | None = None
        self._scratches: list[np.ndarray | None] = [None] * self.n_threads
        self.scratch_floats = max(kernels.SCRATCH_FLOATS, scratch_floats)

    def start(self, timeout: float = 60.0) -> None:
        """Start the threads; returns once each has pinned itself and touched its shards."""
        for t in range(self.n_threads):
            thread = threading.Thread(
                target=self._run, args=(t,), name=f"hogwild-update-{t}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        try:
            self._ready.wait(timeout)
        except threading.BrokenBarrierError:
            self.stop(timeout=1.0)
            raise HogwildError(
                f"the parameter server's {self.n_threads} update thread(s) did not start within "
                f"{timeout:g} s{': ' + '; '.join(self.failures) if self.failures else ''}"
            ) from None

    @property
    def alive(self) -> bool:
        """Every update thread is running (a dead one would leave its shards' queue unread)."""
        return all(thread.is_alive() for thread in self._threads)

    @property
    def stopped(self) -> bool:
        """No update thread is left (after :meth:`stop`)."""
        return not any(thread.is_alive() for thread in self._threads)

    @property
    def applied(self) -> list[int]:
        """Changes applied, per update thread."""
        return [tally.applied for tally in self.tallies]

    @property
    def updated(self) -> list[int]:
        """Parameter updates (floats, or multiply-adds for API (b)), per update thread."""
        return [tally.updated for tally in self.tallies]

    def submit(self, work: Work) -> bool:
        """Queue ``work`` for its shard's thread; False when every slot is taken."""
        slot = self.reserve()
        if slot is None:
            return False
        self.put(slot, work)
        return True

    def reserve(self) -> int | None:
        """A free work slot, or None when every one is taken (the caller answers BUSY)."""
        slot = _get(self._free_q)
        return None if slot < 0 else slot

    def unreserve(self, slot: int) -> None:
        _put(self._free_q, slot)

    def put(self, slot: int, work: Work) -> None:
        """Queue ``work`` in a reserved slot for its shard's thread."""
        self._slots[slot] = work
        shard = self.shards[work.local]
        if work.writes:
            shard.writes_queued += 1
        t = shard.thread
        _put(self.queues[t].ref, slot)  # never full: it has a cell for every slot
        self._wake[t].set()

    def read_now(self, work: Pull) -> tuple | None:
        """The reply to a pull, taken now by the calling thread, or None when it must queue.

        Only for servers whose writes are all queued by the calling thread (one copy of every
        shard: the network thread's): no write is pending for the shard, and none can be queued
        while this thread copies, so the copy sees every write queued before the pull and no
        write in progress.
        """
        shard = self.shards[work.local]
        if shard.writes_done != shard.writes_queued:
            return None
        self.pulls_at_once += 1
        return pull_reply(shard, work)

    def claim_idle(self, local: int) -> threading.Lock | None:
        """The busy lock of shard ``local``'s thread, taken, when the thread is between batches
        and no write is pending for the shard; None otherwise (queue the work instead).

        For servers whose writes are all queued by the calling thread (one copy of every
        shard), as :meth:`read_now`. The caller applies at most one push with it
        (:meth:`apply_claimed`) and releases it then, having possibly sent the push's
        acknowledgement first (``ack = "queued"``); it takes no other request meanwhile.
        """
        shard = self.shards[local]
        lock = self._busy[shard.thread]
        if not lock.acquire(blocking=False):
            return None
        if shard.writes_done != shard.writes_queued:
            lock.release()
            return None
        return lock

    def apply_claimed(self, work: PushDeltas) -> None:
        """Apply a push of deltas now, in the calling thread, holding :meth:`claim_idle`'s lock
        for its shard (the caller answers the client: nothing is sent from here). A failure is
        in :attr:`failures`, naming the push (its acknowledgement may have gone out already)."""
        shard = self.shards[work.local]
        shard.writes_queued += 1
        work.acked = True
        try:
            self._apply_deltas(shard.thread, shard, [work], None)
        except BaseException as exc:
            text = f"{_named(work)} (version {work.version}): {type(exc).__name__}: {exc}"
            work.failed = text
            self._record_failure(text)
            self._failed_after_ack(shard, text)  # acknowledged (queued) or answered by the caller
            if not work.settled:  # the version was given out: keep the counts aligned
                shard.applied += 1
                self._settle(shard, work)
            self._release(work)
            raise
        self.pushes_at_once += 1

    def forgo(self, work: Work) -> None:
        """A push admitted (its version given out) that will never be applied: its request
        failed before it was queued or applied. Counted as applied, as a failed apply is, so
        the shard's counts stay aligned with its versions; its buffers go back."""
        self.shards[work.local].applied += 1
        self._release(work)

    def snapshot(self, timeout: float = 30.0, full: bool = False) -> SnapshotRound | None:
        """Copies of the shards changed since the last snapshot (``full``: of every shard).

        None if a thread did not answer in time.
        """
        owners = {shard.thread: local for local, shard in enumerate(self.shards)}
        round_ = SnapshotRound(len(owners), full)
        if not owners:
            round_.done.set()  # a server that holds no shard has nothing to write
        for local in owners.values():
            deadline = time.monotonic() + timeout
            while not self.submit(Snapshot(local, round=round_)):
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.001)
        return round_ if round_.done.wait(timeout) else None

    def depths(self) -> list[int]:
        return [len(q) for q in self.queues]

    def stop(self, timeout: float = 10.0) -> None:
        """Apply what is queued, then stop the threads."""
        self._stop.set()
        for event in self._wake:
            event.set()
        for thread in self._threads:
            thread.join(timeout)

    # ------------------------------------------------------------------ the update threads

    def _run(self, t: int) -> None:
        replier = None
        try:
            if self.cpus:
                pin_to_cpus(self.cpus)  # this thread only (Linux: pid 0 is the calling thread)
            for shard in self.shards:
                if shard.thread == t:
                    self._first_touch(shard)
            replier = self._make_replier() if self._make_replier else None
        except BaseException as exc:  # noqa: BLE001 - reported in the status
            self.failures.append(f"update thread {t}: {exc}")
        try:
            self._ready.wait()
        except threading.BrokenBarrierError:  # start() gave up waiting: leave, releasing all
            if replier is not None:
                replier.close()
            return
        try:
            self._loop(t, replier)
        except BaseException as exc:  # noqa: BLE001
            self.failures.append(f"update thread {t}: {type(exc).__name__}: {exc}")
        finally:
            if replier is not None:
                replier.close()

    @staticmethod
    def _first_touch(shard: Shard) -> None:
        values, state = shard.initial or (None, None)
        if values is None:
            shard.values[:] = 0.0
        else:
            shard.values[:] = values
        if shard.state.size:
            shard.state[:] = 0.0 if state is None else state
        shard.initial = None

    def _loop(self, t: int, replier) -> None:
        queue, wake, free = self.queues[t].ref, self._wake[t], self._free_q
        while True:
            wake.clear()
            batch = []
            while len(batch) < MAX_BATCH:
                slot = _get(queue)
                if slot < 0:
                    break
                batch.append(self._slots[slot])
                self._slots[slot] = None
                _put(free, slot)
            if not batch:
                if self._stop.is_set():
                    return
                wake.wait(IDLE_WAIT_S)
                continue
            self.batches[t] += 1
            with self._busy[t]:
                self._process(t, batch, replier)

    def _process(self, t: int, batch: list[Work], replier) -> None:
        by_shard: dict[int, list[Work]] = {}
        for work in batch:
            if work.kind == Kind.SNAPSHOT:
                for local, items in by_shard.items():
                    self._apply_shard(t, local, items, replier)
                by_shard = {}
                self._snapshot(t, work.round)
            else:
                by_shard.setdefault(work.local, []).append(work)
        for local, items in by_shard.items():
            self._apply_shard(t, local, items, replier)

    def _apply_shard(self, t: int, local: int, items: list[Work], replier) -> None:
        shard = self.shards[local]
        run: list[Work] = []
        for work in items:
            if work.kind == Kind.DELTAS:
                run.append(work)
                continue
            if run:
                self._apply_run(t, shard, run, replier)
                run = []
            try:
                self._apply_one(t, shard, work, replier)
            except Exception as exc:  # noqa: BLE001 - answer, count, keep serving
                self._failed(shard, work, replier, exc)
        if run:
            self._apply_run(t, shard, run, replier)

    def _apply_run(self, t: int, shard: Shard, run: list[PushDeltas], replier) -> None:
        """:meth:`_apply_deltas` on an update thread: a run that fails is failed push by push
        (each answered or counted after its acknowledgement), and the thread goes on."""
        try:
            self._apply_deltas(t, shard, run, replier)
        except Exception as exc:  # noqa: BLE001 - answer, count, keep serving
            for work in run:
                if not work.settled:
                    self._failed(shard, work, replier, exc)

    def _failed(self, shard: Shard, work: Work, replier, exc: Exception) -> None:
        if work.version:
            shard.applied += 1  # the version was given out: keep the count aligned
        self._settle(shard, work)
        self._fail(work, replier, exc)

    def _apply_deltas(self, t: int, shard: Shard, run: list[PushDeltas], replier) -> None:
        apply_delta_run(self.rule, shard, run, self.tallies[t])
        for work in run:
            work.settled = True
        shard.writes_done += len(run)  # before the acknowledgements: a pull after one finds none
        for work in run:
            self._finish(shard, work, replier)

    def _apply_one(self, t: int, shard: Shard, work: Work, replier) -> None:
        scratch = self._scratch(t) if work.kind == Kind.VECTORS else None
        APPLIERS[work.kind](self.rule, shard, work, self.tallies[t], scratch)
        if work.kind == Kind.PULL:
            if replier is not None:
                replier.send(*pull_reply(shard, work))
            self._release(work)
            return
        self._settle(shard, work)
        self._finish(shard, work, replier)

    @staticmethod
    def _settle(shard: Shard, work: Work) -> None:
        """Count a finished write (once), before anyone is told it is done."""
        if work.writes and not work.settled:
            work.settled = True
            shard.writes_done += 1

    def _scratch(self, t: int) -> np.ndarray:
        scratch = self._scratches[t]
        if scratch is None:  # made by the thread itself: first touch on its node
            scratch = self._scratches[t] = np.zeros(self.scratch_floats, np.float32)
        return scratch

    def _finish(self, shard: Shard, work: Work, replier) -> None:
        if not work.acked and replier is not None and work.header is not None:
            replier.send(ack_reply(shard, work))
        self._release(work)

    @staticmethod
    def _release(work: Work) -> None:
        if work.free is not None:
            work.free()  # pool blocks go back
        work.drop_buffers()

    def _record_failure(self, text: str) -> None:
        self.failures.append(text)
        del self.failures[:-20]  # the latest

    def _failed_after_ack(self, shard: Shard, text: str) -> None:
        """A write acknowledged (or, with copies, committed elsewhere) failed to apply: counted,
        and the server told (it stops the shard's bucket)."""
        self.failed_after_ack += 1
        if self.on_failed_after_ack is not None:
            self.on_failed_after_ack(shard, text)

    def _fail(self, work: Work, replier, exc: Exception) -> None:
        refused = isinstance(exc, WireError)  # the request's own fault (a non-finite result)
        text = f"{type(exc).__name__}: {exc}"
        work.failed, work.refused = text, (exc.code if refused else None)
        if not refused or (work.acked and not work.replicated):  # its sender will not hear
            self._record_failure(text)
        # a write its client was told was applied, or (with copies) that other copies apply:
        # not a refusal with copies (every copy refuses it alike, the replication answers it)
        if work.acked and work.writes and not (refused and work.replicated):
            self._failed_after_ack(
                self.shards[work.local], f"{_named(work)} (version {work.version}): {text}"
            )
        # answered already (ack = "queued"), or the replication answers (from ``failed``)
        if replier is not None and work.header is not None and not work.acked:
            from hogwild.net.router import error_reply

            code = exc.code if refused else ErrorCode.INTERNAL
            text = str(exc) if refused else f"{type(exc).__name__}: {exc}"
            reply = error_reply(work.header, code, text)
            replier.send(reply.header, reply.frames)
        self._release(work)

    def _snapshot(self, t: int, round_: SnapshotRound) -> None:
        items = []
        for shard in self.shards:
            if shard.thread == t and (round_.full or shard.applied != shard.snapshotted):
                items.append((shard.index, shard.applied, shard.values.copy(), shard.state.copy()))
                shard.snapshotted = shard.applied
        round_.add(items, self.tallies[t].applied)
