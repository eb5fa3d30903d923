"""A replica's (or a worker's, or a coordinator's) parameter-server API: push, pull, assign.

:class:`PSClient` cuts every request by the job's layout: a push or pull of a range becomes one
message per shard piece, all of them sent at once through its
:class:`~hogwild_plugins.ps.connection.Connection` (which knows where each goes, and re-routes
with replicated servers) and awaited together. Arrays go out without copies (the caller's
buffer must not change until the call returns, which it does only once every server
acknowledged); pulled shards are received straight into the caller's buffer.

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

One thread at a time uses a client.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from hogwild_plugins.ps.checks import NAME, PARAMS
from hogwild_plugins.ps.connection import Connection
from hogwild_plugins.ps.vector_ops import OP_OPERANDS, VECTOR_OPS

from hogwild.errors import HogwildError
from hogwild.net.channel import ProtocolError, Request
from hogwild.net.pinned import PinnedFrames
from hogwild.net.wire import NO_BASIS, DType, Header, MsgType

__all__ = ["PSClient"]


class PSClient:
    """One client of every parameter server of a job.

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
        etcd_tls: With ``etcd``: its certificates' directory (``cluster.etcd_tls``).
        failover_s: With ``etcd``: how long a request may wait for its bucket to have a primary.
        token: A cluster replica's fencing token (:mod:`hogwild.net.fencing`), on every request.
        etcd_group: With ``etcd``: the server group whose bucket map routes (a job of several
            server groups, each keeping its map in a namespace of its own); None: the job's.

    Attributes:
        layout: Shards, buckets and the map (from the servers, checked against each other).
        versions: uint64 [n_shards]: the latest version seen of every shard.
        refused: Pushes refused as too stale, in total.

    Raises:
        PeerUnreachableError: A server did not answer. LayoutError: the servers disagree.
        PSRequestError: A server refused a request (from any method).
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
        self.connection = Connection(
            servers,
            job,
            client_id=client_id,
            timeout_s=timeout_s,
            retries=retries,
            keys=keys,
            window=window,
            etcd=etcd,
            etcd_tls=etcd_tls,
            failover_s=failover_s,
            token=token,
            etcd_group=etcd_group,
        )
        self.job, self.job_id = job, self.connection.job_id
        self.layout = self.connection.layout
        self.pinned = PinnedFrames()  # buffers whose ranges go out as long-lived frames

    @property
    def versions(self) -> np.ndarray:
        """uint64 [n_shards]: the latest version seen of every shard."""
        return self.connection.versions

    @property
    def refused(self) -> int:
        """Pushes refused as too stale, in total."""
        return self.connection.refused

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
            header = self.connection.header(
                kind,
                sender=self.connection.peers.sender,
                target=shard,
                seq=self.connection.peers.next_seq(),
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
            out.append(Request(self.connection.server_of(shard), header, frames))
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
        self.connection.run(self._pieces(MsgType.PUSH_DELTAS, delta, basis, ranges, name))
        return self.versions.copy()

    def assign(
        self, values: np.ndarray, ranges: Sequence[tuple[int, int]] | None = None
    ) -> np.ndarray:  # noqa: E501
        """Overwrite the parameters in ``ranges`` (default: all) with ``values`` (a restore)."""
        self._check_vector(values, "values")
        self.connection.run(self._pieces(MsgType.ASSIGN, values, None, ranges))
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
            header = self.connection.header(
                MsgType.PUSH_VECTORS,
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
            requests.append(Request(self.connection.server_of(shard), header, [a, et]))
        self.connection.run(requests)
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
        self.connection.run(requests)
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
        if self.connection.replicated:
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
        self.connection.run(pushes + pulls)
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

            header = self.connection.header(MsgType.PULL, target=shard)
            requests.append(
                Request(self.connection.server_of(shard), header, on_reply=check, sink=sink)
            )
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
            header = self.connection.header(
                MsgType.VECTOR_OP,
                target=shard,
                code=code,
                a=float(alpha),
                dtype=DType.UINT8,
                shape=(len(text),),
                frames=1,
            )

            def store(h: Header, frames: list, i=i) -> None:
                results[i] = h.a

            requests.append(Request(self.connection.server_of(shard), header, [text], store))
        self.connection.run(requests)
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
        return self.connection.status()

    def cancel(self) -> None:
        """End the request another thread has in progress with
        :class:`~hogwild.net.channel.Cancelled` (and refuse every later one): the one call made
        from another thread, when the client's owner stops. :meth:`close` still follows."""
        self.connection.cancel()

    def close(self) -> None:
        self.pinned.clear()
        self.connection.close()

    def __enter__(self) -> PSClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
