"""etcd as the replication sees it, in memory and on a logical clock: for the simulator.

Only what the servers use: one revision counter that every write advances, keys with their mod
revision, leases (granted for a TTL of clock ticks, kept alive, expiring with their keys), the
compare-and-swap on a key's mod revision that campaigns, in-sync writes and hand-overs are, and
what a fault does to it (a lease ended early: marked, then revoked later; everything wiped: an
external etcd that comes back empty, or another driver with the job's name clearing the map).
"""

from __future__ import annotations

from hogwild_plugins.ps.failover import (
    REVOKED_PREFIX,
    BucketRecord,
    MemberRecord,
    marker_life,
    merged_leases,
    revoked_ttl,
)

__all__ = ["SimEtcd"]


NONCE_KEY = "nonce"  # as the real job's
MARKER_REQUEST_TICKS = 1  # the revoke and the marker's renewal: a request timeout each, in all


class SimEtcd:
    """One job's keys (``members/<i>``, ``sync/<b>``), its leases and its revision."""

    def __init__(self, n_servers: int, n_buckets: int) -> None:
        self.n_servers, self.n_buckets = n_servers, n_buckets
        self.revision = 0
        self.keys: dict[str, tuple[object, int, int]] = {}  # key -> (value, mod revision, lease)
        self.leases: dict[int, int] = {}  # lease -> the tick it expires at
        self.granted: dict[int, int] = {}  # lease -> the TTL it was granted (a keepalive's)
        self.next_lease = 0x100
        self.wipes = 0
        self.leases_before_wipe = 0  # the leases granted up to the last wipe are at most this
        self._parsed: dict[tuple[str, int], BucketRecord] = {}  # (key, revision) -> record
        self._members: dict[str, tuple[object, MemberRecord]] = {}  # key -> (value, member)
        self._map: tuple = ()  # (revision, wipes, members, seen): the last members read

    # ------------------------------------------------------------------ leases

    def grant(self, ttl: int, now: int) -> int:
        self.next_lease += 1
        self.leases[self.next_lease] = now + ttl
        self.granted[self.next_lease] = ttl
        return self.next_lease

    def keepalive(self, lease: int, ttl: int, now: int) -> int:
        """The lease's remaining ticks after a renewal (0: it expired, renew nothing)."""
        if lease not in self.leases:
            return 0
        self.leases[lease] = now + ttl
        return ttl

    def expire(self, now: int) -> list[int]:
        """Leases past their time go, with their keys; the leases gone."""
        gone = [lease for lease, until in self.leases.items() if until <= now]
        for lease in gone:
            self.revoke(lease)
        return gone

    def revoke(self, lease: int) -> None:
        self.granted.pop(lease, None)
        if self.leases.pop(lease, None) is None:
            return
        doomed = [k for k, (_, _, owner) in self.keys.items() if owner == lease]
        if doomed:
            self.revision += 1
            for key in doomed:
                del self.keys[key]

    def mark(self, server: int, lease: int, ttl: int, now: int) -> int | None:
        """The first half of the driver's early end of ``server``'s ``lease``
        (``controller.revoke_marked``): its ``revoked/<server>`` marker, under a lease of its
        own of :func:`~hogwild_plugins.ps.failover.marker_life` (one tick for the requests);
        the marker's lease, or None when ``lease`` is gone already (nothing to revoke).

        As the driver's transaction: a live marker of an earlier revoke of ``server`` (an
        earlier incarnation, which may still answer reads on its own TTL) is replaced by one
        naming the longer of the two TTLs, under a lease granted now for that TTL: never a
        shorter TTL, never an earlier end; and naming the earlier marker's leases too."""
        if lease not in self.leases:
            return None
        key = f"{REVOKED_PREFIX}{server}"
        earlier = self.get(key)[0]
        # (the simulated servers' markers always name a TTL: the driver's refusal of one that
        # names none is the controller's unit tests')
        cover = max(ttl, earlier["lease_s"]) if earlier is not None else ttl
        marker = self.grant(marker_life(cover, MARKER_REQUEST_TICKS / 2), now)
        leases = merged_leases(earlier, lease)
        self.put(key, {"lease": lease, "leases": leases, "lease_s": cover}, lease=marker)
        return marker

    def revoke_marked(self, lease: int, marker: int, now: int) -> None:
        """The second half, sent in time (the driver checks): ``lease`` revoked, then the
        marker's lease renewed for the TTL it was granted (etcd's keepalive), so that it lives
        ``REVOKED_TTLS`` of the TTLs it covers past the revoke."""
        self.revoke(lease)
        renewed = self.keepalive(marker, self.granted.get(marker, 0), now)
        assert renewed, "a revoke sent in time outlived its marker"

    def revoked(self) -> float:
        """The longest TTL the ``revoked/<i>`` markers among the keys name (a lease ended early
        lately), 0 for none."""
        return revoked_ttl(
            ((key, value) for key, (value, _, _) in self.keys.items()), self.n_servers
        )

    def wipe(self) -> None:
        """Everything gone, the revision counter too (a new etcd starts again at 1)."""
        self.keys.clear()
        self.leases.clear()
        self.granted.clear()
        self.revision = 0
        self.wipes += 1
        self.leases_before_wipe = self.next_lease

    # ------------------------------------------------------------------ keys

    def put(self, key: str, value: object, lease: int = 0) -> None:
        self.revision += 1
        self.keys[key] = (value, self.revision, lease)

    def get(self, key: str) -> tuple[object, int]:
        value, revision, _ = self.keys.get(key, (None, 0, 0))
        return value, revision

    def replace(self, key: str, value: object, expected: int, nonce: object = None) -> bool:
        """Write ``value`` only if ``key``'s mod revision is still ``expected`` (0: absent) and,
        with ``nonce``, the job's nonce is still that one (as the real servers' transactions)."""
        if not self.ours(nonce) or self.get(key)[1] != expected:
            return False
        self.put(key, value)
        return True

    def adopt(self, fresh: object) -> object:
        """The job's nonce (:mod:`~hogwild_plugins.ps.job_nonce`): ``fresh`` written if there is
        none (gone with a wipe), else the one there."""
        if NONCE_KEY not in self.keys:
            self.put(NONCE_KEY, fresh)
        return self.keys[NONCE_KEY][0]

    def ours(self, nonce: object) -> bool:
        """Whether the keys are the history of ``nonce`` (None: not asked)."""
        return nonce is None or self.keys.get(NONCE_KEY, (None,))[0] == nonce

    # ------------------------------------------------------------------ the map

    def member(self, server: int) -> MemberRecord | None:
        """``members/<server>`` read back as the servers do (checked; None: absent)."""
        key = f"members/{server}"
        value = self.keys.get(key, (None,))[0]
        if value is None:
            return None
        parsed = self._members.get(key)
        if parsed is None or parsed[0] is not value:  # each put is a value of its own
            parsed = (value, MemberRecord.parse(value, self.n_buckets, key))
            self._members[key] = parsed
        return parsed[1]

    def members(self) -> dict[int, int]:
        """``{server: its lease}`` of every registered server (not to be changed: it is shared
        until a write changes the keys)."""
        return self._read_members()[2]

    def seen(self) -> frozenset[int]:
        """The buckets a registered server has seen a record of (as ``members/<i>`` say)."""
        return self._read_members()[3]

    def _read_members(self) -> tuple:
        if self._map[:2] != (self.revision, self.wipes):  # every write advances the revision
            members, seen = {}, frozenset()
            for i in range(self.n_servers):
                member = self.member(i)
                if member is not None:
                    members[i] = member.lease
                    seen |= member.seen
            self._map = (self.revision, self.wipes, members, seen)
        return self._map

    def record(self, bucket: int, nonce: object = None) -> BucketRecord | None:
        """``sync/<bucket>`` read back as the servers do (checked; None: absent, or, with
        ``nonce``, the keys are another history's)."""
        key = f"sync/{bucket}"
        value, revision = self.get(key)
        if value is None or not self.ours(nonce):
            return None
        record = self._parsed.get((key, revision))
        if record is None or record.value() != value:  # (a wipe starts the revisions again)
            record = BucketRecord.parse(value, revision, self.n_servers, key)
            self._parsed[(key, revision)] = record
        return record
