"""A server's reads of the job's map in etcd, and the :class:`MapRead` each bucket role is told.

The replication thread reads the job's whole prefix at once (one linearizable range: the
records, the members, the ``revoked/<i>`` markers and the nonce of one instant): a
:class:`MapView`. Every record of it that a role follows is marked in the server's store
(:mod:`~hogwild_plugins.ps.replication.marks`) before any role hears of it, and every record
write decided from it compares its nonce (:mod:`~hogwild_plugins.ps.job_nonce`). A record read
alone (read back after a write; read again by the copy side's refresher thread when a message
of a newer epoch arrives) is checked against that nonce and marked the same way.
:func:`map_read` makes of one view the stimulus a bucket's role takes; the simulator's servers
(:mod:`hogwild_plugins.ps.simulation.server`) make theirs with it too, from their etcd in
memory.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from hogwild_plugins.ps.etcd import Etcd
from hogwild_plugins.ps.failover import BucketRecord, replaced, revoked_ttl, unknown_markers
from hogwild_plugins.ps.job_nonce import NONCE_KEY, JobNonce, adopt
from hogwild_plugins.ps.replication.bucket_role_events import MapRead
from hogwild_plugins.ps.replication.marks import BucketMarks, followed
from hogwild_plugins.ps.routes import parse_map, read_record

from hogwild.config.checks import MAX_LEASE_S

__all__ = ["EtcdMap", "MapView", "map_read"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MapView:
    """One read of the job's map: ``records`` by bucket (None: absent), the ``live`` members
    and their leases, the buckets ``seen`` by some live member (``members/<i>``'s ``seen``),
    and ``revoked_ttl``, the longest TTL among the ``revoked/<i>`` markers (0: none; ``math.inf``:
    one names no TTL, and a takeover's reads stay closed while it lives)."""

    records: Mapping[int, BucketRecord | None]
    live: Mapping[int, int]
    seen: frozenset[int]
    revoked_ttl: float = 0.0
    replaced: int | None = None  # a lease of this process's that the driver ended (failover)


def map_read(
    view: MapView,
    bucket: int,
    lease: int,
    valid: bool,
    settled: bool,
    at: float,
    stimulus_id: str,
) -> MapRead:
    """What ``bucket``'s role is told of ``view``: this server's ``lease`` and whether it is
    ``valid`` by its own clock, whether the first primaries may be chosen (``settled``), and
    when the map was read (``at``, the lease clock's)."""
    return MapRead(
        view.records[bucket],
        view.live,
        lease,
        valid,
        settled,
        bucket not in view.seen,
        view.revoked_ttl,
        at,
        stimulus_id=stimulus_id,
    )


class EtcdMap:
    """A real server's reads of the map (see the module docstring).

    Args:
        n_servers: The job's servers.
        n_buckets: The job's buckets.
        roles: Every bucket's role (read under ``lock`` to tell what is marked).
        lock: The lock that guards the roles.
        marks: The server's marks.
    """

    def __init__(
        self, n_servers: int, n_buckets: int, roles: Mapping, lock: threading.Lock,
        marks: BucketMarks,
    ) -> None:  # fmt: skip
        self.n_servers, self.n_buckets = n_servers, n_buckets
        self.roles, self.lock, self.marks = roles, lock, marks
        # the job's history in etcd as the last read of the map found it (the replication
        # thread's; read by the network thread's record reads)
        self.nonce: JobNonce | None = None
        self.unknown_logged: set[str] = set()  # revoked markers naming no TTL, logged once

    def start(self, etcd: Etcd) -> None:
        """Adopt the job's nonce before any record is read (the copy side may read one before
        the first read of the map)."""
        self.nonce = adopt(etcd, *etcd.get(NONCE_KEY))

    def read(self, etcd: Etcd, me: int = -1, held=()) -> tuple[MapView, dict]:
        """The job's map now, its records marked; and its members (``MemberRecord`` s by index).
        ``me`` and ``held``: this server's index and the leases its process held, for the
        view's ``replaced`` (:func:`~hogwild_plugins.ps.failover.replaced`).

        Raises:
            HogwildError: A key that is not what it should be (naming it); EtcdUnavailable.
        """
        entries, _ = etcd.get_prefix("")
        # this read's history: every record write decided from it compares its nonce
        self.nonce = adopt(etcd, *entries.get(NONCE_KEY, (None, 0)), known=self.nonce)
        members, records = parse_map(entries, self.n_servers, self.n_buckets)
        # a lease ended early lately: takeovers wait for reads as long as its holder's TTL
        pairs = [(key, value) for key, (value, _) in entries.items()]
        revoked = revoked_ttl(pairs, self.n_servers)  # inf: a marker names no TTL
        for key in unknown_markers(pairs, self.n_servers):
            if key not in self.unknown_logged:  # once: it is read every 50 ms while it lives
                self.unknown_logged.add(key)
                log.warning(
                    "etcd key %s: a revoked marker without a 'lease_s' of whole seconds from 1 "
                    "to %d (got %r): the reads of a bucket taken over while it lives stay "
                    "closed until it is gone (delete it if no revoked server may still run)",
                    key,
                    MAX_LEASE_S,
                    entries[key][0],
                )
        records = dict(enumerate(records))
        # on disk before any role acts on them (a StoreError is handled as etcd's failure);
        # a record of another history than a role knows is never marked
        with self.lock:
            ours = followed(records, self.roles)
        self.marks.saw(ours)
        view = MapView(
            records,
            {i: m.lease for i, m in members.items()},
            frozenset().union(*(m.seen for m in members.values())),
            revoked,
            replaced(pairs, me, held),
        )
        return view, members

    def record(self, etcd: Etcd, bucket: int) -> BucketRecord | None:
        """``sync/<bucket>`` (None: absent, or etcd's keys are now another history than the
        last read of the map's), marked before any role hears of it.

        Raises:
            HogwildError: A value that is not a record (naming the key); EtcdUnavailable.
        """
        record = read_record(etcd, bucket, self.n_servers, self.nonce)
        if record is None:
            return None
        with self.lock:
            ours = followed({bucket: record}, self.roles)
        self.marks.saw(ours)
        return record
