"""The replicated parameter server's failover protocol (Adam 3.3.3): the records, the placement,
the lease clock.

This module holds what every server reads the same way: a bucket's record in etcd
(:class:`BucketRecord`), a server's membership key (:class:`MemberRecord`), which servers
should hold a bucket (:func:`desired_copies`) and a server's lease by its own clock
(:class:`LeaseClock`). The protocol below is decided by I/O-free state machines: one server's
part in one bucket (:class:`~hogwild_plugins.ps.replication.bucket_role.BucketRole`), a
primary's commit round
(:mod:`~hogwild_plugins.ps.replication.commit_round`) and a copy's acceptance of its primary's
messages (:mod:`~hogwild_plugins.ps.replication.copy_side`); the threads of
:mod:`~hogwild_plugins.ps.replication` carry out what they decide.

The protocol, for one bucket ``b`` with ``copies`` copies:

* Every server holds a session lease in etcd and registers ``members/<i>`` under it; its
  heartbeat renews the lease. A server whose heartbeat stops (killed, paused, cut off) drops out
  of the members when the lease lapses. The key lists (``seen``) the buckets the server has seen
  a record of (or met a member that had, or its store remembers): a bucket whose record is
  missing is started afresh only when no registered member lists it.
* ``sync/<b>`` (no lease: it outlives every server) is the bucket's record: ``epoch``, the
  ``primary`` and its ``lease``, and ``in_sync``, the copies holding every acknowledged update.
  Only the primary changes it (to add a copy that caught up, or drop one that stopped answering),
  by a transaction that compares the revision it last wrote: a primary that was replaced cannot.
* A primary applies an update, sends it to every other in-sync copy (``PREPARE``: each checks that
  the message carries the current epoch and lease, and that its version is the next one), then
  commits it on each (``COMMIT``), and only then acknowledges the client. A copy that does not
  answer, or reports a gap, is dropped from ``in_sync`` (the primary waits for that write to
  etcd before it acknowledges) and caught up later from a snapshot.
* When the primary is no longer a member, each live in-sync copy campaigns: a transaction that
  replaces ``sync/<b>`` only if it is still the revision the candidate read (the previous primary's
  lease is in it), with ``epoch + 1``, itself as primary and the other live in-sync copies kept in
  ``in_sync`` (each holds every acknowledged update, so one of them can still succeed the winner
  if it dies before it serves). One candidate wins; the others see the new record and follow. The
  winner commits what it had prepared (it may be committed elsewhere; the client's re-send is then
  answered as a duplicate), sends every in-sync and every other desired live copy a snapshot,
  adds the new ones to ``in_sync`` and only then serves: every acknowledged update lives on
  every live in-sync copy. It answers reads at once, unless a server's lease was ended early
  (revoked) within the last two TTLs: then only the longest TTL the markers name (the
  revoked holders', :func:`revoked_ttl`) after its campaign came back
  (``BucketRole.reads_open``), since a revoked server answers reads until its own clock, which
  runs on its own TTL, says its lease ran out. Whoever revokes a lease of a server that may
  still run (the driver, for a server it lost) first writes ``revoked/<i>``
  (:data:`REVOKED_PREFIX`, naming the holder's TTL), so that a successor reads it in the same
  read that shows the member gone, and keeps it :data:`REVOKED_TTLS` TTLs past the revoke,
  however late etcd applies it (``controller.revoke_marked`` says how; a second revoke of the
  same index never puts a shorter TTL or an earlier end over a live marker). A marker that
  names no TTL (no whole ``lease_s`` of 1 to ``MAX_LEASE_S`` seconds: an older driver's, or one
  written by hand) keeps a takeover's reads closed
  while it lives rather than failing the read of the map (which would stop every takeover of
  the job): it lives past its holder's last answer like any marker, and a guessed TTL would
  be no bound (:func:`revoked_ttl`). A
  lease etcd let lapse needs no wait: its holder's clock gave up a margin before etcd's TTL,
  both counted from (around) its last renewal.
* A server the record names as primary that is not serving it (a heartbeat late past its own
  clock's margin, a lease lost and taken anew, a campaign whose answer was lost) campaigns for
  the next epoch itself, if it still holds the bucket's state; a new process in its place does
  not, and the bucket waits for a copy that holds its acknowledged updates.
* A primary that loses its lease (its own clock says so: a SIGSTOP-ed process wakes up past it),
  sees a newer epoch, or gets ``FENCED`` from a copy, steps down at once and serves nothing of
  that bucket. Its late ``PREPARE`` s carry an old epoch and are refused: no split brain. Once
  a newer primary's record leaves it out of ``in_sync``, its memory counts as diverged (it may
  hold updates it applied and nobody acknowledged), unless that primary's snapshot replaced it
  already: the snapshot can arrive before the write that adds the copy to ``in_sync``.
* Hand-back: a serving primary that is not the bucket's preferred primary (the first of
  :func:`desired_copies` over the live members), while the preferred one is live, in ``in_sync``
  and caught up this epoch under its present lease, hands the bucket over (:class:`HandOver`). It
  stops serving first (clients get ``NOT_PRIMARY`` and re-send, with their numbers, to the map's
  primary); everything it acknowledged is already committed on every in-sync copy, the successor
  among them. It then replaces ``sync/<b>`` by the same compare-and-swap with ``epoch + 1``, the
  successor as primary under the successor's lease and ``in_sync`` kept, and follows. The
  successor, named primary and not serving, takes the bucket by the rule above (the next epoch
  again; it holds the bucket's state) and serves once its copies have their snapshots. The
  handed record is marked ``handed`` when the old primary's own reads were open (the one server
  that answered reads stopped before it wrote the record): the successor then answers reads at
  once; a primary hands back only once its reads are open. A
  hand-over that loses its transaction deposes the old primary (the next read decides); a
  successor that dies before it serves is replaced like any dead primary. For a fixed membership
  the preferred primary is fixed and never hands over: no ping-pong.

Which servers should hold a bucket (:func:`desired_copies`) is rendezvous hashing over the live
members, so a server's death or return moves only the buckets it holds or should hold, and the
hand-back brings a returning server's primaries back to it: every server is the preferred
primary of about ``1 / n`` of the buckets.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

from hogwild.config.checks import MAX_LEASE_S

__all__ = [
    "REVOKED_PREFIX",
    "REVOKED_TTLS",
    "BucketRecord",
    "LeaseClock",
    "MemberRecord",
    "desired_copies",
    "lease_now",
    "marker_lease_s",
    "marker_leases",
    "marker_life",
    "merged_leases",
    "replaced",
    "revoked_ttl",
    "unknown_markers",
]

REVOKED_PREFIX = "revoked/"
"""``revoked/<i>``: server ``i``'s lease was ended early (revoked while its process may still run
and answer reads by its own clock), written just before the revoke under a lease of its own."""
REVOKED_TTLS = 2
"""How many of the revoked server's lease TTLs its ``revoked/<i>`` marker lives past the revoke
(at least): the revoked holder answers reads at most a TTL after its last renewal, which came
before etcd applied the revoke (``controller.revoke_marked`` says why the marker outlives that
whatever the revoke's latency)."""


MARKER_LEASES = 8
"""The most leases one ``revoked/<i>`` marker names (``leases``, oldest first). A revoke of
``i`` while an earlier marker of ``i`` lives adds its lease to that marker's (each process that
held one must stop when it reads the marker, :func:`replaced`); the oldest beyond this many is
dropped. Every revoke of ``i`` is of a new incarnation, which the driver starts only within its
``cluster.restarts`` (3 by default: 4 incarnations, all named); eight revokes of one index
within one marker's chain of lives (each 2 TTLs long) is a job failing far faster than it can
train, and the dropped holder then goes on as one cut off past its marker's life would."""


def marker_leases(value: object) -> list[int]:
    """The leases a ``revoked/<i>`` marker's ``value`` names, oldest first: its ``leases`` and
    its ``lease`` (the newest; a marker written before ``leases`` names that one alone), at
    most the last :data:`MARKER_LEASES` of a longer ``leases`` list. Anything that is not a
    lease (not an int, a bool) is left out: such a marker names none."""
    if not isinstance(value, dict):
        return []
    named = value.get("leases")
    # only the newest MARKER_LEASES count, however long a list etcd holds (one written by hand
    # could be megabytes: every server reads it on its replication thread at each map read)
    found = list(named[-MARKER_LEASES:]) if isinstance(named, list) else []
    found.append(value.get("lease"))
    leases: list[int] = []
    for lease in found:
        if isinstance(lease, int) and not isinstance(lease, bool) and lease not in leases:
            leases.append(lease)
    return leases


def merged_leases(earlier: object, lease: int) -> list[int]:
    """The ``leases`` of a marker of ``lease`` put over ``earlier`` (the live marker of an
    earlier revoke of the same index, None for none): every lease it named, then ``lease``,
    the oldest dropped beyond :data:`MARKER_LEASES`."""
    leases = [held for held in marker_leases(earlier) if held != lease] + [lease]
    return leases[-MARKER_LEASES:]


def marker_life(lease_s: int, timeout_s: float) -> int:
    """The TTL of a ``revoked/<i>`` marker's lease, in whole seconds, for a holder of
    ``lease_s`` and a driver whose etcd requests each give up after ``timeout_s``:
    ``REVOKED_TTLS`` TTLs after the revoke, and the revoke's and the marker's renewal's time."""
    return REVOKED_TTLS * lease_s + math.ceil(2 * timeout_s)


def revoked_ttl(entries: Iterable[tuple[str, object]], n_servers: int) -> float:
    """The longest lease TTL among the ``revoked/<i>`` markers in the job's ``entries`` (one
    read of its prefix, as ``(key, value)`` pairs), 0 for none: how long after a takeover its
    reads wait. Each marker names its holder's ``lease_s`` (``controller.revoke_marked``): the
    holder's clock, which runs on its own TTL (servers may be given different ``--lease-s``),
    not the successor's, says how long it may still answer reads after its last renewal. Only
    ``revoked/<i>`` with ``i`` one of the job's ``n_servers`` counts (as ``parse_map`` reads the
    records and members); other keys under ``revoked/`` name no server of the job.

    A marker whose ``lease_s`` is not whole seconds from 1 to ``MAX_LEASE_S`` (one an older
    driver wrote, or one written by hand: :func:`unknown_markers` names them) gives
    ``math.inf``: how long its holder may answer is not known, so a takeover's reads stay closed
    while such a marker lives (``ReadsGate``), and takeovers themselves go on. That is safe:
    whoever revokes a lease puts its marker before the revoke and keeps it at least
    :data:`REVOKED_TTLS` of the holder's TTLs past it, past the holder's last answer (at most
    3/4 of its TTL after its last renewal, which came before the revoke); a marker written by
    hand that never expires keeps those reads closed until it is deleted. Waiting a guessed TTL
    instead (this server's, or the members') would be no guarantee: the revoked holder is no
    member any more, and its TTL may be longer than every live one's.
    """
    longest, unknown = 0, False
    for _key, value in _markers(entries, n_servers):
        lease_s = marker_lease_s(value)
        if lease_s is None:
            unknown = True
        else:
            longest = max(longest, lease_s)
    return math.inf if unknown else float(longest)


def replaced(entries: Iterable[tuple[str, object]], index: int, held: Iterable[int]) -> int | None:
    """The lease of ``held`` (the leases this process of server ``index`` was granted) that
    ``revoked/<index>`` names, None if none: the job's driver counted this process lost and
    ended that lease early, to start another process as server ``index`` in its place
    (``controller.revoke_marked``). The process must then stop rather than register again:
    the replacement binds the same address, which this one holds while it lives, and the
    driver's restarts of it would fail until the job stops (docs/guarantees.md, "a server
    the driver lost"). A lease this process never held (an earlier incarnation's, revoked
    before it started) is not its own: it goes on. The marker names every lease of ``index``
    the driver ended while a marker of it lived (:func:`marker_leases`): an earlier process,
    replaced and then its replacement too, still finds its own lease when it reads it."""
    key = f"{REVOKED_PREFIX}{index}"
    held = set(held)
    for name, value in entries:
        if name == key:
            for lease in reversed(marker_leases(value)):
                if lease in held:
                    return lease
    return None


def unknown_markers(entries: Iterable[tuple[str, object]], n_servers: int) -> list[str]:
    """The keys of the ``revoked/<i>`` markers in ``entries`` whose TTL is not known (no
    ``lease_s`` of whole seconds from 1 to ``MAX_LEASE_S``): those :func:`revoked_ttl` counts as
    ``math.inf``."""
    return [key for key, value in _markers(entries, n_servers) if marker_lease_s(value) is None]


def _markers(entries: Iterable[tuple[str, object]], n_servers: int):
    for key, value in entries:
        kind, _, index = key.partition("/")
        # ASCII digits only: str.isdigit() also passes "²", which int() refuses
        if kind + "/" == REVOKED_PREFIX and index.isascii() and index.isdigit():
            if int(index) < n_servers:
                yield key, value


def marker_lease_s(value: object) -> int | None:
    """A ``revoked/<i>`` marker's holder's TTL, None where it names none: not whole seconds
    from 1 to ``MAX_LEASE_S``, the bound of every lease a server may hold (``ps.lease_s``,
    ``--lease-s``, a member record). A longer one no driver of this job wrote: taken as it
    stood, it would close a takeover's reads for up to that long even after the marker is gone
    (a wait once owed is never shortened), where one naming none closes them only while it
    lives; the driver's revoke over it refuses, naming its key (``controller.revoke_marked``)."""
    lease_s = value.get("lease_s") if isinstance(value, dict) else None
    if isinstance(lease_s, bool) or not isinstance(lease_s, int):
        return None
    return lease_s if 1 <= lease_s <= MAX_LEASE_S else None


def desired_copies(bucket: int, members: Iterable[int], copies: int) -> list[int]:
    """The ``copies`` live servers that should hold ``bucket``, best first (rendezvous hashing)."""

    def weight(server: int) -> bytes:
        return hashlib.blake2b(f"{bucket}/{server}".encode(), digest_size=8).digest()

    return sorted(members, key=weight, reverse=True)[:copies]


@dataclass(frozen=True)
class BucketRecord:
    """``sync/<b>`` in etcd, read back: who is primary, under which lease and epoch, and which
    copies hold every acknowledged update. ``revision`` is the key's mod revision (0: absent)."""

    epoch: int
    primary: int
    lease: int
    in_sync: tuple[int, ...]
    revision: int = 0
    # written by a hand-over whose primary's reads were open: the successor's reads need no wait
    handed: bool = False

    def value(self) -> dict:
        value = {
            "epoch": self.epoch,
            "primary": self.primary,
            "lease": self.lease,
            "in_sync": list(self.in_sync),
        }
        if self.handed:
            value["handed"] = True
        return value

    @classmethod
    def parse(cls, value: object, revision: int, n_servers: int, where: str) -> BucketRecord:
        """Check every field of a value read from etcd.

        Raises:
            ValueError: A missing field, or one of the wrong type or range (naming ``where``).
        """

        def integer(key: str, lo: int, hi: int) -> int:
            v = value.get(key) if isinstance(value, dict) else None
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v < hi:
                raise ValueError(f"{where}: {key!r} must be an integer in [{lo}, {hi})")
            return v

        epoch = integer("epoch", 1, 2**32)  # it travels in a 32-bit header field
        primary = integer("primary", 0, n_servers)
        lease = integer("lease", 0, 2**63)
        in_sync = value.get("in_sync")
        if (
            not isinstance(in_sync, list)
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in in_sync)
            or not all(0 <= s < n_servers for s in in_sync)
            or len(set(in_sync)) != len(in_sync)
            or primary not in in_sync
        ):
            raise ValueError(
                f"{where}: 'in_sync' must list distinct servers, the primary among them"
            )
        handed = value.get("handed", False)
        if not isinstance(handed, bool):
            raise ValueError(f"{where}: 'handed' must be true or false")
        return cls(epoch, primary, lease, tuple(in_sync), revision, handed)


