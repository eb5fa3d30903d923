"""When the cluster driver asks its replicas again: a schedule without I/O.

The driver learns that a replica finished a portion of an epoch by asking it (``status``). Asked
at a fixed interval, a replica would wait up to that interval for its next portion, and an epoch
would end up to that interval after its last one, with every replica idle meanwhile. So the
driver asks at :data:`POLL_S` while no replica is about to finish, and each replica again when it
is due to (by its rate so far, :func:`training_rate`); then every
:data:`SOON_POLL_S` while it is overdue, backing off towards :data:`POLL_S` the longer it stays
overdue (a replica closing its last chunk, pulling the servers' model through a failover, or
stalled), so none is asked 200 times a second for long. :class:`PollSchedule` remembers since
when each replica is overdue; the clock is the caller's.
"""

from __future__ import annotations

POLL_S = 0.2  # between polls while no replica is about to finish
SOON_POLL_S = 0.005  # between polls once one is due to finish


def next_poll_s(due_in: float) -> float:
    """The sleep before asking a replica due in ``due_in`` seconds (negative: overdue by that
    long): until it is due, then every :data:`SOON_POLL_S`, backing off towards :data:`POLL_S`
    (a quarter of the time it has been overdue)."""
    if due_in > 0:
        return min(POLL_S, max(SOON_POLL_S, due_in))
    return min(POLL_S, max(SOON_POLL_S, -due_in / 4))


def training_rate(status: dict) -> float | None:
    """Examples per second of a replica, from its status: of the portion under way, or, before
    it trained any, of the epoch so far; None before any."""
    portion = status.get("portion")
    for source in (portion if isinstance(portion, dict) else {}, status):
        examples, seconds = source.get("examples"), source.get("seconds")
        if isinstance(examples, int) and isinstance(seconds, int | float) and examples > 0:
            if seconds > 0:
                return examples / seconds
    return None


class PollSchedule:
    """The sleep before the next poll, from when each replica training now is due."""

    def __init__(self) -> None:
        self.overdue_since: dict[int, tuple[object, float]] = {}  # replica -> (portion, since)

    def delay(self, now: float, due: dict[int, tuple[object, float]]) -> float:
        """``due``: replica -> (what it is due to finish: its epoch and portion, when it is due
        to, on the caller's clock); replicas with nothing to go by are left out."""
        for gone in self.overdue_since.keys() - due.keys():  # done, dead, or not started
            del self.overdue_since[gone]
        delay = POLL_S
        for replica, (portion, at) in due.items():
            if at > now:
                self.overdue_since.pop(replica, None)
                delay = min(delay, next_poll_s(at - now))
                continue
            since_portion, since = self.overdue_since.get(replica, (None, at))
            if since_portion != portion:
                since = at
                self.overdue_since[replica] = (portion, since)
            delay = min(delay, next_poll_s(since - now))
        return delay
