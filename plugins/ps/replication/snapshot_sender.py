"""A primary's snapshots to its copies, sent and waited for on a thread of their own.

When a bucket role asks for a copy to be caught up
(:class:`~hogwild_plugins.ps.replication.bucket_role_events.Sync`), the replication thread takes
what it will send, at once and together (:class:`Parcel`: the catch-up probes of the shards no
commit round has open, and the snapshot of every shard of the bucket, after the update engine's
barrier: :mod:`~hogwild_plugins.ps.replication.sync_parcels`), and hands it here. This thread
asks the copy whether its logs hold those shards (the probes), sends the snapshots of the shards
whose logs do not, waits for the answers (a copy that does not answer fails after the peer link's
timeout and retry), and hands back an :class:`Outcome`, which the replication thread tells the
bucket's role under the Sync's ticket
(:func:`~hogwild_plugins.ps.replication.executor.snapshot_answered`).

Meanwhile the replication thread goes on: commit rounds of the other buckets, reads of the map,
the other roles' work. The bucket being synced takes no writes while its role waits for that
Sync (a role does not serve while a snapshot of it is under way), so nothing the parcel was
taken from changes before it is sent; a role that stopped waiting meanwhile (deposed, elected
again, the copy dropped by a round, or another Sync of it asked for: the bucket may have taken
writes since, which the parcel lacks) takes the outcome as no news, by the Sync's ticket. The
parcel carries the epoch it was taken under, which the copy's gate checks too. One thread, one
parcel at a time, on a peer link of its own (a ZeroMQ socket belongs to one thread); a
``FENCED`` answer is handed back in the outcome, never told to a role from here.

Anything else this thread meets (a copy breaking the protocol: a bad header, a wrong count of
frames; a ZeroMQ error) ends it as an exception on the replication thread does: the parcel's
outcome is queued as not delivered, :attr:`SnapshotSender.failure` names the error, and
``on_failure`` tells the replication, which fails the server (its buckets go to the others).
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from hogwild_plugins.ps.replication.bucket_role_events import Sync
from hogwild_plugins.ps.replication.peer_link import PeerLink

from hogwild.net.channel import Request
from hogwild.net.wire import ErrorCode

__all__ = ["Outcome", "Parcel", "SnapshotSender"]

WAIT_S = 0.1  # how often the idle thread looks whether it is stopping


@dataclass
class Parcel:
    """What a :class:`Sync` sends: ``probes`` (frameless ``SNAPSHOT`` requests: does the copy's
    log hold this shard's committed state?) and ``snapshots`` (shard -> its full ``SNAPSHOT``),
    taken together by the replication thread."""

    action: Sync
    probes: list[Request]
    snapshots: dict[int, Request]
    number: int = field(default=0)  # which parcel of this server's (its status names it)


@dataclass(frozen=True)
class Outcome:
    """What a parcel came to: ``delivered`` (every shard caught up or restored), ``fenced`` (a
    copy refused it as an old epoch's)."""

    action: Sync
    delivered: bool
    fenced: bool


class SnapshotSender:
    """The thread of a primary's snapshots (see the module docstring).

    Args:
        link: A peer link of this thread's own (opened and closed by the caller).
        counters: The replication's counters (``snapshots_sent``, ``copies_caught_up``).
        current: ``current(action)``: whether the role that asked still waits for the Sync's
            answer (read without the lock: it only spares a snapshot nobody waits for; the role
            decides on the outcome).
        on_failure: ``on_failure(reason)``: this thread ended on an error (called from it).
    """

    def __init__(
        self,
        link: PeerLink,
        counters: dict,
        current: Callable[[Sync], bool],
        on_failure: Callable[[str], None],
    ) -> None:
        self.link, self.counters, self.current = link, counters, current
        self.on_failure = on_failure
        self.failure: str | None = None  # what ended this thread (None: it runs, or stopped)
        self.link.on_fenced = self._fenced
        self._parcels: queue.SimpleQueue[Parcel] = queue.SimpleQueue()
        self._outcomes: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._numbers = itertools.count(1)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fenced_now = False
        self.under_way: dict | None = None  # the parcel being sent: bucket, server, number

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hogwild-snapshots", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (a parcel under way ends with its exchange's timeout)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def send(self, parcel: Parcel) -> None:
        """Queue ``parcel`` (the replication thread)."""
        parcel.number = next(self._numbers)
        self._parcels.put(parcel)

    def outcomes(self) -> list[Outcome]:
        """The outcomes since the last call, in the order their parcels were sent."""
        out = []
        while True:
            try:
                out.append(self._outcomes.get_nowait())
            except queue.Empty:
                return out

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                parcel = self._parcels.get(timeout=WAIT_S)
            except queue.Empty:
                continue
            action = parcel.action
            self.under_way = {"bucket": action.bucket, "server": action.server,
                              "number": parcel.number}  # fmt: skip
            self._fenced_now = False
            try:
                delivered = self._deliver(parcel)
            except Exception as exc:  # noqa: BLE001 - a copy breaking the protocol, or a bug
                self.failure = f"{type(exc).__name__}: {exc}"
                self._outcomes.put(Outcome(action, False, False))
                self.on_failure(self.failure)  # the server fails: its buckets go to the others
                return
            finally:
                self.under_way = None
            self._outcomes.put(Outcome(action, delivered, self._fenced_now))

    def _deliver(self, parcel: Parcel) -> bool:
        """The probes, then the snapshots of the shards the copy's log does not hold: whether
        the copy holds every shard now."""
        probed = {r.header.target for r in parcel.probes}
        need = set(parcel.snapshots) - probed
        if parcel.probes:
            codes: list = []
            ok = self.link.exchange(parcel.probes, codes)
            for request, good, code in zip(parcel.probes, ok, codes, strict=True):
                if not good and code != ErrorCode.NEED_SYNC:
                    return False  # no answer, or refused: the copy is not caught up
                if not good:
                    need.add(request.header.target)
            self.counters["copies_caught_up"] += sum(ok)
        if not need or self._fenced_now:
            return not self._fenced_now
        if not self.current(parcel.action):
            return False  # deposed meanwhile: no snapshot of this side's goes out
        requests = [parcel.snapshots[shard] for shard in sorted(need)]
        ok = self.link.exchange(requests)
        self.counters["snapshots_sent"] += sum(ok)
        return all(ok)

    def _fenced(self, bucket: int) -> None:
        self._fenced_now = True
