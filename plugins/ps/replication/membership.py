"""A replicated server's membership in etcd: its session lease, ``members/<index>``, the heartbeat.

The server registers ``members/<index>`` (its address, its lease, the buckets it has seen a
record of: :class:`~hogwild_plugins.ps.failover.MemberRecord`) under a lease of ``lease_s``
seconds and a heartbeat thread renews it every fifth of that; the replication thread writes the
key again, under the same lease, when it learned of a bucket whose record etcd lacks, or when a
read of the map finds the key gone while the lease lives (the job's keys deleted under live
servers: the others would no longer hear what it had seen) (:meth:`Membership.refresh`). The
:class:`~hogwild_plugins.ps.failover.LeaseClock` says, by this process's own clock, whether the
lease is still valid: it always gives up before etcd does. A lease found lost (the process was
paused past it) is counted, the buckets are told at once (``on_change``: they step down) and a
new lease is taken and registered. The last leases granted are kept (``held``,
:data:`HELD_LEASES`): a read of the map whose ``revoked/<me>`` marker names one of them (the
driver counted this process lost and starts another in its place) stops the server
(:func:`~hogwild_plugins.ps.failover.replaced`, on the replication thread). Nothing is decided
here: the bucket roles read the members.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping

from hogwild_plugins.ps.etcd import Etcd, LeaseExpired
from hogwild_plugins.ps.failover import LeaseClock, MemberRecord, lease_now
from hogwild_plugins.ps.replication.start_asks import START_WITHIN_S, ask_at_start

from hogwild.errors import HogwildError

__all__ = ["Membership", "unlisted_and_unrecorded"]

BEAT_S = 0.05  # how often the heartbeat looks whether a renewal is due
HELD_LEASES = 16
"""How many of its last leases a process keeps (``Membership.held``) for a ``revoked/<me>``
marker to name. A marker names a lease the driver read from ``members/<me>``, i.e. one this
process registered, and lives 2 TTLs (and two request timeouts) past that lease's revoke. The
process loses a lease only by a pause or a cut of about a TTL each (etcd gives no new lease to
a process it cannot reach), and it reads the map, and stops, as soon as it registers again
with etcd in reach: a few leases at most come after the one marked. 16 is far more than that,
and keeps the list (rebuilt as a set on every read of the map) from growing with every lease
lost over a long job on a loaded machine."""


def unlisted_and_unrecorded(roles: Mapping, listed: Iterable[int]) -> bool:
    """Whether a bucket this server has seen (its role's ``seen``) is not in the ``listed``
    buckets of its ``members/<me>`` while etcd has no record of it that this side follows (none
    read, or the record was lost): then only the key can tell the others that the bucket had
    a record, and it is written again. A bucket whose record is in etcd speaks for itself."""
    listed = set(listed)
    return any(
        role.seen and b not in listed and (role.record is None or role.record_lost)
        for b, role in roles.items()
    )


class Membership:
    """One server's lease and registration (see the module docstring).

    Args:
        etcd: The heartbeat's own etcd connection (a slow map read never delays a renewal).
        me: The server's index.
        address: What ``members/<me>`` tells the others (``HOST:PORT``).
        lease_s: The lease's TTL.
        on_change: Called when the membership changed (registered, or the lease was lost).
        seen: The buckets this server has seen a record of, met a member that had, or whose
            record its store remembers (``members/<me>`` lists them: a missing record is a new
            bucket only when no live member lists it).
    """

    def __init__(
        self,
        etcd: Etcd,
        me: int,
        address: str,
        lease_s: int,
        on_change: Callable[[], None],
        seen: Callable[[], list[int]],
    ) -> None:
        self.etcd, self.me, self.address = etcd, me, address
        self.lease_s, self.on_change, self.seen = int(lease_s), on_change, seen
        self.clock = LeaseClock()
        self.leases_lost = 0
        self.held: list[int] = []  # the last HELD_LEASES leases granted, oldest first
        self._key_lock = threading.Lock()  # the heartbeat's registration, the refresh
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def register(self) -> None:
        """Take a lease and put ``members/<me>`` under it."""
        sent = lease_now()
        lease = self.etcd.grant(self.lease_s)
        # kept before the key names it (the driver learns a lease only from the key); a new
        # list, not one changed in place, for the replication thread reading it meanwhile
        self.held = [*self.held[1 - HELD_LEASES :], lease]
        with self._key_lock:
            self._put(lease)
            self.clock.granted(lease, self.lease_s, sent)
        self.on_change()

    def refresh(self, etcd: Etcd, listed: list[int] | None) -> None:
        """Write ``members/<me>`` again through ``etcd`` (the calling thread's own connection),
        under the lease it is under, with the buckets seen now, unless etcd's key (``listed``:
        the buckets it lists, None: the key is missing) lists them already (a no-op before the
        first registration; the caller decides when: :func:`unlisted_and_unrecorded`, or the
        key missing under a live lease).

        Raises:
            HogwildError: etcd did not take it (the lease lapsed: the heartbeat registers again).
        """
        with self._key_lock:
            if self.clock.lease and self.seen() != listed:  # (0 before the first grant)
                self._put(self.clock.lease, etcd)

    def _put(self, lease: int, etcd: Etcd | None = None) -> None:
        seen = self.seen()
        record = MemberRecord(self.address, lease, self.lease_s, frozenset(seen))
        (etcd or self.etcd).put(f"members/{self.me}", record.value(), lease=lease)

    def start(
        self, within_s: float = START_WITHIN_S, stopping: Callable[[], bool] = lambda: False
    ) -> None:
        """Register (asked again while etcd does not answer: :func:`~hogwild_plugins.ps.
        replication.start_asks.ask_at_start`), then keep the lease alive on a thread of its own.

        Raises:
            EtcdUnavailable: etcd did not take the registration within ``within_s``.
            StartStopped: ``stopping()`` became true between two tries.
        """
        ask_at_start(self.register, "registration", self.me, within_s, stopping)
        self._thread = threading.Thread(target=self._beat, name="hogwild-lease", daemon=True)
        self._thread.start()

    def halt(self) -> None:
        """Tell the heartbeat to stop renewing (from any thread; it ends within a beat)."""
        self._stop.set()

    def stop(self) -> None:
        """Stop the heartbeat (the lease is still held: :meth:`revoke` gives it back)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def revoke(self) -> None:
        """Give the lease back (the others take over at once); etcd gone: it lapses by itself."""
        if self.clock.lease:
            try:
                self.etcd.revoke(self.clock.lease)
            except HogwildError:
                pass

    def _beat(self) -> None:
        last = 0.0
        while not self._stop.wait(BEAT_S):
            now = lease_now()
            if not self.clock.renew_due(now, last):
                continue
            last = now
            try:
                sent = now
                try:
                    remaining = self.etcd.keepalive(self.clock.lease, clock=lease_now)
                    # the renewal runs from the answered ask's send time, a hedge's included
                    sent = max(now, self.etcd.renewal_sent or now)
                except LeaseExpired:
                    remaining = 0
                if not self.clock.renewed(remaining, sent):
                    self.leases_lost += 1
                    self.on_change()  # step down from every bucket now
                    self.register()
            except HogwildError:
                pass  # etcd unreachable: the lease lapses by the clock, the map decides
