"""The figures of a fault run taken from its records (:mod:`bench.figures.partitions`): the
longest time without an acknowledgement around a fault, the client's first fresh acknowledgement
after it, and the stages of a cut primary's failover. Pure functions of the records: the ledger
client's acknowledgements, its history of the bucket map and the servers' takeovers, all stamped
by one machine's clock (the namespace hosts share it)."""

from __future__ import annotations


def longest_gap(
    acks: list[list[float]], start: float, end: float, next_fault: float | None = None
) -> float | None:
    """The longest time without an acknowledgement that overlaps ``[start, end]``: between two
    acknowledgements, or from the last one before ``start``; None if none came after. A gap
    that runs past ``next_fault`` (the next fault's start) counts only up to it: the rest is
    that fault's outage, not this one's."""
    times = sorted(acked for _, acked in acks)
    later = [t for t in times if t > start]
    if not later:
        return None
    before = [t for t in times if t <= start]
    times = ([before[-1]] if before else [start]) + later
    cap = float("inf") if next_fault is None else next_fault
    gaps = [min(b, cap) - a for a, b in zip(times, times[1:], strict=False) if a <= end and a < cap]
    return round(max(gaps), 3) if gaps else None


def first_fresh_ack(acks: list[list[float]], at: float) -> float | None:
    """Seconds from ``at`` to the first acknowledgement of a push sent after ``at``."""
    fresh = [acked for sent, acked in acks if sent >= at]
    return round(min(fresh) - at, 3) if fresh else None


def breakdown(event: dict, end: float, history: list[list], takeovers: list[dict] | None) -> dict:
    """The stages of one ``cut_primary``'s failover, in seconds from the cut (None: not seen):

    - ``lease_gone_by_s``: by when the cut server's lease was gone from etcd, an upper bound,
      not etcd's expiry itself: the earlier of the first map read (a poll every ``MAP_EVERY_S``
      of the ledger client, stamped once the read returned) before ``end`` in which etcd no
      longer names the cut server among the members, and the first takeover of its buckets won
      (a successor campaigns only once the member is gone);
    - ``lease_read_late``: that read came after a takeover was already won (it waited, on the
      cut host's etcd member or on a loaded machine): the bound is then the takeover's; None
      when either is missing;
    - ``recorded_s``: the last of the cut primary's buckets whose takeover (a later epoch) was
      won, by the winner's clock (``won_at``, written right after its campaign's transaction);
    - ``serving_s``: the last of them served (its copies caught up: ``serving_at``);
    - ``first_ack_s``: the last of those buckets' first update acknowledged by a server that
      took it over (``first_ack_at``, its clock; a takeover whose winner stepped down before it
      served has none; a re-send answered as a duplicate does not count);
    - ``takeovers``: how many takeovers of those buckets were won from the cut to ``end`` (the
      cut's end plus ``SETTLE_S``, or the next fault): more than one a bucket is a winner that
      stepped down, or the hand-back to the cut server once it is back;
    - ``etcd_leader_cut``: whether the cut host's etcd member led etcd just before the cut;
      None when no leader was known then (an election, every status call timed out, or a
      record from before the leader was followed);
    - ``back_before_takeover``: a bucket served again by the cut server itself (the cut ended
      first), which no takeover ends.

    The client's own end of it is the event's ``failover_s``: its first push sent after the cut
    and acknowledged (every push touches every bucket). One machine's clock throughout.
    ``takeovers`` None (not read: a ledger client's partial result): every stage that needs
    them is None, and the lease's bound is the map read's alone.
    """
    known = takeovers is not None
    takeovers = takeovers or []
    at, server = event["at"], event["host"] - 1
    gone = next((t for t, members, *_ in history if at < t < end and server not in members), None)
    won, served, acked, missing, takeovers_seen = [], [], [], [], 0
    for bucket, epoch in event.get("epochs", {}).items():
        later = [t for t in takeovers if t["bucket"] == int(bucket) and t["epoch"] > epoch
                 and at < t["won_at"] < end]  # fmt: skip
        if not later:
            missing.append(int(bucket))
            continue
        won.append(min(t["won_at"] for t in later))
        for moments, key in ((served, "serving_at"), (acked, "first_ack_at")):
            firsts = [t[key] for t in later if t.get(key) is not None]
            moments.append(min(firsts) if firsts else None)
        takeovers_seen += len(later)

    def since(t: float | None) -> float | None:
        return None if t is None else round(t - at, 3)

    def last(moments: list, missing: list) -> float | None:  # the last bucket's, if all had one
        return since(max(moments)) if moments and None not in moments and not missing else None

    first_won = min(won) if won else None
    bounds = [t for t in (gone, first_won) if t is not None]
    leader = event.get("etcd_leader_host")
    stages = {
        "lease_gone_by_s": since(min(bounds)) if bounds else None,
        "lease_read_late": None if gone is None or first_won is None else gone > first_won,
        "recorded_s": last(won, missing),
        "serving_s": last(served, missing),
        "first_ack_s": last(acked, missing),
        "etcd_leader_cut": None if leader is None else leader == event["host"],
        "back_before_takeover": missing,
        "takeovers": takeovers_seen,
    }
    if not known:
        unknown = ("lease_read_late", "recorded_s", "serving_s", "first_ack_s")
        stages |= dict.fromkeys((*unknown, "back_before_takeover", "takeovers"))
    return stages
