"""A replica's (or a worker's, or a coordinator's) connection to every parameter server of a job.

:class:`PSClient` asks each server for its layout (``HELLO``), checks that they agree with each
other and with the order the client lists them in, and routes every request by the bucket map:
a push or pull of a range is cut into one message per shard piece, all of them sent at once
(pipelined, at most ``window`` in flight per server) and awaited together. Arrays go out without
copies (the caller's buffer must not change until the call returns, which it does only once every
server acknowledged); pulled shards are received straight into the caller's buffer.

Two update APIs (Adam 3.2.6): :meth:`PSClient.push_deltas` (accumulated weight deltas of any
ranges) and :meth:`PSClient.push_vectors` (a fully connected layer's k activation and k error
vectors, from which each server forms and applies the update of its rows: k(M+N) floats on the
wire instead of MN). Both return the shards' versions; a push refused as too stale
(``ps.max_staleness``) is counted in :attr:`PSClient.refused`, not raised (a replica goes on).
``push_deltas(..., into=name)`` adds the delta to a named vector instead (``y += d``: no rule,
no version, no staleness; a second frame carries the name).

:meth:`PSClient.vector_op` runs one operation on every shard at once on named vectors that
live beside the parameters (``"params"`` names the parameters themselves) and returns the
shards' partial results; the vocabulary built on it (``dot``, ``axpy``, ... with the reductions
combined) is Sandblaster's :class:`~hogwild_plugins.ps.sandblaster.vectors.ShardVectors`.

With replicated servers, what to do with a request that was not taken (ask etcd, ping, wait,
send again) is decided by :class:`~hogwild_plugins.ps.routing.Rerouting`; this module carries
its actions out.

One thread at a time uses a client.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import numpy as np
from hogwild_plugins.ps.checks import NAME, PARAMS
from hogwild_plugins.ps.etcd import EtcdUnavailable
from hogwild_plugins.ps.kernels import OP_OPERANDS, VECTOR_OPS
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

from hogwild.errors import HogwildError
from hogwild.net.channel import Peers, PeerUnreachableError, ProtocolError, Request
from hogwild.net.pinned import PinnedFrames
from hogwild.net.wire import NO_BASIS, DType, ErrorCode, Header, MsgType, job_id

__all__ = ["PSClient", "PSRequestError"]

MAX_JSON_BYTES = 4 << 20


class PSRequestError(HogwildError):
    """A server refused a request (the message is the server's, with its address)."""

    def __init__(self, address: str, code: int, message: str) -> None:
        name = ErrorCode(code).name if code in ErrorCode._value2member_map_ else str(code)
        super().__init__(f"parameter server {address}: {name}: {message}")
        self.address, self.code = address, code


class PSClient:
    """One client's connection to every parameter server of a job.

    Args:
        servers: Every server of the job, ``HOST:PORT``, in the job's order.
        job: The job's name (the servers must serve the same one).
        client_id: This client's id (distinct per replica and worker).
        timeout_s, retries: Per request: seconds before it is sent again, and how many times.
        keys: CURVE key directory (servers beyond loopback).
        window: Requests in flight per server.
        etcd: ``HOST:PORT`` of the job's etcd when the servers keep copies (``copies > 1``):
            requests go to each bucket's primary as etcd names it, and one that fails (the
            primary died or stepped down) is sent again, with the same number, to the next.
        failover_s: With ``etcd``: how long a request may wait for its bucket to have a primary.

    Attributes:
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
        failover_s: float = 30.0,
    ) -> None:
        self.job, self.job_id = job, job_id(job)
        self.routes: Routes | None = None
        self.failover_s = failover_s
        self.keys = keys
        self._pinger: Peers | None = None  # replicated: is a silent primary alive?
        self.pinned = PinnedFrames()  # buffers whose ranges go out as long-lived frames
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
                self.routes = Routes(etcd, job, len(servers), self.layout.n_buckets)
                self.routes.wait(range(self.layout.n_buckets), time.monotonic() + failover_s)
        except BaseException:
            self.close()
            raise
        self.versions = np.zeros(self.layout.n_shards, np.uint64)
        self.refused = 0

    # ------------------------------------------------------------------ layout

    def _hello(self) -> ShardLayout:
        layouts = []
        for i, address in enumerate(self.peers.addresses):
            data = self._json(i, MsgType.HELLO)
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
                data = self._json(i, MsgType.HELLO)
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

    def _server_of(self, shard: int) -> int:
        bucket = self.layout.bucket_of(shard)
        return (
            self.layout.server_of(shard) if self.routes is None else self.routes.server_of(bucket)
        )

    def _json(self, server: int, kind: MsgType) -> dict:
        header, frames = self.peers.request(server, Header(kind, job=self.job_id))
        self._raise_error(server, header, frames)
        if header.type != MsgType.JSON or len(frames) != 1:
            raise ProtocolError(f"server {self.peers.addresses[server]}: no JSON reply to {kind}")
        raw = memoryview(frames[0])
        if raw.nbytes > MAX_JSON_BYTES:
            raise ProtocolError(f"server {self.peers.addresses[server]}: a JSON reply over 4 MiB")
        try:
            data = json.loads(bytes(raw))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ProtocolError(f"server {self.peers.addresses[server]}: bad JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ProtocolError(f"server {self.peers.addresses[server]}: JSON is not an object")
        return data

    def _raise_error(self, server: int, header: Header, frames: list) -> None:
        if header.type == MsgType.ERROR:
            text = bytes(memoryview(frames[0])).decode("utf-8", "replace") if frames else ""
            raise PSRequestError(str(self.peers.addresses[server]), header.code, text)

    # ------------------------------------------------------------------ requests

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
        replicated = self.routes is not None

        def wrap(i: int, req: Request):
            then = req.on_reply

            def on_reply(header: Header, frames: list) -> None:
                outcome = reply_outcome(header.type, header.code, replicated)
                if outcome == Outcome.RE_ROUTE:
                    refused.add(i)
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
                rerouting = Rerouting(time.monotonic() + self.failover_s)
            waiting = tuple(
                Waiting(i, self.layout.bucket_of(req.header.target), req.server, i in refused)
                for i, req in enumerate(requests)
                if not done[i]
            )
            refused.clear()
            todo = self._re_route(rerouting, requests, waiting)
        if errors:
            server, header, frames = errors[0]
            self._raise_error(server, header, frames)

    def _re_route(
        self, rerouting: Rerouting, requests: list[Request], waiting: tuple[Waiting, ...]
    ) -> list[Request]:
        """Carry out ``rerouting``'s actions for the ``waiting`` requests until it re-sends
        them (returned, pointed at their buckets' primaries) or gives up (raised)."""
        routes = self.routes
        stimuli = [Unfinished(f"unfinished-{rerouting.rounds}", waiting, time.monotonic())]
        while stimuli:
            for action in rerouting.handle(stimuli.pop(0)):
                if isinstance(action, ReadMap):
                    try:
                        routes.read()
                    except EtcdUnavailable:
                        pass  # the wait reads again, until the deadline
                    stimuli.append(
                        MapRead("map-read", routes.primaries, routes.epochs, routes.lease_s)
                    )
                elif isinstance(action, Ping):
                    alive = self._answers(action.server)
                    stimuli.append(Pinged(f"ping-{action.server}", action.server, alive))
                elif isinstance(action, Pause):
                    time.sleep(action.seconds)
                elif isinstance(action, AwaitMap):
                    routes.wait(action.buckets, action.deadline, action.away)
                    stimuli.append(MapSettled("map-settled", routes.primaries, time.monotonic()))
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
        try:
            header, _ = self._pinger.request(server, Header(MsgType.PING, job=self.job_id))
        except PeerUnreachableError:
            return False
        return header.type == MsgType.ACK

    def _check_vector(self, array: np.ndarray, what: str) -> np.ndarray:
        if (
            not isinstance(array, np.ndarray)
            or array.dtype != np.float32
            or array.shape != (self.layout.n_params,)
            or not array.flags.c_contiguous
        ):
            raise HogwildError(
                f"{what} must be a contiguous float32 vector of {self.layout.n_params} "
                f"parameters, got {getattr(array, 'dtype', type(array))} "
                f"{getattr(array, 'shape', '')}"
            )
        return array

    def _pieces(
        self, kind: MsgType, array: np.ndarray, basis, ranges, name: bytes = b""
    ) -> list[Request]:
        out = []
        for shard, lo, hi in self.layout.cut(ranges):
            shard_lo = self.layout.shard_range(shard)[0]
            flags, version = (NO_BASIS, 0) if basis is None else (0, int(basis[shard]))
            header = Header(
                kind,
                job=self.job_id,
                sender=self.peers.sender,
                target=shard,
                seq=self.peers.next_seq(),
                version=version,
                flags=flags,
                offset=lo - shard_lo,
                shape=(hi - lo,),
                dtype=DType.FLOAT32,
                frames=2 if name else 1,
                aux=len(name),
            )
            piece = self.pinned.range(array, lo, hi)
            frames = [piece, name] if name else [piece]
            out.append(Request(self._server_of(shard), header, frames))
        return out

    def push_deltas(
        self,
        delta: np.ndarray,
        basis: np.ndarray | None = None,
        ranges: Sequence[tuple[int, int]] | None = None,
        into: str | None = None,
    ) -> np.ndarray:
        """Push ``delta[start:stop]`` for each range (default: all), cut by shard, pipelined.

        Args:
            delta: float32 [n_params], a replica's change (``copy - base``).
            basis: uint64 [n_shards]: the versions the delta was computed against (None: no
                staleness accounting).
            ranges: ``(start, stop)`` pairs of global offsets.
            into: A named vector to add the delta to (``y += delta``, on each shard's update
                thread in order with everything else) instead of the parameters: no rule, no
                version, no staleness (so no ``basis``); with replicated servers it is
                replicated like any write (and takes a version on each shard).

        Returns:
            uint64 [n_shards]: the latest versions (:attr:`versions`), once every server
            acknowledged (unchanged by a push ``into`` a vector, unless the servers keep copies).
        """
        self._check_vector(delta, "delta")
        name = b""
        if into is not None:
            if basis is not None:
                raise HogwildError(f"a push into vector {into!r} takes no basis (no version)")
            if not NAME.fullmatch(into) or into == PARAMS:
                raise HogwildError(
                    f"vector name {into!r}: 1-64 characters [A-Za-z0-9_.-], not 'params' (push "
                    "into the parameters without a name)"
                )
            name = into.encode("ascii")
        self._run(self._pieces(MsgType.PUSH_DELTAS, delta, basis, ranges, name))
        return self.versions.copy()

    def assign(
        self, values: np.ndarray, ranges: Sequence[tuple[int, int]] | None = None
    ) -> np.ndarray:  # noqa: E501
        """Overwrite the parameters in ``ranges`` (default: all) with ``values`` (a restore)."""
        self._check_vector(values, "values")
        self._run(self._pieces(MsgType.ASSIGN, values, None, ranges))
        return self.versions.copy()

    def push_vectors(
        self,
        layer: int,
        activations: np.ndarray,
        errors: np.ndarray,
        lr: float,
        basis: np.ndarray | None = None,
        decay: float = 0.0,
    ) -> np.ndarray:
        """API (b): the servers apply ``W += -lr * sum_i errors[i] (outer) activations[i]
        - decay * W`` (through their rule).

        Args:
            layer: Index of a fully connected layer in the model's layer list.
            activations: float32 [k, M] input activations.
            errors: float32 [k, N] output errors (dL/dz).
            lr: The replica's learning rate.
            basis: As for :meth:`push_deltas`.
            decay: The weight decay these updates carry (``lr * weight_decay`` per example,
                summed over the k): the fraction of ``W`` the replica would have removed.

        Returns:
            uint64 [n_shards]: the latest versions.
        """
        fc = self.layout.fc(layer)
        if fc is None:
            known = [f.layer for f in self.layout.fc_layers]
            raise HogwildError(f"layer {layer} is not a fully connected layer (those are {known})")
        a = np.ascontiguousarray(activations, np.float32)
        e = np.asarray(errors, np.float32)
        if a.ndim != 2 or e.ndim != 2 or a.shape != (e.shape[0], fc.n_in) or e.shape[1] != fc.n_out:
            raise HogwildError(
                f"layer {layer} needs activations [k, {fc.n_in}] and errors [k, {fc.n_out}], "
                f"got {a.shape} and {e.shape}"
            )
        requests = []
        for shard, lo, hi in self.layout.cut([(fc.offset, fc.offset + fc.size)]):
            r0, r1 = (lo - fc.offset) // fc.n_in, (hi - 1 - fc.offset) // fc.n_in + 1
            et = np.ascontiguousarray(e[:, r0:r1].T)
            flags, version = (NO_BASIS, 0) if basis is None else (0, int(basis[shard]))
            header = Header(
                MsgType.PUSH_VECTORS,
                job=self.job_id,
                target=shard,
                aux=layer,
                version=version,
                flags=flags,
                shape=(a.shape[0], fc.n_in, r1 - r0),
                dtype=DType.FLOAT32,
                frames=2,
                a=float(lr),
                b=float(decay),
            )
            requests.append(Request(self._server_of(shard), header, [a, et]))
        self._run(requests)
        return self.versions.copy()

    def pull(self, into: np.ndarray, shards: Sequence[int] | None = None) -> np.ndarray:
        """Write the current values of ``shards`` (default: all) into ``into``.

        Returns:
            uint64 [len(shards)]: the versions of the values written (each pull sees every
            push this client made before it).
        """
        self._check_vector(into, "into")
        wanted = list(range(self.layout.n_shards)) if shards is None else list(shards)
        requests, bad = self._pulls(into, wanted)
        self._run(requests)
        if bad:
            raise ProtocolError(f"pull: replies that do not fit: {bad[:3]}")
        return self.versions[wanted].copy()

    def push_and_pull(
        self,
        delta: np.ndarray,
        into: np.ndarray,
        basis: np.ndarray | None = None,
        ranges: Sequence[tuple[int, int]] | None = None,
    ) -> np.ndarray:
        """:meth:`push_deltas` of ``delta``, then :meth:`pull` of every shard into ``into``.

        With servers that keep one copy, the pulls go out right behind the pushes, in one
        exchange, without waiting for the acknowledgements: a server answers one client's
        requests in the order they came, and a pull of a shard with a write pending waits
        behind it, so each pull still sees the pushes before it, and a round trip is saved (a
        push refused as BUSY and sent again lands after its pull: that shard is read again).
        Replicated servers commit a push on every copy before applying it, so there the pull
        waits for the acknowledgements.

        Returns:
            uint64 [n_shards]: the versions of the values written.
        """
        if self.routes is not None:
            self.push_deltas(delta, basis=basis, ranges=ranges)
            return self.pull(into)
        self._check_vector(delta, "delta")
        self._check_vector(into, "into")
        wanted = list(range(self.layout.n_shards))
        pulled = np.zeros(len(wanted), np.uint64)  # the version of the values each pull read
        acked = np.zeros(len(wanted), np.uint64)  # the version each push made
        pulls, bad = self._pulls(into, wanted, pulled)
        pushes = self._pieces(MsgType.PUSH_DELTAS, delta, basis, ranges)
        for req in pushes:
            req.on_reply = lambda h, frames, s=req.header.target: acked.__setitem__(s, h.version)
        self._run(pushes + pulls)
        if bad:
            raise ProtocolError(f"pull: replies that do not fit: {bad[:3]}")
        # A push the server could not take at once (BUSY: its queues were full) was sent again
        # and applied after the pull behind it read the shard: read those shards again.
        behind = [s for s in wanted if acked[s] > pulled[s]]
        if behind:
            again = self.pull(into, shards=behind)
            pulled[behind] = again
        return pulled

    def _pulls(
        self, into: np.ndarray, wanted: list[int], versions: np.ndarray | None = None
    ) -> tuple[list[Request], list[str]]:
        """Requests that pull ``wanted`` shards straight into ``into`` (the version of the reply
        for ``wanted[n]`` into ``versions[n]``, if given), and the list naming the replies that
        do not fit."""
        requests: list[Request] = []
        bad: list[str] = []
        for n, shard in enumerate(wanted):
            if not 0 <= shard < self.layout.n_shards:
                raise HogwildError(f"shard {shard}: the job has {self.layout.n_shards} shards")
            lo, hi = self.layout.shard_range(shard)
            view = into[lo:hi]

            def sink(h: Header, view=view):
                return [view] if h.shape == (view.size,) and h.offset == 0 else None

            def check(h: Header, frames: list, view=view, shard=shard, n=n) -> None:
                if h.type == MsgType.DATA and (h.shape != (view.size,) or frames[0] is not view):
                    bad.append(f"shard {shard}: a reply of {h.shape} at offset {h.offset}")
                elif versions is not None:
                    versions[n] = h.version

            header = Header(MsgType.PULL, job=self.job_id, target=shard)
            requests.append(Request(self._server_of(shard), header, on_reply=check, sink=sink))
        return requests, bad

    # ------------------------------------------------------------------ vector operations

    def vector_op(
        self, op: str, *names: str, alpha: float = 0.0, shards: Sequence[int] | None = None
    ) -> np.ndarray:
        """Run ``op`` on named vectors on every shard (default: all); the per-shard results.

        Operations: ``dot(x, y)``, ``axpy(x, y)`` (y += alpha x), ``scale(x)`` (x *= alpha),
        ``copy(x, y)`` (y = x), ``mul(x, y, z)`` (z = x * y), ``fill(x)`` (x = alpha),
        ``asum(x)`` (sum |x_i|), ``amax(x)`` (max |x_i|). A vector is created (zeros) the first
        time it is named; ``"params"`` is the parameters (an operation that writes them is a new
        version of each shard).

        Returns:
            float64 [len(shards)]: each shard's result (the reductions' partial results: ``dot``
            and ``asum`` sums, ``amax`` maxima; 0 otherwise).
        """
        code = VECTOR_OPS.get(op)
        if code is None or len(names) != OP_OPERANDS[code]:
            raise HogwildError(
                f"vector operation {op!r} with {len(names)} names: expected one of "
                f"{ {k: OP_OPERANDS[v] for k, v in VECTOR_OPS.items()} } (name counts)"
            )
        text = ",".join(names).encode("ascii")
        wanted = list(range(self.layout.n_shards)) if shards is None else list(shards)
        results = np.zeros(len(wanted), np.float64)
        requests = []
        for i, shard in enumerate(wanted):
            header = Header(
                MsgType.VECTOR_OP,
                job=self.job_id,
                target=shard,
                code=code,
                a=float(alpha),
                dtype=DType.UINT8,
                shape=(len(text),),
                frames=1,
            )

            def store(h: Header, frames: list, i=i) -> None:
                results[i] = h.a

            requests.append(Request(self._server_of(shard), header, [text], store))
        self._run(requests)
        return results

    def pin(self, buffer: np.ndarray) -> None:
        """Keep ``buffer`` (an array that owns its memory, kept for the client's life, such as
        a replica's push buffer) and send its ranges as long-lived zero-copy frames: a push from
        it then costs no per-frame release through pyzmq's garbage-collector thread (see
        :mod:`hogwild.net.pinned`). Pushes from any other array work as before."""
        self.pinned.pin(buffer)

    # ------------------------------------------------------------------ control

    def status(self) -> list[dict]:
        """Every server's counters (see ``hogwild ps status``). With replicated servers, those
        that answer (one that is down, or being replaced, is left out)."""
        if self.routes is None:
            return [self._json(i, MsgType.STATUS) for i in range(len(self.peers.addresses))]
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
                found.append(self._json(i, MsgType.STATUS))
            except (PeerUnreachableError, PSRequestError, ProtocolError):
                continue
        return found

    def close(self) -> None:
        self.pinned.clear()
        self.peers.close()
        if self._pinger is not None:
            self._pinger.close()
        if self.routes is not None:
            self.routes.close()

    def __enter__(self) -> PSClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