@dataclass(frozen=True)
class MemberRecord:
    """``members/<i>`` in etcd, read back: the server's ``address`` (``HOST:PORT``), its
    ``lease`` and that lease's TTL ``lease_s``, and ``seen``: the buckets it has seen a record
    of, met a member that had, or whose record its store remembers."""

    address: str
    lease: int
    lease_s: int
    seen: frozenset[int]

    def value(self) -> dict:
        return {
            "address": self.address,
            "lease": self.lease,
            "lease_s": self.lease_s,
            "seen": sorted(self.seen),
        }

    @classmethod
    def parse(cls, value: object, n_buckets: int, where: str) -> MemberRecord:
        """Check every field of a value read from etcd. ``seen`` is a list of buckets; the
        boolean an earlier hogwild wrote there (for the whole job) is refused: the servers of
        one job run one hogwild (their messages to each other are not versioned either).

        Raises:
            ValueError: A missing field, or one of the wrong type or range (naming ``where``).
        """
        if not isinstance(value, dict):
            raise ValueError(f"{where}: a member must be an object, not {type(value).__name__}")
        address = value.get("address")
        if not isinstance(address, str) or not 0 < len(address) <= 300:
            raise ValueError(f"{where}: 'address' must be HOST:PORT (a string of 1 to 300)")

        def integer(key: str, lo: int, hi: int) -> int:
            v = value.get(key)
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v < hi:
                raise ValueError(f"{where}: {key!r} must be an integer in [{lo}, {hi})")
            return v

        lease = integer("lease", 0, 2**63)
        lease_s = integer("lease_s", 1, MAX_LEASE_S + 1)
        seen = value.get("seen")
        if isinstance(seen, bool):
            raise ValueError(
                f"{where}: 'seen' is {seen} (a server of an earlier hogwild, which said it for "
                "the whole job): it must list bucket indices; run one hogwild on every server"
            )
        if (
            not isinstance(seen, list)
            or not all(isinstance(b, int) and not isinstance(b, bool) for b in seen)
            or not all(0 <= b < n_buckets for b in seen)
            or len(set(seen)) != len(seen)
        ):
            raise ValueError(
                f"{where}: 'seen' must list distinct bucket indices in [0, {n_buckets})"
            )
        return cls(address, lease, lease_s, frozenset(seen))


