"""Asking several etcd members at once (hedged requests), and which of those asks a client's
close() cuts.

A member on a cut host holds a read, and a follower forwarding a keepalive to a leader that is
gone never answers it, each for the client's whole request timeout (2 s). So
:class:`~hogwild_plugins.ps.etcd.Etcd` asks such an idempotent request (a keepalive, a map read,
a compare-and-swap's read-back) as hedges (:meth:`Hedges.ask`): each ask in a thread of its own
with the client's whole timeout, another sent when none answered for a while, the first answer
counting. The asks still open when the request ends are abandoned, not waited for: the client's
:meth:`~hogwild_plugins.ps.etcd.Etcd.close` cuts their connections
(:func:`~hogwild_plugins.ps.etcd_session.cut_asks`), and only theirs: a request another thread
has in flight is left to end, asks nothing more once the client is closed, and cuts its own asks
left open as it ends. :class:`Hedges` owns that list, its lock and the closed flag.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from hogwild_plugins.ps.etcd_errors import EtcdReplyError, MemberDown, unreached

from hogwild.errors import HogwildError

if TYPE_CHECKING:
    from hogwild_plugins.ps.etcd import Etcd

__all__ = ["Hedges"]


class Hedges:
    """One client's hedged requests: the asks they left open (:attr:`abandoned`), cut when the
    client closes, and whether it did (then no ask starts), safe across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.abandoned: list[threading.Thread] = []  # asks finished requests left open
        self.closed = False

    def ask(
        self, etcd: Etcd, path: str, payload: dict, delay_s: float, tries: int,
        clock: Callable[[], float] = time.monotonic, deadline: float | None = None,
    ) -> tuple[dict, float]:  # fmt: skip
        """``etcd``'s first answer to an idempotent request (a keepalive, a read) asked as hedges,
        and when, by ``clock``, the ask that answered was sent: each ask has the client's whole
        timeout and is not abandoned while the request may still be answered (:meth:`Etcd.close`
        cuts it); when none answered for ``delay_s`` since the last was sent, the member in place is
        asked again (``tries`` > 1: a follower stuck forwarding the first keepalive to a cut leader
        forwards a later one to the new leader), or, once it was asked ``tries`` times, the next
        member, keeping the earlier asks open (a merely slow member still answers the first). A
        member that fails (refused, down, its ask timed out) is replaced at once by the next one,
        which takes its place, and so is one whose reply is no etcd answer
        (:class:`~hogwild_plugins.ps.etcd_errors.EtcdReplyError`: its own fault). When no member
        answers, the request raises :class:`~hogwild_plugins.ps.etcd_errors.EtcdClusterLost`
        (:class:`~hogwild_plugins.ps.etcd_errors.EtcdUnavailable` for a lone member: the error
        failovers retry on) if any member failed to answer, and the first
        :class:`~hogwild_plugins.ps.etcd_errors.EtcdReplyError` only if every member's reply was
        junk; an error etcd answers about the request (a lease not found, a compacted revision) ends
        it at once, the asks still open abandoned: every member would answer the same. One answering
        "leader changed" is asked again at once. Each member is asked at most ``tries`` times (twice
        with ``tries`` 1, the second after "leader changed", as :meth:`Etcd._post` asks a read), so
        one request makes at most that many asks of each member, each in a thread of its own that
        ends with its timeout; the asks still open when the request ends are handed to
        :attr:`abandoned`, which :meth:`Etcd.close` cuts (or cut at once, when the client was closed
        meanwhile). With ``deadline`` (monotonic), a request not answered by then raises as one no
        member answered."""
        answers: queue.SimpleQueue = queue.SimpleQueue()
        mine: list[threading.Thread] = []  # this request's asks
        try:
            return self._ask(etcd, path, payload, delay_s, tries, clock, deadline, answers, mine)
        finally:  # its asks still open are abandoned: close() cuts them
            self._abandon(etcd, mine)

    def check_open(self, address: str, path: str) -> None:
        """Raise :class:`~hogwild.errors.HogwildError` if the client (at ``address``) closed."""
        if self.closed:
            raise HogwildError(f"etcd at {address}: {path} asked of a client that is closed")

    def close(self) -> list[threading.Thread]:
        """Mark the client closed (no ask starts from now on; a request ending later cuts its
        own asks); the asks finished requests left open, for the client to cut."""
        with self._lock:
            self.closed = True
            abandoned, self.abandoned = self.abandoned, []
        return abandoned

    def _ask(
        self, etcd: Etcd, path: str, payload: dict, delay_s: float, tries: int,
        clock: Callable[[], float], deadline: float | None, answers: queue.SimpleQueue,
        mine: list[threading.Thread],
    ) -> tuple[dict, float]:  # fmt: skip
        """The body of :meth:`ask`, each ask it starts put in ``mine``."""
        n = len(etcd._clients)
        order = [(etcd._current + step) % n for step in range(n)]
        asked = dict.fromkeys(order, 0)
        failures: list[tuple[str, str]] = []
        place, outstanding, last_sent = 0, 0, 0.0
        broken: EtcdReplyError | None = None  # the first reply that was no etcd answer
        silent = False  # whether some member did not answer (down, leaderless, cut)

        def send(i: int) -> None:
            nonlocal outstanding, last_sent
            asked[i] += 1
            outstanding += 1
            last_sent, sent = time.monotonic(), clock()

            def ask() -> None:
                try:
                    answers.put((i, sent, etcd._post_to(i, path, payload), None))
                except Exception as err:  # noqa: BLE001 - handed to the asking thread
                    answers.put((i, sent, None, err))

            self.check_open(etcd.address, path)  # one in flight as the client closed: no more
            thread = threading.Thread(target=ask, name=f"etcd-ask-{etcd.members[i]}", daemon=True)
            mine.append(thread)
            thread.start()

        def ask_in_place() -> bool:  # the member in place asked again, or the next one
            nonlocal place
            while place < n and asked[order[place]] >= tries:
                place += 1
            if place == n:
                return False
            send(order[place])
            return True

        ask_in_place()
        while outstanding:
            hedge_at = last_sent + delay_s if place < n else None
            if deadline is not None:
                hedge_at = deadline if hedge_at is None else min(hedge_at, deadline)
            wait = None if hedge_at is None else max(0.0, hedge_at - time.monotonic())
            try:
                i, sent, reply, err = answers.get(timeout=wait)
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    failures.append(("(every member asked)", "no answer before the deadline"))
                    break
                ask_in_place()
                continue
            outstanding -= 1
            member = etcd.members[i]
            if err is None:
                etcd._settle(i)
                etcd.lost_members.discard(member)
                return reply, sent
            if isinstance(err, EtcdReplyError):  # the member's fault: the next one is asked
                broken = broken or err
                failures.append((member, str(err)))
                asked[i] = max(asked[i], tries)
                if place < n and order[place] == i:
                    ask_in_place()
                continue
            if not isinstance(err, MemberDown):
                raise err  # etcd's answer about the request (lease not found): every member's
            failures.append((member, err.why))
            silent = True
            if err.elected:  # it follows a new leader: asked again at once, if it may be
                if asked[i] < max(tries, 2):  # as an unhedged read: asked again once
                    send(i)
                    continue
            else:
                etcd.lost_members.add(member)
            asked[i] = max(asked[i], tries)  # no more asks of it: the next member takes its place
            if place < n and order[place] == i:
                ask_in_place()
        if broken is not None and not silent:  # every member broken: no retry would help
            raise broken
        # one silent member may answer again (an election ends): a lost cluster, retried
        raise unreached(etcd.address, path, failures)

    def _abandon(self, etcd: Etcd, asks: list[threading.Thread]) -> None:
        """Hand a finished request's ``asks`` still open to :attr:`abandoned`, for the client's
        close() to cut; cut them now if it already ran."""
        from hogwild_plugins.ps.etcd_session import cut_asks

        with self._lock:
            left = [ask for ask in asks if ask.is_alive()]
            if not self.closed:
                self.abandoned = [ask for ask in self.abandoned if ask.is_alive()] + left
                return
        for client in etcd._clients:  # closed meanwhile: its sessions closed, cut these too
            cut_asks(client.session, left)
