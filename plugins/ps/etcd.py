"""The parameter servers' link to etcd: the controller of a replicated parameter server.

Adam (OSDI 2014, section 3.3.3) keeps its parameter servers' bucket map and primary leases in a
Paxos-replicated controller; hogwild keeps them in etcd. This module is the client, with no
policy (who is primary, what the map says: that lives in I/O-free state machines elsewhere):
:class:`Etcd`, a typed, validating client for one job's keys, every key relative to a job prefix
(``/hogwild/<job>/``), every value a JSON object. Nothing read from the network is trusted: a
value that is not a JSON object is a :class:`~hogwild.errors.HogwildError` naming the key, a
request that cannot reach etcd is :class:`EtcdUnavailable` naming the address, a lease etcd no
longer knows is :class:`LeaseExpired`. Every request has a timeout.

With a directory of certificates (``tls``, ``cluster.etcd_tls``) every request goes over HTTPS
with the directory's client certificate, the members checked against its CA. etcd is reached
directly, never through a proxy: the environment's ``HTTP_PROXY``/``HTTPS_PROXY``/``NO_PROXY``
(which ``requests`` would otherwise read, even for a loopback etcd) are ignored, by every request
and by the watch's polls alike.

An etcd cluster is given as its members' client addresses, ``HOST:PORT,HOST:PORT,...``: requests go
to one member until it fails, then to the next. A request that could not have reached the member
(refused, unreachable, or a write its raft dropped unappended: ``raft proposal dropped``) is tried
on the others at once, and so is a read (a read-only transaction included); a write whose fate is
unknown (timed out, or refused for want of a leader) is not repeated, since it may have been
applied: it raises :class:`EtcdUnavailable` naming the member, and the next request goes to the next
member (a client with ``write_retry_s`` reads a compare-and-swap's outcome back instead, and asks
it again only if it did not apply: :mod:`~hogwild_plugins.ps.etcd_cas`). A member that answers
``leader changed`` is the exception: etcd says so only once a new
leader is known (its request waited out an election), so the member is alive and follows a leader: a
read is asked of it again at once, and after a write refused so the next request stays with it,
which is not a lost member. Trying the next member instead can cost a whole request timeout when
that member is the old leader, cut off (the election's cause), where a read would hang. A keepalive
may be hedged (``keepalive_s``, a quarter of the lease): a follower forwards it to the leader it
knows and, that leader cut off, never answers ``leader changed``, so a keepalive unanswered for
``keepalive_s`` is asked of the same member again (the near one, if any; the one answering in its
place once it failed), up to :data:`KEEPALIVE_TRIES` times, by then forwarded to the new leader,
while the earlier asks stay open with the client's whole timeout (a merely slow member still
answers them), and the first answer counts. A client's map reads may be hedged too
(``read_hedge_s``, :data:`READ_HEDGE_S` for :class:`~hogwild_plugins.ps.routes.Routes`): a member
on a cut host holds a range read (it cannot confirm its leader) until the client's whole timeout,
so a read unanswered for ``read_hedge_s`` is asked of the NEXT member, the earlier ask kept open,
each member once, and the first answer counts (a read is idempotent). Members that failed their last
request are :attr:`Etcd.lost_members` (a lost member); when every member failed one request,
:class:`EtcdClusterLost` (a lost cluster). A member whose reply is no etcd answer (not JSON, not
a JSON object, an error status without etcd's error object: a proxy's page) is that member's
fault (:class:`~hogwild_plugins.ps.etcd_errors.EtcdReplyError`): a hedged read asks the next
member, and raises it only when every member's reply was such (one that did not answer makes it
a lost cluster, which failovers read again on).

Which member a request goes to, and what a member's failure means for it, is
:class:`~hogwild_plugins.ps.etcd_members.MemberChoice`'s (a mixin of :class:`Etcd`, in
:mod:`hogwild_plugins.ps.etcd_members`): this module is what the client asks.

The server itself (:class:`EtcdProcess`, :func:`etcd_binary`) is OS mechanics, in
:mod:`hogwild_plugins.ps.etcd_process`, and re-exported here.

It talks to etcd's gRPC JSON gateway through etcd3gw's clients (their session and API-path
discovery; what an error reply means is
:func:`~hogwild_plugins.ps.etcd_errors.gateway_error`'s) but builds its own requests:
etcd3gw's ``put`` drops the revision, its ``get`` drops the store revision, its ``Lease.ttl``
fails on an expired lease and its streaming watch has no timeout and loses errors in a thread.
:meth:`Etcd.watch` therefore reads etcd's watch stream itself
(:mod:`~hogwild_plugins.ps.etcd_stream`), and polls slowly as its safety net (see :class:`Watch`).
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Callable, Iterable

from hogwild_plugins.ps import etcd_members as member_choice
from hogwild_plugins.ps.etcd_errors import (
    EtcdClusterLost,
    EtcdUnavailable,
    LeaseExpired,
)
from hogwild_plugins.ps.etcd_errors import reply_int as _int
from hogwild_plugins.ps.etcd_hedge import Hedges
from hogwild_plugins.ps.etcd_keys import after as _after
from hogwild_plugins.ps.etcd_keys import b64 as _b64
from hogwild_plugins.ps.etcd_members import MemberChoice
from hogwild_plugins.ps.etcd_process import EtcdProcess, etcd_binary
from hogwild_plugins.ps.etcd_tls import EtcdTls
from hogwild_plugins.ps.etcd_watch import SAFETY_POLL_S, Watch

from hogwild.errors import HogwildError
from hogwild.net.address import parse_address

__all__ = [
    "Etcd",
    "EtcdClusterLost",
    "EtcdProcess",
    "EtcdUnavailable",
    "LeaseExpired",
    "Watch",
    "etcd_binary",
    "parse_endpoints",
]

KEEPALIVE_TRIES = 3
"""The most times one member is asked one hedged keepalive (``keepalive_s`` after the last ask, none
having answered), the earlier asks kept open; a member that fails is replaced at once by the next
one. A keepalive is idempotent, so asking again is safe; a follower forwards it to the leader it
knows and, that leader cut off, waits (etcd 3.4: up to its 5 s request timeout, never answering
"leader changed"), and once the others elected a leader the next ask is forwarded there. With
``keepalive_s`` a quarter of the lease (:func:`keepalive_s`) the three asks go out within the first
half of it, inside the lease clock's own margin (:class:`~hogwild_plugins.ps.failover.LeaseClock`),
and the renewal counts from the send time of the ask that answered."""


READ_HEDGE_S = 0.25
"""How long a client's map read (:class:`~hogwild_plugins.ps.routes.Routes`) waits for one member
before it is asked of the next, the first ask kept open: a member that answers does so in
milliseconds, while one on a cut host holds the read for the whole request timeout (2 s). A
quarter of the shortest lease (1 s), as :func:`keepalive_s` there: a client rerouting after its
primary's host was cut then sees the new primary within a quarter second of the map naming it."""