# --------------------------------------------------------------------------- lease


_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)  # Linux only


def lease_now() -> float:
    """Now, in seconds, by the one clock every lease decision of a server reads: its
    :class:`LeaseClock`, its heartbeat, and the wait for reads after a takeover
    (``BucketRole.reads_open``). Linux's ``CLOCK_BOOTTIME``, which counts a system suspend:
    ``CLOCK_MONOTONIC`` (``time.monotonic()``) does not, so a holder suspended past its lease
    would wake believing it valid; ``time.monotonic()`` where there is no ``CLOCK_BOOTTIME``. A
    guest frozen by its hypervisor may still not see the frozen time (docs/guarantees.md)."""
    return time.monotonic() if _BOOTTIME is None else time.clock_gettime(_BOOTTIME)


class LeaseClock:
    """A server's session lease, by its own clock (read with :func:`lease_now`).

    The lease is taken as valid for ``ttl * (1 - margin)`` after the heartbeat that renewed it was
    *sent*: etcd counts from when it received it, later, so this side always gives up first. A
    process paused past that (SIGSTOP) finds, on waking, that its lease is no longer valid before
    it writes anything, whatever etcd did meanwhile.
    """

    def __init__(self, margin: float = 0.25) -> None:
        self.margin = margin
        self.lease = 0
        self.ttl_s = 0.0
        self.valid_until = float("-inf")
        self.lost = False

    def granted(self, lease: int, ttl_s: float, sent_at: float) -> None:
        self.lease, self.ttl_s, self.lost = lease, float(ttl_s), False
        self.valid_until = sent_at + self.ttl_s * (1 - self.margin)

    def renewed(self, remaining_s: float, sent_at: float) -> bool:
        """A heartbeat sent at ``sent_at`` came back with ``remaining_s`` (<= 0: expired).
        False once the lease is lost (it stays lost: a new one must be granted)."""
        if self.lost:
            return False
        if remaining_s <= 0:
            self.lost = True
            self.valid_until = float("-inf")
            return False
        self.valid_until = max(self.valid_until, sent_at + remaining_s * (1 - self.margin))
        return True

    def valid(self, now: float) -> bool:
        return not self.lost and now < self.valid_until

    def renew_due(self, now: float, last_sent: float) -> bool:
        return now - last_sent >= self.ttl_s / 5
