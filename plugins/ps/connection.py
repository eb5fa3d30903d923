"""A client's connection to every parameter server of a job: handshake, routing and exchange.

:class:`Connection` asks each server for its layout (``HELLO``) and checks that they agree with
each other and with the order the client lists them in (with replicated servers, the first that
answers: some may be down). It knows where each shard's requests go (the layout's map, or, when
the servers keep copies, each bucket's primary as etcd names it: :class:`~.routes.Routes`), and
exchanges a batch of requests with the servers (:meth:`Connection.run`: pipelined, at most
``window`` in flight per server, awaited together), keeping the latest version seen of every
shard and counting pushes refused as too stale.

With replicated servers, a request that was not taken (refused as not served there, or not
answered at all) is re-routed as :class:`~hogwild_plugins.ps.routing.Rerouting` decides; this
module only carries its actions out (reads etcd, pings, waits, sends again).

One thread at a time uses a connection.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import numpy as np
from hogwild_plugins.ps.etcd import EtcdUnavailable
from hogwild_plugins.ps.layout import LayoutError, ShardLayout
from hogwild_plugins.ps.routes import Routes
from hogwild_plugins.ps.routing import (
    FAILOVER_TIMEOUT_S,
    PING_TIMEOUT_S,
    AwaitMap,
    Exhausted,
    MapRead,
    MapSettled,
    Outcome,
    Pause,
    Ping,
    Pinged,
    ReadMap,
    Rerouting,
    Resend,
    Unfinished,
    Waiting,
    reply_outcome,
)

from hogwild.errors import HogwildError, StoppedError
from hogwild.net.channel import Cancelled, Peers, PeerUnreachableError, ProtocolError, Request
from hogwild.net.wire import ErrorCode, Header, MsgType, job_id

__all__ = ["Connection", "PSRequestError", "PSStoppedError"]

MAX_JSON_BYTES = 4 << 20


class PSRequestError(HogwildError):
    """A server refused a request (the message is the server's, with its address)."""

    def __init__(self, address: str, code: int, message: str) -> None:
        name = ErrorCode(code).name if code in ErrorCode._value2member_map_ else str(code)
        super().__init__(f"parameter server {address}: {name}: {message}")
        self.address, self.code = address, code


class PSStoppedError(PSRequestError, StoppedError):
    """A server refused a request ``STOPPED``: the request's bucket is stopped there (a write it
    acknowledged failed to apply). With one copy nothing else serves the bucket; with copies the
    request goes to the bucket's next primary, and this is raised only when none took the bucket
    over within the failover wait. The replica stops, and its driver stops the job rather than
    restart it."""


PER_SHARD_RUN = 128
"""Most requests for one shard in one exchange: half the servers' request window per client
(``ShardLog.window``, 256), so a request held back never has a window's worth of later ones of
its shard applied before it."""


def parts_per_shard(requests: list[Request], most: int) -> list[list[Request]]:
    """``requests`` in order, cut into consecutive parts of at most ``most`` for any shard (a
    request's shard is its header's ``target``)."""
    parts: list[list[Request]] = [[]]
    counts: dict[int, int] = {}
    for request in requests:
        shard = request.header.target
        if counts.get(shard, 0) == most:
            parts.append([])
            counts = {}
        counts[shard] = counts.get(shard, 0) + 1
        parts[-1].append(request)
    return [part for part in parts if part]


class Connection:
    """Requests to every parameter server of a job (see the module docstring).

    Args:
        servers: Every server of the job, ``HOST:PORT``, in the job's order.
        job: The job's name (the servers must serve the same one).
        client_id: This client's id (distinct per replica and worker).
        timeout_s, retries: Per request: seconds before it is sent again, and how many times.
        keys: CURVE key directory (servers beyond loopback).
        window: Requests in flight per server.
        etcd: ``HOST:PORT`` of the job's etcd when the servers keep copies (``copies > 1``).
        etcd_tls: With ``etcd``: its certificates' directory (``cluster.etcd_tls``).
        failover_s: With ``etcd``: how long a request may wait for its bucket to have a primary.
        token: The fencing token every request carries (:mod:`hogwild.net.fencing`; a cluster
            replica's, 0 for any other client): a server refuses it once the driver replaced
            that incarnation of the replica (``REPLACED``).
        etcd_group: With ``etcd``: the server group whose bucket map routes (None: the job's).

    Attributes:
        peers: The sockets (one per server), numbering the requests.
        routes: With ``etcd``: the bucket map as etcd has it (None: the layout's map).
        layout: Shards, buckets and the map (from the servers, checked against each other).
        versions: uint64 [n_shards]: the latest version seen of every shard.
        refused: Pushes refused as too stale, in total.

    Raises:
        PeerUnreachableError: A server did not answer. LayoutError: the servers disagree.
    """

    def __init__(
        self,
        servers: Sequence[str],
        job: str,
        *,
        client_id: int,
        timeout_s: float = 5.0,
        retries: int = 3,
        keys: str | None = None,
        window: int = 64,
        etcd: str | None = None,
        etcd_tls: str | None = None,
        failover_s: float = 30.0,
        token: int = 0,
        etcd_group: int | None = None,
    ) -> None:
        self.job, self.job_id = job, job_id(job)
        self.token = token
        self.routes: Routes | None = None
        self.failover_s = failover_s
        self.keys = keys
        self._pinger: Peers | None = None  # replicated: is a silent primary alive?
        if etcd:  # a dead primary must be given up on well within a failover
            timeout_s, retries = min(timeout_s, FAILOVER_TIMEOUT_S), min(retries, 1)
        self.peers = Peers(
            list(servers),
            sender=client_id,
            timeout_s=timeout_s,
            retries=retries,
            keys=keys,
            window=window,
        )
        try:
            self.layout = self._hello_any() if etcd else self._hello()
            if etcd:
                self.routes = Routes(
                    etcd, job, len(servers), self.layout.n_buckets, etcd_tls, etcd_group
                )
                self.routes.wait(range(self.layout.n_buckets), time.monotonic() + failover_s)
        except BaseException:
            self.close()
            raise
        self.versions = np.zeros(self.layout.n_shards, np.uint64)
        self.refused = 0

    # ------------------------------------------------------------------ handshake

    def _hello(self) -> ShardLayout:
        layouts = []
        for i, address in enumerate(self.peers.addresses):
            data = self.json(i, MsgType.HELLO)
            where = f"parameter server {address}"
            layout = ShardLayout.from_description(data.get("layout"), where)
            if data.get("server") != i:
                raise LayoutError(
                    f"{where} says it is server {data.get('server')} of job {self.job!r}, but is "
                    f"listed as server {i}: list the servers in the job's order"
                )
            if len(layout.servers) != len(self.peers.addresses):
                raise LayoutError(
                    f"{where} serves a job of {len(layout.servers)} servers, "
                    f"{len(self.peers.addresses)} are listed here"
                )
            layouts.append(layout)
        for i, layout in enumerate(layouts[1:], 1):
            if layout.describe() | {"servers": []} != layouts[0].describe() | {"servers": []}:
                raise LayoutError(
                    f"parameter servers {self.peers.addresses[0]} and {self.peers.addresses[i]} "
                    "disagree about the layout (parameters, shards, buckets or map)"
                )
        return layouts[0]

    def _hello_any(self) -> ShardLayout:
        """Replicated servers: the layout of the first server that answers (some may be down)."""
        problems = []
        for i, address in enumerate(self.peers.addresses):
            try:
                data = self.json(i, MsgType.HELLO)
            except (PeerUnreachableError, PSRequestError, ProtocolError) as exc:
                problems.append(str(exc))
                continue
            layout = ShardLayout.from_description(data.get("layout"), f"parameter server {address}")
            if len(layout.servers) != len(self.peers.addresses):
                raise LayoutError(
                    f"parameter server {address} serves a job of {len(layout.servers)} servers, "
                    f"{len(self.peers.addresses)} are listed here"
                )
            return layout
        raise PeerUnreachableError(
            str(self.peers.addresses[0]), f"no parameter server answered: {problems}"
        )

    def header(self, kind: MsgType, **fields) -> Header:
        """A request's header: every one is made here, so what names this client's job to the
        servers is filled in one place."""
        return Header(kind, job=self.job_id, lease=self.token, **fields)

    @property
    def replicated(self) -> bool:
        """The servers keep copies: requests go to each bucket's primary as etcd names it."""
        return self.routes is not None

    def server_of(self, shard: int) -> int:
        """The server a request for ``shard`` goes to now."""
        bucket = self.layout.bucket_of(shard)
        return (
            self.layout.server_of(shard) if self.routes is None else self.routes.server_of(bucket)
        )

    def json(self, server: int, kind: MsgType) -> dict:
        """A JSON request (HELLO, STATUS) to ``server``: its reply, checked."""
        header, frames = self.peers.request(server, self.header(kind))
        self.raise_error(server, header, frames)
        if header.type != MsgType.JSON or len(frames) != 1:
            raise ProtocolError(f"server {self.peers.addresses[server]}: no JSON reply to {kind}")
        raw = memoryview(frames[0])
        if raw.nbytes > MAX_JSON_BYTES:
            raise ProtocolError(f"server {self.peers.addresses[server]}: a JSON reply over 4 MiB")
        try:
            data = json.loads(bytes(raw))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise ProtocolError(f"server {self.peers.addresses[server]}: bad JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ProtocolError(f"server {self.peers.addresses[server]}: JSON is not an object")
        return data

    def raise_error(self, server: int, header: Header, frames: list) -> None:
        """Raise :class:`PSRequestError` if ``header`` is an ERROR reply from ``server``
        (:class:`PSStoppedError` for ``STOPPED``)."""
        if header.type == MsgType.ERROR:
            text = bytes(memoryview(frames[0])).decode("utf-8", "replace") if frames else ""
            error = PSStoppedError if header.code == ErrorCode.STOPPED else PSRequestError
            raise error(str(self.peers.addresses[server]), header.code, text)

    # ------------------------------------------------------------------ exchange

    def run(self, requests: list[Request]) -> None:
        """Exchange ``requests`` in parts of at most :data:`PER_SHARD_RUN` requests for any one
        shard, each part done before the next is sent (:meth:`_run`).

        A server answers a request of this client older than the last ``window`` (256) it
        applied for the shard as a late copy, already seen (:meth:`ShardLog.seen`), never
        applying it. One request held back (re-routed after ``NOT_PRIMARY``, paused after
        ``BUSY``) while more than that many later ones of its shard were applied would be
        acknowledged unapplied: a part holds fewer.
        """
        for part in parts_per_shard(requests, PER_SHARD_RUN):
            self._run(part)

    def _run(self, requests: list[Request]) -> None:
        """Exchange ``requests``; count refusals, track versions, raise the first error.

        With replicated servers, a request its server could not take (``NOT_PRIMARY``, or no
        answer at all) goes again, with its number, to its bucket's primary as etcd names it
        once the map moved on (or a lease's time passed), until :attr:`failover_s` runs out
        (the decisions are :class:`~hogwild_plugins.ps.routing.Rerouting`'s).
        """
        errors: list[tuple[int, Header, list]] = []
        done = [False] * len(requests)
        refused: set[int] = set()  # indices answered NOT_PRIMARY (the server lives)
        held: set[int] = set()  # of them, answered READS_WAITING (its primary, reads not open)
        stopped: dict[int, tuple[int, Header, list]] = {}  # index -> its last refusal, STOPPED
        replicated = self.replicated

        def wrap(i: int, req: Request):
            then = req.on_reply

            def on_reply(header: Header, frames: list) -> None:
                outcome = reply_outcome(header.type, header.code, replicated)
                if outcome == Outcome.RE_ROUTE:
                    refused.add(i)
                    if header.code == ErrorCode.READS_WAITING:
                        held.add(i)
                    if header.code == ErrorCode.STOPPED:
                        stopped[i] = (req.server, header, frames)
                    else:
                        stopped.pop(i, None)
                    return  # not done: sent again to the bucket's next primary
                done[i] = True
                if outcome == Outcome.STALE:
                    self.refused += 1
                elif outcome == Outcome.ERROR:
                    errors.append((req.server, header, frames))
                else:
                    shard = req.header.target
                    if header.version > self.versions[shard]:
                        self.versions[shard] = header.version
                    if then is not None:
                        then(header, frames)

            return on_reply

        for i, req in enumerate(requests):
            req.on_reply = wrap(i, req)
        rerouting = None
        deadline = time.monotonic() + self.failover_s  # from the first send, as before the split
        todo = requests
        while True:
            try:
                self.peers.exchange(todo)
            except PeerUnreachableError:
                if not replicated:
                    raise
            if all(done):
                break
            if rerouting is None:
                rerouting = Rerouting(deadline)
            waiting = tuple(
                Waiting(
                    i, self.layout.bucket_of(req.header.target), req.server, i in refused, i in held
                )
                for i, req in enumerate(requests)
                if not done[i]
            )
            for i in [i for i in stopped if i not in refused]:
                del stopped[i]  # not refused STOPPED this round (unanswered, say): not why
            refused.clear()
            held.clear()
            try:
                todo = self._re_route(rerouting, requests, waiting)
            except PeerUnreachableError as exc:
                # a request still refused STOPPED: its server holds the bucket stopped and no
                # other took it over in time (it had no caught-up copy): that is why, not a
                # server gone
                last = [stopped[w.request] for w in waiting if w.request in stopped]
                if not last:
                    raise
                server, header, frames = last[0]
                text = bytes(memoryview(frames[0])).decode("utf-8", "replace") if frames else ""
                raise PSStoppedError(
                    str(self.peers.addresses[server]),
                    header.code,
                    f"{text} (no other server took the bucket over within {self.failover_s:g} s)",
                ) from exc
        if errors:
            server, header, frames = errors[0]
            self.raise_error(server, header, frames)

    def _re_route(
        self, rerouting: Rerouting, requests: list[Request], waiting: tuple[Waiting, ...]
    ) -> list[Request]:
        """Carry out ``rerouting``'s actions for the ``waiting`` requests until it re-sends
        them (returned, pointed at their buckets' primaries) or gives up (raised)."""
        routes, round_ = self.routes, rerouting.rounds + 1  # stimulus ids name their round
        stimuli = [Unfinished(f"unfinished-{round_}", waiting, time.monotonic())]
        while stimuli:
            for action in rerouting.handle(stimuli.pop(0)):
                if self.cancelled:
                    raise Cancelled("re-routing to the parameter servers' primaries: cancelled")
                if isinstance(action, ReadMap):
                    try:
                        routes.read()
                    except EtcdUnavailable:
                        pass  # the wait reads again, until the deadline
                    stimuli.append(
                        MapRead(
                            f"map-read-{round_}", routes.primaries, routes.epochs, routes.lease_s
                        )
                    )
                elif isinstance(action, Ping):
                    alive = self._answers(action.server)
                    stimuli.append(Pinged(f"ping-{round_}-{action.server}", action.server, alive))
                elif isinstance(action, Pause):
                    time.sleep(action.seconds)
                elif isinstance(action, AwaitMap):
                    routes.wait(
                        action.buckets, action.deadline, action.away, lambda: self.cancelled
                    )
                    stimuli.append(
                        MapSettled(f"settled-{round_}", routes.primaries, time.monotonic())
                    )
                elif isinstance(action, Exhausted):
                    raise PeerUnreachableError(
                        str(self.peers.addresses[action.server]),
                        f"requests to buckets {sorted(action.buckets)} found no serving "
                        f"primary within {self.failover_s:g} s",
                    )
                elif isinstance(action, Resend):
                    todo = []
                    for i, server in action.servers.items():
                        req = requests[i]
                        req.server = server
                        req.attempts, req.sent_at, req.first_sent = 0, 0.0, 0.0
                        todo.append(req)
                    return todo
        raise AssertionError("re-routing ended without re-sending or giving up")

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called (its sockets' flag says)."""
        return self.peers.cancelled

    def cancel(self) -> None:
        """End the request in progress (waits on servers, on pings and on the map alike) with
        :class:`~hogwild.net.channel.Cancelled`: the only call another thread may make (the
        client's owner is stopping and no longer wants the replies)."""
        self.peers.cancel()
        pinger = self._pinger
        if pinger is not None:
            pinger.cancel()

    def _answers(self, server: int) -> bool:
        """Whether ``server`` answers a ping within :data:`PING_TIMEOUT_S` (replicated)."""
        if self._pinger is None:
            self._pinger = Peers(
                [str(a) for a in self.peers.addresses],
                sender=self.peers.sender,
                timeout_s=PING_TIMEOUT_S,
                retries=0,
                keys=self.keys,
            )
            if self.cancelled:  # a cancel that came while it was made
                self._pinger.cancel()
        try:
            header, _ = self._pinger.request(server, self.header(MsgType.PING))
        except PeerUnreachableError:
            return False
        return header.type == MsgType.ACK

    def status(self) -> list[dict]:
        """Every server's counters (see ``hogwild ps status``). With replicated servers, those
        that answer (one that is down, or being replaced, is left out)."""
        if self.routes is None:
            return [self.json(i, MsgType.STATUS) for i in range(len(self.peers.addresses))]
        found = []
        try:
            self.routes.read()
            members = self.routes.members
        except HogwildError:
            members = set(range(len(self.peers.addresses)))
        for i in range(len(self.peers.addresses)):
            if i not in members:
                continue  # down (or not yet registered): not waited for
            try:
                found.append(self.json(i, MsgType.STATUS))
            except (PeerUnreachableError, PSRequestError, ProtocolError):
                continue
        return found

    def close(self) -> None:
        self.peers.close()
        if self._pinger is not None:
            self._pinger.close()
        if self.routes is not None:
            self.routes.close()