def keepalive_s(lease_s: float) -> float:
    """How long a keepalive of a ``lease_s`` lease waits for an answer before it is asked again
    (hedged, the earlier ask kept open): a quarter of the lease, at least 0.2 s (0.25 s at a 1 s
    lease, so an election at :data:`~hogwild_plugins.ps.etcd_process.ELECTION_MS` ends before the
    second or third ask)."""
    return max(0.2, lease_s / 4)


def parse_endpoints(address: str) -> list[str]:
    """The members of ``address`` (``HOST:PORT`` or a comma-separated list of them), each as
    ``HOST:PORT``.

    Raises:
        HogwildError: An empty entry, one that is not ``HOST:PORT``, or a member named twice.
    """
    parts = [part.strip() for part in str(address).split(",")]
    members = []
    for part in parts:
        parsed = parse_address(part) if part else None
        if parsed is None or parsed.transport != "tcp":
            raise HogwildError(
                f"etcd address {address!r}: expected HOST:PORT, or the members of an etcd "
                "cluster as HOST:PORT,HOST:PORT,..."
            )
        members.append(str(parsed))
    if len(set(members)) != len(members):
        raise HogwildError(f"etcd address {address!r}: a member is named twice")
    return members


Also = Iterable[tuple]
"""Extra writes of a transaction: ``(key, value)`` or ``(key, value, lease)`` tuples."""


