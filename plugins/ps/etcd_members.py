"""Which etcd member a client's request goes to, and what one member's failure means for it.

Part of the etcd client :class:`~hogwild_plugins.ps.etcd.Etcd` (a mixin: the client's state, set up
by :meth:`MemberChoice._choose_first_member`; the client's requests call
:meth:`MemberChoice._post`), apart from what the client asks (leases, keys, transactions, watches).
The rules, as the client's module docstring states them: requests go to one member until it fails,
first the one on this host (``near``) if there is one; a request that could not have reached its
member, and any read, is asked of the others at once; a write of unknown fate is not repeated (it
raises :class:`~hogwild_plugins.ps.etcd_errors.EtcdUnavailable`, and the next request goes to the
next member), except after "leader changed", when the member that said it is asked again (it follows
a leader); a read away from the near member for :data:`NEAR_RETURN_S` goes back to it first, asked
with the short :data:`NEAR_PROBE_S`, each failed return doubling the wait (:data:`NEAR_BACKOFF_MAX`
at most). Members whose last request failed are ``lost_members``; when every member failed one
request, :class:`~hogwild_plugins.ps.etcd_errors.EtcdClusterLost`. One member's reply is made into
an answer or a typed error here too (:meth:`MemberChoice._post_to`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from hogwild_plugins.ps.etcd_errors import (
    LEADERLESS,
    PROPOSAL_DROPPED,
    EtcdClusterLost,
    EtcdReplyError,
    EtcdUnavailable,
    LeaseExpired,
    gateway_error,
    is_etcd_error,
    reply_object,
    request_error,
    unreached,
)
from hogwild_plugins.ps.etcd_errors import MemberDown as _MemberDown

from hogwild.errors import HogwildError
from hogwild.net.address import parse_address

if TYPE_CHECKING:
    from etcd3gw import exceptions as gw

__all__ = [
    "NEAR_BACKOFF_MAX",
    "NEAR_PROBE_S",
    "NEAR_RETURN_S",
    "READS",
    "UNNAMED_HOSTS",
    "MemberChoice",
]

log = logging.getLogger("hogwild_plugins.ps.etcd")  # the client's: one logger for etcd's news

READS = frozenset({"/kv/range", "/lease/keepalive"})  # safe to ask another member again
NEAR_RETURN_S = 5.0
"""How long a client with a ``near`` member serves elsewhere before its next map read (a range,
which moves on at once if the member fails) goes to the near member again, so that one
failover does not leave it on a remote member whose host's next cut costs a timeout."""
NEAR_PROBE_S = 0.5
"""The timeout of that read when it goes back to the near member: one that accepts connections but
does not answer (stopped, stalled, cut from its peers) costs this, not the client's whole timeout,
before the read goes on to the others."""
NEAR_BACKOFF_MAX = 12
"""Each failed return to the near member doubles the wait before the next one (``NEAR_RETURN_S``
times this at most: a minute), and one that answers resets it."""
UNNAMED_HOSTS = frozenset({"", "0.0.0.0", "::"})  # a listening wildcard names no host
_NEAR_UNMATCHED: set[tuple[str, str]] = set()  # (near, address) already logged


