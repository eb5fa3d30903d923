"""A replicated server's first asks of etcd, asked again while etcd does not answer.

A server starting reads the job's nonce (:meth:`~hogwild_plugins.ps.replication.map_reads.EtcdMap.
start`) and registers (:meth:`~hogwild_plugins.ps.replication.membership.Membership.register`)
before it serves. A member just restarted takes connections before it answers, and a server
started beside it (a lost host back: its etcd member and its server start together, and the
server asks its own host's member first) must not die of that. :func:`ask_at_start` asks again,
each unanswered try logged, for up to :data:`START_WITHIN_S`, and ends early when a stop is asked
for (a SIGTERM while etcd is silent must not wait out the whole bound: the driver SIGKILLs a role
20 s after its SIGTERM, and a server SIGKILLed never gives its lease back). Both asks are safe to
repeat: the nonce is adopted by compare-and-swap, and a lease granted, or a key written under it,
by an ask that timed out lapses unrenewed (the replication thread's next read of the map, finding
its key gone under a live lease, writes it again: ``Membership.refresh``). A registration whose
lease lapsed between its grant and its key's write (a start starved of CPU for longer than the
TTL: three servers and their tests on two cores, a 2 s lease) is asked again too, under a new
lease: the lapsed one holds nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from hogwild_plugins.ps.etcd import EtcdUnavailable, LeaseExpired

from hogwild.errors import HogwildError
from hogwild.logs import role_logger

__all__ = ["START_RETRY_S", "START_WITHIN_S", "StartStopped", "ask_at_start"]

START_WITHIN_S = 30.0  # etcd silent this long at a server's start: an error
START_RETRY_S = 0.5  # between two tries (an unanswered ask itself costs the client's 2 s timeout)

T = TypeVar("T")


class StartStopped(HogwildError):
    """A stop (SIGTERM, SIGINT) came while etcd was being asked again at the start."""


def ask_at_start(
    ask: Callable[[], T],
    what: str,
    me: int,
    within_s: float = START_WITHIN_S,
    stopping: Callable[[], bool] = lambda: False,
) -> T:
    """``ask()``'s answer, asked again while it raises :class:`EtcdUnavailable` or
    :class:`LeaseExpired` (every other error is raised at once; a wrong port or a TLS failure is
    ``EtcdUnavailable`` too, so it is asked again, each try logged, until the bound).

    Args:
        ask: The request (or requests) to etcd.
        what: What it asks, for the log and the errors (``"registration"``).
        me: The server's index (the log's role, ``ps <me>``).
        within_s: How long to go on asking.
        stopping: Whether a stop was asked for (looked at between two tries).

    Raises:
        EtcdUnavailable: etcd did not answer within ``within_s`` (the last try may end up to a
            request timeout per member later).
        LeaseExpired: every lease granted within ``within_s`` lapsed before its key was written.
        StartStopped: ``stopping()`` was true after a failed try.
    """
    deadline = time.monotonic() + within_s
    stopped = f"server {me}: stopped while asking etcd for its {what}"
    tries = 0
    while True:
        tries += 1
        try:
            return ask()
        except (EtcdUnavailable, LeaseExpired) as err:
            if stopping():  # asked for during this try: no more tries, no traceback
                raise StartStopped(stopped) from err
            if time.monotonic() + START_RETRY_S >= deadline:
                if isinstance(err, LeaseExpired):
                    raise LeaseExpired(
                        f"server {me}: its {what}'s lease lapsed before its key was written, "
                        f"{tries} tries over {within_s:g} s: {err}"
                    ) from err
                raise EtcdUnavailable(
                    f"server {me}: etcd did not answer its {what} in {tries} tries over "
                    f"{within_s:g} s: {err}"
                ) from err
            if isinstance(err, LeaseExpired):
                failed = f"etcd let the lease of its {what} lapse before its key was written"
            else:
                failed = f"etcd did not answer its {what}"
            role_logger(f"ps {me}").warning(
                "%s (try %d; asking again for up to %.0f s): %s",
                failed, tries, deadline - time.monotonic(), err,
            )  # fmt: skip
        time.sleep(START_RETRY_S)  # a signal's handler only records it: looked at right after
        if stopping():
            raise StartStopped(stopped)
