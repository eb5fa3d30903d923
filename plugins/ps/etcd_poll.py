"""The watch's polls of etcd: one keep-alive ``http.client`` connection per member.

:class:`~hogwild_plugins.ps.etcd_watch.Watch` asks etcd one small range request every 50 ms while
etcd's watch stream is not up (:mod:`hogwild_plugins.ps.etcd_stream`), every 0.5 s while it is,
for as long as a replicated parameter server lives. Through etcd3gw's ``requests`` session (which
rebuilds its request every call) each poll costs the polling process about 1.2 ms of CPU;
through a kept ``http.client`` connection about 0.3 ms, four times less
(``bench/figures/etcd_poll.py``, ``bench/results/etcd_poll.json``). So the polls, and only
they, take this path; every other request goes through :class:`~hogwild_plugins.ps.etcd.Etcd`
as before. An etcd over TLS (``cluster.etcd_tls``) is polled the same way over HTTPS, with an
``ssl`` context that holds what the client's ``requests`` session holds: the job's CA alone
trusted, the member's certificate checked against the address asked, the client's own
certificate shown (:meth:`~hogwild_plugins.ps.etcd_tls.EtcdTls.ssl_context`).

A poll is a read, so it is handled as :class:`~hogwild_plugins.ps.etcd.Etcd` handles reads: it goes
to the member that answered last (and, for a client with a ``near`` member, back to that one every 5
s with a short probe, as the client's map reads go: any failure of that probe, junk included, counts
as a failed return, doubling the wait before the next); a member that cannot be reached, times out
or answers that it cannot answer now (:func:`~hogwild_plugins.ps.etcd_errors.gateway_error`, the
client's own classifier), or whose reply is no etcd answer (not JSON, not a JSON object, an error
page without etcd's error object: :func:`~hogwild_plugins.ps.etcd_errors.is_etcd_error`, the
member's own fault, raised as :class:`~hogwild_plugins.ps.etcd_errors.EtcdReplyError` only when
every member's reply was such), is left for the next one at once, except one that answers ``leader
changed`` (:data:`~hogwild_plugins.ps.etcd_errors.LEADER_CHANGED`: it follows a new leader), which
is asked again at once first (the next member may be the old leader, cut off, where a poll would
wait out its whole timeout); when no member answers, the poll raises
:class:`~hogwild_plugins.ps.etcd.EtcdUnavailable` (one member) or
:class:`~hogwild_plugins.ps.etcd.EtcdClusterLost` (several), naming each member and why.
Every request has the client's timeout, and a reply is read up to :data:`REPLY_LIMIT` bytes.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
from collections.abc import Callable

from hogwild_plugins.ps.etcd_errors import (
    LEADER_CHANGED,
    EtcdReplyError,
    gateway_error,
    reply_object,
    request_error,
    unreached,
)

from hogwild.errors import HogwildError
from hogwild.net.address import parse_address

# how a member closing a kept connection while it was idle surfaces (over TLS too, without its
# close_notify): asked once more, on a new connection
KEPT_CLOSED = (
    http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
    ssl.SSLEOFError, ssl.SSLZeroReturnError,
)  # fmt: skip

__all__ = ["REPLY_LIMIT", "RangePoller"]

REPLY_LIMIT = 1 << 16
"""The most bytes of a reply read: a keys-only range of one key is under a kilobyte."""


class _Down(Exception):
    """A member that did not answer the poll (or has no leader): ask the next one."""


class _Broken(_Down):
    """A member whose reply is no etcd answer (not JSON, not a JSON object, an error status
    without etcd's error object: a proxy's page): its own fault, so the next one is asked; the
    poll raises it (:attr:`error`) only when every member's reply was such."""

    def __init__(self, error: EtcdReplyError) -> None:
        super().__init__(str(error))
        self.error = error