class Etcd(MemberChoice):
    """A client for the keys below ``prefix`` on the etcd at ``address`` (``HOST:PORT``).

    Keys are relative to ``prefix`` and values are JSON objects (dicts). Revisions are etcd's:
    ``mod_revision`` of a key changes on every write to it; 0 means "absent", so
    ``replace(key, value, 0)`` creates.

    Args:
        address: ``HOST:PORT`` of etcd's client URL, or an etcd cluster's members as
            ``HOST:PORT,HOST:PORT,...`` (see the module docstring).
        prefix: The job's key prefix, such as ``/hogwild/<job>/``.
        timeout_s: The limit of every request to one member, in seconds.
        tls: A directory of etcd certificates (``cluster.etcd_tls``,
            :mod:`~hogwild_plugins.ps.etcd_tls`): HTTPS with its client certificate.
        near: This process's host address: requests go first to the member on that host, if
            one is (a server beside an etcd member: when another host is cut off, its member,
            even the leader, is never the one this process waits on); after a failover a range
            read goes back to it every :data:`NEAR_RETURN_S`. A wildcard is refused; an
            address no member has is logged once, and requests go first to the first member.
        keepalive_s: Given, keepalives are hedged: one unanswered this long is asked again,
            its earlier asks kept open with the whole ``timeout_s`` (:meth:`_hedged`,
            :func:`keepalive_s`); default: asked as any read.
        read_hedge_s: Given, :meth:`get_prefix` reads are hedged: one unanswered this long is
            asked of the next member, each member once, the earlier asks kept open
            (:data:`READ_HEDGE_S`); such a read does not go back to the near member. Default:
            asked as any read (:meth:`_post`).
        write_retry_s: Given, a compare-and-swap of puts (:meth:`replace`, :meth:`create`) is
            first asked with this timeout and, unanswered, its outcome read back and asked again
            only if it did not apply, all within ``timeout_s``
            (:func:`~hogwild_plugins.ps.etcd_cas.swap`,
            :func:`~hogwild_plugins.ps.etcd_cas.write_retry_s`): a proposal a follower forwarded
            to a leader that is gone is lost without an answer. Default: asked once, as any write.
    """

    def __init__(
        self, address: str, *, prefix: str, timeout_s: float = 2.0, tls: str | None = None,
        near: str | None = None, keepalive_s: float | None = None,
        read_hedge_s: float | None = None, write_retry_s: float | None = None,
    ) -> None:  # fmt: skip
        self.members = parse_endpoints(address)
        if not prefix:
            raise HogwildError("etcd key prefix is empty: expected something like /hogwild/JOB/")
        self.address = ",".join(self.members)
        self.prefix = prefix
        self.timeout_s = timeout_s
        if keepalive_s is not None and not keepalive_s > 0:
            raise HogwildError(f"etcd keepalive timeout {keepalive_s!r} s: expected more than 0")
        self.keepalive_s = keepalive_s
        if read_hedge_s is not None and not read_hedge_s > 0:
            raise HogwildError(f"etcd read hedge delay {read_hedge_s!r} s: expected more than 0")
        self.read_hedge_s = read_hedge_s
        if write_retry_s is not None and not write_retry_s > 0:
            raise HogwildError(
                f"etcd write retry timeout {write_retry_s!r} s: expected more than 0"
            )
        self.write_retry_s = write_retry_s
        self.tls = tls or None
        secure = EtcdTls.load(tls).client_options() if tls else {}
        import etcd3gw  # here: with requests, a fifth of a second that jobs without copies,

        # whose processes import this module, never spend
        from hogwild_plugins.ps.etcd_session import direct_session

        self._clients = []
        for member in self.members:
            parsed = parse_address(member)
            options = dict(secure)
            # direct (no proxy), and closed mid-request: close() cuts asks left open
            options["session"] = direct_session(options.get("session"))
            self._clients.append(etcd3gw.client(host=parsed.host, port=parsed.port,
                                                timeout=timeout_s, **options))  # fmt: skip
        self._choose_first_member(near)  # which member a request goes to: MemberChoice
        self.renewal_sent: float | None = None  # when the last keepalive answered was sent
        # hedged requests' asks, and those left open that close() cuts
        self._hedges = Hedges()
        self._watches: list[Watch] = []

    # -- leases ---------------------------------------------------------------------------

    def grant(self, ttl_s: int) -> int:
        """A new lease of ``ttl_s`` seconds; its id.

        Raises:
            HogwildError: etcd granted a longer TTL (its floor is 1.5 election timeouts), which
                would silently slow every failover.
        """
        lease, granted = self._grant(ttl_s)
        if granted != ttl_s:
            self.revoke(lease)
            raise HogwildError(
                f"etcd at {self.address} grants leases of at least {granted} s, not {ttl_s} s: "
                f"ask for {granted} s or more, or run etcd with a shorter --election-timeout"
            )
        return lease

    def _grant(self, ttl_s: int) -> tuple[int, int]:
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int) or ttl_s < 1:
            raise HogwildError(f"lease TTL {ttl_s!r}: expected a whole number of seconds >= 1")
        reply = self._post("/lease/grant", {"TTL": ttl_s, "ID": 0})
        return _int(reply, "ID", self.address), _int(reply, "TTL", self.address)

    def _hedged(
        self, path: str, payload: dict, delay_s: float, tries: int,
        clock: Callable[[], float] = time.monotonic, deadline: float | None = None,
    ) -> tuple[dict, float]:  # fmt: skip
        """The first answer to an idempotent request asked of several members at once, and when,
        by ``clock``, the ask that answered was sent (:meth:`~hogwild_plugins.ps.etcd_hedge.
        Hedges.ask`)."""
        return self._hedges.ask(self, path, payload, delay_s, tries, clock, deadline)

    def keepalive(self, lease: int, clock: Callable[[], float] = time.monotonic) -> int:
        """Renew ``lease``: the seconds it has left, or 0 when it has expired (or is unknown).
        :attr:`renewal_sent` is then when, by ``clock``, the ask that answered was sent: the
        renewed TTL runs from no earlier than that. With ``keepalive_s`` the asks are hedged
        (:meth:`_hedged`)."""
        if self.keepalive_s is None:
            self.renewal_sent = clock()
            reply = self._post("/lease/keepalive", {"ID": lease})
        else:  # a follower stuck forwarding it to a cut leader is asked again, not waited on
            reply, self.renewal_sent = self._hedged(
                "/lease/keepalive", {"ID": lease}, self.keepalive_s, KEEPALIVE_TRIES, clock
            )
        reply = reply.get("result")
        # The gateway leaves out zero fields: an expired lease comes back without a TTL.
        return max(0, _int(reply, "TTL", self.address, default=0))

    def revoke(self, lease: int) -> None:
        """End ``lease`` now, deleting its keys; a lease already gone is no error."""
        try:
            self._post("/kv/lease/revoke", {"ID": lease})
        except LeaseExpired:
            pass

    # -- keys -----------------------------------------------------------------------------

    def put(self, key: str, value: dict, lease: int | None = None) -> int:
        """Write ``key`` (attached to ``lease`` if given); the store's revision after it."""
        reply = self._post("/kv/put", self._put_op(key, value, lease))
        return _int(reply.get("header"), "revision", self.address)

    def get(self, key: str) -> tuple[dict | None, int]:
        """``(value, mod_revision)`` of ``key``, or ``(None, 0)`` when it is absent."""
        reply = self._post("/kv/range", {"key": _b64(self._key(key))})
        for kv in self._kvs(reply):
            return self._value(kv), _int(kv, "mod_revision", self.address)
        return None, 0

    def get_prefix(self, prefix: str = "") -> tuple[dict[str, tuple[dict, int]], int]:
        """Every key starting with ``prefix``, as ``{key: (value, mod_revision)}`` with keys
        relative to the job prefix, and the store's revision they were read at."""
        start = self._key(prefix, allow_empty=True)
        payload = {"key": _b64(start), "range_end": _b64(_after(start))}
        if self.read_hedge_s is None:
            reply = self._post("/kv/range", payload)
        else:  # a member holding the read (its host cut) is not waited on: the next is asked
            reply, _ = self._hedged("/kv/range", payload, self.read_hedge_s, 1)
        found = {}
        for kv in self._kvs(reply):
            found[self._relative(kv)] = (self._value(kv), _int(kv, "mod_revision", self.address))
        return found, _int(reply.get("header"), "revision", self.address)

    def create(self, key: str, value: dict, lease: int | None = None, also: Also = ()) -> bool:
        """Write ``key`` and each of ``also`` in one transaction if ``key`` is absent; False
        when it exists (or, read back, is not known to be ours: :meth:`replace`)."""
        return self.replace(key, value, 0, lease, also)

    def replace(
        self,
        key: str,
        value: dict,
        expected_mod_revision: int,
        lease: int | None = None,
        also: Also = (),
        guard: tuple[str, dict] | None = None,
    ) -> bool:
        """Write ``key`` and each of ``also`` in one transaction if ``key``'s mod_revision is
        still ``expected_mod_revision`` (0: absent) and, with ``guard`` (``(key, value)``), that
        key still holds exactly that value; False when either changed. With ``write_retry_s`` (a
        swap of puts whose first ask may be lost is read back, :mod:`plugins.ps.etcd_cas`) True
        means known to be ours and False not known to be ours: a swap that applied but whose keys
        another write changed (or whose lease lapsed) before the read-back reads as False, as a
        lost campaign does (never asked again once it may have applied, but for the create that
        :mod:`plugins.ps.etcd_cas` names)."""
        also = list(also)
        ops = [self._put_op(key, value, lease)]
        for extra in also:
            if not isinstance(extra, tuple) or len(extra) not in (2, 3):
                raise HogwildError(f"etcd transaction: {extra!r} is not (key, value[, lease])")
            ops.append(self._put_op(*extra))
        keys = [op["key"] for op in ops]
        if len(set(keys)) != len(keys):
            named = [key, *(extra[0] for extra in also)]
            raise HogwildError(f"etcd transaction writes a key twice: {named}")
        puts = [{"request_put": op} for op in ops]
        return self._txn(key, expected_mod_revision, puts, guard)[0]

    def holds(self, key: str, value: dict) -> bool:
        """Whether ``key`` holds exactly the bytes a put of ``value`` writes (as a ``guard`` of
        :meth:`replace` compares them)."""
        put = self._put_op(key, value)
        compare = {"key": put["key"], "result": "EQUAL", "target": "VALUE", "value": put["value"]}
        query = {"compare": [compare], "success": [], "failure": []}
        reply = self._post("/kv/txn", query, read=True)  # it writes nothing: asked again safely
        return reply.get("succeeded") is True

    def delete(self, key: str, expected_mod_revision: int | None = None) -> bool:
        """Delete ``key`` (only if its mod_revision is ``expected_mod_revision``, when given);
        True when this call deleted it."""
        op = {"key": _b64(self._key(key))}
        if expected_mod_revision is None:
            return _int(self._post("/kv/deleterange", op), "deleted", self.address, default=0) > 0
        ok, replies = self._txn(key, expected_mod_revision, [{"request_delete_range": op}])
        deleted = replies[0].get("response_delete_range") if ok and replies else None
        return ok and _int(deleted, "deleted", self.address, default=0) > 0

    def watch(
        self,
        prefix: str,
        on_change: Callable[[], None],
        *,
        interval_s: float = 0.05,
        revision: int | None = None,
        on_error: Callable[[Exception], None] | None = None,
        slow_interval_s: float = SAFETY_POLL_S,
    ) -> Watch:
        """Call ``on_change()`` from a thread whenever a key starting with ``prefix`` changes.

        Every change made after this returns is reported; to also see those made since the
        state it guards was read, pass the ``revision`` of that read (:meth:`get_prefix`
        returns it). Polls every ``interval_s`` while etcd's watch stream is not up, every
        ``slow_interval_s`` while it is. See :class:`Watch`.

        Raises:
            EtcdUnavailable: etcd cannot be reached to take the first reading.
        """
        start = self._key(prefix, allow_empty=True)
        reader = Etcd(self.address, prefix=self.prefix, timeout_s=self.timeout_s, tls=self.tls,
                      near=self.near)  # fmt: skip
        handle = Watch(
            reader, start, _after(start), on_change, interval_s, revision, on_error,
            slow_interval_s, near_return=(
                member_choice.NEAR_RETURN_S, member_choice.NEAR_PROBE_S,
                member_choice.NEAR_BACKOFF_MAX,
            ),  # read where _post reads them: one setting for the polls and the client
        )  # fmt: skip
        self._watches.append(handle)
        return handle

    def close(self) -> None:
        """Cancel this client's watches and close its connections, those of asks a hedged
        request left open too: such an ask (a member on a cut host holding it) is abandoned,
        not waited for, its connection cut so that its read ends at once
        (:mod:`~hogwild_plugins.ps.etcd_session`). A request another thread has in flight is
        not cut: it ends as it would have (its connection closed when it returns), asking
        nothing more (a request asked of a closed client raises
        :class:`~hogwild.errors.HogwildError`), and its asks left open are cut as it ends."""
        for handle in self._watches:
            handle.cancel()
        self._watches.clear()
        from hogwild_plugins.ps.etcd_session import cut_asks

        abandoned = self._hedges.close()  # a request ending from now on cuts its own asks
        # daemon threads, each failing as its connection is cut below
        failed: Exception | None = None
        for client in self._clients:  # every session closed, whichever fails to
            try:
                cut_asks(client.session, abandoned)  # another thread's request is left to end
                client.session.close()
            except Exception as err:  # noqa: BLE001 - raised once the others are closed
                failed = failed or err
        if failed is not None:
            raise HogwildError(
                f"etcd at {self.address}: closing a session failed: {failed}"
            ) from failed

    def __enter__(self) -> Etcd:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------------------

    def _key(self, key: str, allow_empty: bool = False) -> bytes:
        if not isinstance(key, str) or not (key or allow_empty):
            raise HogwildError(f"etcd key {key!r}: expected a non-empty string")
        return (self.prefix + key).encode()

    def _put_op(self, key: str, value: dict, lease: int | None = None) -> dict:
        full = self._key(key)
        try:
            if not isinstance(value, dict):
                raise TypeError(f"a {type(value).__name__}")
            text = json.dumps(value, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as err:
            raise HogwildError(
                f"etcd key {full.decode()!r}: value is not a JSON object ({err})"
            ) from err
        op = {"key": _b64(full), "value": _b64(text.encode())}
        if lease is not None:
            op["lease"] = lease
        return op

    def _txn(
        self, key: str, mod_revision: int, ops: list[dict], guard: tuple[str, dict] | None = None
    ) -> tuple[bool, list[dict]]:
        compare = {"key": _b64(self._key(key)), "result": "EQUAL", "target": "MOD"}
        compare["mod_revision"] = mod_revision
        compares = [compare]
        if guard is not None:  # the value compared byte for byte, as a put of it writes it
            put = self._put_op(*guard)
            compares.append(
                {"key": put["key"], "result": "EQUAL", "target": "VALUE", "value": put["value"]}
            )
        puts = [op.get("request_put") for op in ops]
        if self.write_retry_s is not None and all(puts):  # lost proposals read back, re-asked
            from hogwild_plugins.ps.etcd_cas import swap

            return swap(self, compares, puts, mod_revision), []
        reply = self._post("/kv/txn", {"compare": compares, "success": ops, "failure": []})
        return reply.get("succeeded") is True, reply.get("responses") or []

    def _kvs(self, reply: dict) -> list:
        kvs = reply.get("kvs", [])
        if not isinstance(kvs, list) or not all(isinstance(kv, dict) for kv in kvs):
            raise HogwildError(f"etcd at {self.address}: malformed reply {reply!r:.200}")
        return kvs

    def _relative(self, kv: dict) -> str:
        try:
            full = base64.b64decode(kv["key"], validate=True).decode()
        except (KeyError, TypeError, binascii.Error, ValueError):
            raise HogwildError(f"etcd at {self.address}: malformed key in {kv!r:.200}") from None
        if not full.startswith(self.prefix):
            raise HogwildError(f"etcd at {self.address}: key {full!r} is not below {self.prefix!r}")
        return full[len(self.prefix) :]

    def _value(self, kv: dict) -> dict:
        key = self.prefix + self._relative(kv)
        try:
            value = json.loads(base64.b64decode(kv.get("value", ""), validate=True))
        except (TypeError, binascii.Error, ValueError) as err:
            raise HogwildError(f"etcd key {key!r}: value is not JSON ({err})") from err
        if not isinstance(value, dict):
            kind = type(value).__name__
            raise HogwildError(f"etcd key {key!r}: value is a {kind}, not a JSON object")
        return value