class MemberChoice:
    """The member a request of an etcd client goes to (see the module docstring).

    It keeps, on the client: ``near`` and ``_near`` (this host's member, or None), ``_current``
    (the member requests go to), ``_away_since`` and ``_near_backoff`` (the returns to the near
    member), ``lost_members`` and ``unknown_at`` (the member the last write of unknown fate went
    to); it reads the client's ``members``, ``address``, ``timeout_s``, ``_clients`` (one etcd3gw
    client per member) and ``_hedges`` (whose closing refuses new asks).
    """

    def _choose_first_member(self, near: str | None) -> None:
        """Set up the choice: requests go first to the member on ``near``'s host, if one is
        (a wildcard is refused; an address no member has is logged once)."""
        self.near = near
        self.unknown_at: int | None = None
        hosts = [parse_address(member).host for member in self.members]
        if near is not None and near in UNNAMED_HOSTS:
            raise HogwildError(
                f"etcd near={near!r}: expected this process's host address as the etcd members "
                f"{self.address} name theirs, not a wildcard"
            )
        self._near = hosts.index(near) if near in hosts else None
        if near is not None and self._near is None and (near, self.address) not in _NEAR_UNMATCHED:
            _NEAR_UNMATCHED.add((near, self.address))  # once: each server makes several clients
            log.info(
                "etcd: no member of %s is on this host (near=%s, matched against the members' "
                "hosts %s): requests go first to %s",
                self.address, near, sorted(set(hosts)), self.members[0],
            )  # fmt: skip
        # the member requests go to until it fails: this host's own, if it has one
        self._current = self._near if self._near is not None else 0
        self._away_since = 0.0  # when requests left the near member (monotonic)
        self._near_backoff = 1  # NEAR_RETURN_S times this before the next return to it
        self.lost_members: set[str] = set()  # members whose last request failed

    def _post(
        self,
        path: str,
        payload: dict,
        timeout_s: float | None = None,
        tries: int = 2,
        read: bool = False,
    ) -> dict:
        """One request, to the current member or, as the module docstring says, the others.

        ``timeout_s`` (default the client's) limits each ask; a read (a path of :data:`READS`,
        or ``read``) is asked of one member up to ``tries`` times while it answers "leader
        changed". So one request makes at most ``tries`` asks of each member: ``tries * members``
        in all. A read while away from the near member for :data:`NEAR_RETURN_S` goes to it
        first, asked once with a short timeout (:data:`NEAR_PROBE_S`: a member that failed may
        fail again), and waits longer each time it fails (:data:`NEAR_BACKOFF_MAX`)."""
        failures: list[tuple[str, str]] = []
        broken: list[EtcdReplyError] = []  # members whose replies were no etcd answer
        n = len(self._clients)
        read = read or path in READS
        if not read:
            self.unknown_at = None  # this write's own, not an earlier write's
        probe = None  # the near member, asked once first after a while elsewhere
        if read and self._near is not None and self._current != self._near:
            away = time.monotonic() - self._away_since
            if away >= NEAR_RETURN_S * self._near_backoff:  # back home, if it answers
                probe = self._near
        for step in range(-1 if probe is not None else 0, n):
            i = probe if step < 0 else (self._current + step) % n
            if step >= 0 and i == probe:
                continue  # asked first already
            member = self.members[i]
            asks = 1 if not read or i == probe else tries
            limit = timeout_s
            if i == probe:  # a near member that does not answer costs a short wait only
                limit = min(NEAR_PROBE_S, self.timeout_s if timeout_s is None else timeout_s)
            try:
                reply = self._ask(i, path, payload, limit, asks)
            except (_MemberDown, EtcdReplyError) as down:
                if i == probe:  # not back yet (whatever failed): wait longer before the next
                    self._near_backoff = min(2 * self._near_backoff, NEAR_BACKOFF_MAX)
                    self._away_since = time.monotonic()
                if isinstance(down, EtcdReplyError):  # the member's fault: a read asks the next
                    if not read:
                        raise
                    broken.append(down)
                    failures.append((member, str(down)))
                    continue
                if not down.elected:  # one that says "leader changed" follows a leader again
                    self.lost_members.add(member)
                failures.append((member, down.why))
                if not down.unsent and not read:
                    self.unknown_at = i
                if n > 1 and not down.unsent and not read:
                    self._settle(i if down.elected else (i + 1) % n)
                    if self.lost_members >= set(self.members):  # the last one thought alive
                        raise EtcdClusterLost(
                            f"no member of the etcd cluster {self.address} answers: "
                            f"{member} did not answer {path} ({down.why}), and the others "
                            "failed before it"
                        ) from None
                    raise EtcdUnavailable(
                        f"etcd member {member} did not answer {path} ({down.why}); it may have "
                        "been applied, so it is not repeated on another member; the next "
                        f"request goes to {self.members[self._current]}"
                    ) from None
                continue
            self._settle(i)
            self.lost_members.discard(member)
            if i == self._near:
                self._near_backoff = 1
            return reply
        if broken and len(broken) == len(failures):  # every member broken: no retry would help
            raise broken[0]
        raise unreached(self.address, path, failures)

    def _settle(self, i: int) -> None:
        """Make member ``i`` the one requests go to, noting when they left the near one."""
        if i != self._current and self._current == self._near:
            self._away_since = time.monotonic()
        self._current = i

    def _ask(self, i: int, path: str, payload: dict, timeout_s: float | None, tries: int) -> dict:
        """Member ``i``'s reply, asked up to ``tries`` times (see :meth:`_post`): again after
        "leader changed" (it follows the new leader now)."""
        for attempt in range(1, tries + 1):
            try:
                return self._post_to(i, path, payload, timeout_s)
            except _MemberDown as down:
                if attempt == tries or not down.elected:
                    raise
        raise AssertionError("unreachable: the last ask returns or raises")  # pragma: no cover

    def _post_to(self, i: int, path: str, payload: dict, timeout_s: float | None = None) -> dict:
        """One request to member ``i``, its errors typed (see the module docstring); a member
        that did not answer is :class:`_MemberDown`."""
        import requests
        from etcd3gw import exceptions as gw

        client, member = self._clients[i], self.members[i]
        self._hedges.check_open(self.address, path)  # closed: new pools nobody would close
        try:
            url = client.get_url(path)  # etcd3gw's: the member's API path, asked once
            limit = client.timeout if timeout_s is None else timeout_s
            answer = client.session.post(url, json=payload, timeout=limit)
        except (gw.ConnectionFailedError, gw.ConnectionTimeoutError) as err:  # the asking
            raise _MemberDown(_detail(err) or "timed out", _unsent(err.__context__)) from err
        except gw.Etcd3Exception as err:
            detail = _detail(err)
            if any(word in detail.lower() for word in LEADERLESS):
                raise _MemberDown(detail, unsent=False) from err
            raise EtcdReplyError(f"etcd at {member}: {path}: no API path: {detail}") from err
        except requests.RequestException as err:  # refused, timed out, cut
            why = str(err)[:400] or type(err).__name__
            timed_out = isinstance(err, requests.exceptions.Timeout)
            raise _MemberDown(why, _unsent(err), timed_out) from err
        error = gateway_error(answer.status_code, answer.text)
        if error is not None:
            down, detail = error
            if "lease not found" in detail and is_etcd_error(answer.text):
                lease = payload.get("ID") or payload.get("lease")
                which = f"lease {lease}" if lease else "a lease of this transaction"
                raise LeaseExpired(f"etcd at {member}: {which} expired or was revoked")
            if down:  # unavailable, timed out, or cut off from its quorum
                # a proposal its raft dropped was never appended nor forwarded: safe elsewhere
                raise _MemberDown(detail, unsent=PROPOSAL_DROPPED in detail.lower())
            raise request_error(member, path, detail, answer.text)  # etcd's, or a proxy's page
        return reply_object(member, path, answer.content)


def _unsent(cause: BaseException | None) -> bool:
    """Whether a request that failed with ``requests``' ``cause`` surely never reached etcd: no
    connection was made."""
    import requests

    if isinstance(cause, requests.exceptions.ConnectTimeout):
        return True
    return isinstance(cause, requests.exceptions.ConnectionError) and (
        "NewConnectionError" in str(cause) or "Connection refused" in str(cause)
    )


def _detail(err: gw.Etcd3Exception) -> str:
    """etcd3gw keeps the useful text in ``detail_text`` (``str(err)`` is often empty)."""
    return " ".join(str(part) for part in (*err.args, err.detail_text) if part)[:400]