class RangePoller:
    """The watch's range request, posted to etcd's JSON gateway over HTTP, or HTTPS.

    Args:
        members: The members' client addresses (``HOST:PORT``), as the client parsed them.
        api_path: Member ``i``'s gateway path (such as ``/v3/``): etcd3gw's, which asks the
            member once (raising if it cannot) and keeps it.
        timeout_s: The limit of one request to one member, in seconds.
        first: The member asked first (the one the client's last request reached).
        tls: For members serving HTTPS, the context their connections are made with (the
            client's certificate and the CA it trusts); None for plain HTTP.
        near: The member on this process's host (the client's ``near``), or None.
        near_return: ``(return_s, probe_s, backoff_max)``, the client's (``NEAR_RETURN_S``,
            ``NEAR_PROBE_S``, ``NEAR_BACKOFF_MAX`` of :mod:`~hogwild_plugins.ps.etcd_members`): a
            poll after ``return_s`` elsewhere goes to the near member first, asked once with a
            ``probe_s`` timeout, and each failed return doubles the wait, ``backoff_max`` times at
            most; as the client's map reads do, so that one failover does not leave the polls (and
            the stream, which follows them) on a remote member for the watch's life.
    """

    def __init__(
        self,
        members: list[str],
        api_path: Callable[[int], str],
        timeout_s: float,
        first: int = 0,
        tls: ssl.SSLContext | None = None,
        near: int | None = None,
        near_return: tuple[float, float, int] = (5.0, 0.5, 12),
    ) -> None:
        if not members:
            raise HogwildError("etcd poll: no member to ask; expected HOST:PORT[,HOST:PORT...]")
        self.members, self.api_path = list(members), api_path
        if not 0 <= first < len(members):
            raise HogwildError(f"etcd poll: first member {first!r}: expected 0..{len(members) - 1}")
        self.timeout_s, self.tls = timeout_s, tls
        self.address = ",".join(self.members)
        self._connections: list[http.client.HTTPConnection | None] = [None] * len(members)
        if near is not None and not 0 <= near < len(members):
            raise HogwildError(f"etcd poll: near member {near!r}: expected 0..{len(members) - 1}")
        self._current, self._near = first, near
        self._return_s, self._probe_s, self._backoff_max = near_return
        self._away_since = time.monotonic()  # when the polls left the near member
        self._near_backoff = 1

    @property
    def current(self) -> int:
        """The member the next poll goes to first (the one that answered last)."""
        return self._current

    def post(self, path: str, payload: dict) -> dict:
        """The gateway's JSON reply to ``payload`` at ``path`` (such as ``/kv/range``).

        Raises:
            EtcdUnavailable: No member answered (EtcdClusterLost where there are several).
            EtcdReplyError: Every member's reply was no etcd answer (see :class:`_Broken`).
            HogwildError: A member answered etcd's error about the request, or with more than
                :data:`REPLY_LIMIT` bytes.
        """

        body = json.dumps(payload).encode()
        failures: list[tuple[str, str]] = []
        broken: list[EtcdReplyError] = []  # the members whose replies were no etcd answer
        n = len(self.members)
        probe = None  # the near member, asked once first after a while elsewhere
        if self._near not in (None, self._current):
            if time.monotonic() - self._away_since >= self._return_s * self._near_backoff:
                probe = self._near
        for step in range(-1 if probe is not None else 0, n):
            i = probe if step < 0 else (self._current + step) % n
            if step >= 0 and i == probe:
                continue  # asked first already
            try:
                reply = self._post_to(i, path, body, self._probe_s if i == probe else None)
            except (_Down, HogwildError) as down:
                if isinstance(down, _Broken):
                    broken.append(down.error)
                if i == probe:  # not back yet (whatever failed): wait longer before the next
                    self._near_backoff = min(2 * self._near_backoff, self._backoff_max)
                    self._away_since = time.monotonic()
                    failures.append((self.members[i], str(down)))
                    continue
                if not isinstance(down, _Down):  # etcd's answer about the request: any member's
                    raise
                if LEADER_CHANGED not in str(down).lower():
                    failures.append((self.members[i], str(down)))
                    continue
                try:  # it follows the new leader now: asked again before the next member
                    reply = self._post_to(i, path, body)
                except _Down as again:
                    if isinstance(again, _Broken):
                        broken.append(again.error)
                    failures.append((self.members[i], str(again)))
                    continue
            if i == self._near:
                self._near_backoff = 1
            elif self._current == self._near:
                self._away_since = time.monotonic()
            self._current = i
            return reply
        if broken and len(broken) == len(failures):  # every member broken: no retry would help
            raise broken[0]
        raise unreached(self.address, path, failures)

    def close(self) -> None:
        """Close the kept connections."""
        for i, connection in enumerate(self._connections):
            if connection is not None:
                connection.close()
                self._connections[i] = None

    def _post_to(self, i: int, path: str, body: bytes, timeout_s: float | None = None) -> dict:
        member = self.members[i]
        kept = self._connections[i] is not None
        try:
            status, data = self._exchange(i, path, body, timeout_s)
        except KEPT_CLOSED as err:
            if not kept:
                raise _Down(f"{type(err).__name__}: {err}"[:400]) from err
            try:  # the member closed the kept connection while idle: once more, on a new one
                status, data = self._exchange(i, path, body, timeout_s)
            except (OSError, http.client.HTTPException) as again:
                raise _Down(f"{type(again).__name__}: {again}"[:400]) from again
        except (OSError, http.client.HTTPException) as err:  # refused, timed out, cut
            raise _Down(f"{type(err).__name__}: {err}"[:400]) from err

        error = gateway_error(status, data.decode("utf-8", "replace"))
        if error is not None:
            down, detail = error
            if down:
                raise _Down(detail)
            error = request_error(member, path, detail, data.decode("utf-8", "replace"))
            if isinstance(error, EtcdReplyError):  # a proxy's page: not etcd
                raise _Broken(error)
            raise error
        try:
            return reply_object(member, path, data)
        except EtcdReplyError as err:
            raise _Broken(err) from err

    def _url(self, i: int, path: str) -> str:
        try:
            prefix = self.api_path(i)
        except Exception as err:  # noqa: BLE001 - etcd3gw's, from its /version request
            raise _Down(f"no API path: {type(err).__name__}: {err}"[:400]) from err
        return prefix + path.lstrip("/")

    def _exchange(
        self, i: int, path: str, body: bytes, timeout_s: float | None = None
    ) -> tuple[int, bytes]:
        """One request to member ``i`` on its kept connection (opened if need be), each step
        limited to ``timeout_s`` (default the poller's); its status and body. On any failure
        the connection is closed: a half-read reply must not be read as the next request's."""
        limit = self.timeout_s if timeout_s is None else min(timeout_s, self.timeout_s)
        connection = self._connections[i]
        if connection is None:
            parsed = parse_address(self.members[i])
            if self.tls is None:
                connection = http.client.HTTPConnection(
                    parsed.host, parsed.port, timeout=self.timeout_s
                )
            else:  # the handshake on the first request; a refused certificate is an OSError
                connection = http.client.HTTPSConnection(
                    parsed.host, parsed.port, timeout=self.timeout_s, context=self.tls
                )
            self._connections[i] = connection
        connection.timeout = limit  # for a connection opened now
        if connection.sock is not None:
            connection.sock.settimeout(limit)
        try:
            connection.request("POST", self._url(i, path), body,
                               {"Content-Type": "application/json"})  # fmt: skip
            answer = connection.getresponse()
            announced = answer.length or 0  # its Content-Length, where it has one
            data = answer.read(REPLY_LIMIT + 1) if announced <= REPLY_LIMIT else b""
            if announced > REPLY_LIMIT or len(data) > REPLY_LIMIT:  # closed below, unread
                raise HogwildError(
                    f"etcd at {self.members[i]}: {path}: reply of more than {REPLY_LIMIT} bytes"
                    " refused"
                )
            return answer.status, data
        except BaseException:
            connection.close()
            self._connections[i] = None
            raise
