"""When a bucket's primary may answer pulls: the wait for reads after a takeover.

A primary answers reads (pulls and reductions) only once no other server may still answer them
by its own clock: otherwise a client could read an update from the new primary, then miss it
at the old one (reads going back). Writes need no such wait: the copies fence a deposed
primary's prepares. A :class:`ReadsGate` is part of a
:class:`~hogwild_plugins.ps.replication.bucket_role.BucketRole` (no I/O, no clock of its own:
the role tells it the times, in the units of ``CampaignAnswered.at``: seconds of ``lease_now()``
on a real server, ticks in the simulator); the role's ``reads_open`` asks it, and a server
answers a pull inside the wait with ``READS_WAITING``.

How long (:func:`takeover_wait`, decided when the role campaigns, from the record it replaces
and the same read of the map):

* **another server's record, its lease gone**: none, unless the read holds ``revoked/<i>``
  markers (a lease ended early lately: the driver ended the lease of a server it lost, which
  may only be paused or cut off); then the longest TTL the markers name. A holder knows its
  lease only by its own clock, which gives up a margin (a quarter of its TTL) before etcd's TTL
  counted from its last renewal. A lease etcd let lapse was dropped a TTL after that renewal
  reached etcd, after the holder's clock gave up: no wait (the holder's clock against etcd's
  leader, ``0.75 / r_holder <= 1 / r_etcd``). A lease revoked was dropped after that renewal
  too, and before this campaign: waiting the holder's whole TTL (its ``lease_s``, which may
  differ from this server's), as Raft's and Spanner's leader leases wait out the old leader's,
  keeps reads from going back while the holder's clock runs no more than that margin slower
  than this side's (``0.75 / r_holder <= 1 / r_this``). Any marker counts, whichever server was
  revoked: a revoked holder may be the predecessor of the primary this side replaces.
* **a record handed here** by a primary whose own reads were open (``handed``): none; the one
  server that answered stopped before it wrote the record.
* **this side's own record, won here** (taken back in the epoch it won): no new wait; the wait
  it still owes is kept whole.
* **any other record naming this side** (handed while the hander still waited, or won by an
  earlier life of it): this server's own TTL, or the markers' if longer.

A wait still owed is never shortened: :meth:`ReadsGate.won` keeps the later of the two ends.

A marker that names no TTL (``revoked_ttl`` is ``math.inf``: an older driver's, or one written
by hand) makes the wait unbounded: the reads of a campaign won from that read stay closed
until a map read made after the win holds no such marker (:meth:`ReadsGate.seen`), and then
the longest TTL that read's markers name more. Its marker outlived the revoked holder's last
answer (``failover.revoked_ttl``), and a marker named in that later read still covers its own
holder from then on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hogwild_plugins.ps.failover import BucketRecord

__all__ = ["ReadsGate", "takeover_wait"]


def takeover_wait(
    record: BucketRecord, me: int, won_epoch: int, own_ttl: float, revoked_ttl: float
) -> float:
    """How long server ``me``'s reads wait once its campaign replacing ``record`` is won (see
    the module docstring): ``won_epoch``, the epoch of the last campaign ``me`` won;
    ``own_ttl``, ``me``'s lease TTL; ``revoked_ttl``, the longest TTL among the ``revoked/<i>``
    markers in the read that decided the campaign (0: none)."""
    if record.primary != me:
        return revoked_ttl
    if record.epoch == won_epoch or record.handed:
        return 0.0
    return max(own_ttl, revoked_ttl)


@dataclass
class ReadsGate:
    """One bucket role's wait for reads (see the module docstring)."""

    # from when (the clock of CampaignAnswered.at) a primary answers reads
    opens_at: float = float("-inf")
    # as candidate: how long its reads wait once its campaign is won (takeover_wait)
    wait_on_win: float = 0.0
    # won with an unbounded wait (a marker naming no TTL) at this time: closed until seen()
    held_since: float | None = None

    def campaigning(self, wait: float) -> None:
        """A campaign goes out; won, its reads wait ``wait``."""
        if wait < 0:
            raise ValueError(f"a wait for reads must be >= 0, got {wait!r}")
        self.wait_on_win = wait

    def won(self, at: float) -> None:
        """The campaign came back won at ``at``: reads open ``wait_on_win`` later, or when a
        wait still owed ends, whichever is later (an unbounded wait: once :meth:`seen` says)."""
        if math.isinf(self.wait_on_win):
            self.held_since = at
        else:
            self.opens_at = max(self.opens_at, at + self.wait_on_win)

    def seen(self, at: float | None, revoked_ttl: float) -> None:
        """A map read made at ``at`` (None: not told) held markers whose longest TTL is
        ``revoked_ttl`` (``math.inf``: one names none). An unbounded wait ends with the first
        read after the win that holds no marker naming none: reads open that read's
        ``revoked_ttl`` after it, or when a wait still owed ends. ``at`` is taken once the read
        came back (after etcd served it): a marker gone from it ended after the read that
        decided the campaign, so past its holder's last answer; one still in it was put before
        its revoke, so its holder stops answering within its TTL of ``at``."""
        if self.held_since is None or at is None or at < self.held_since:
            return
        if not math.isinf(revoked_ttl):
            self.opens_at = max(self.opens_at, at + revoked_ttl)
            self.held_since = None

    def open(self, now: float) -> bool:
        """Whether the wait is over at ``now``."""
        return self.held_since is None and now >= self.opens_at
