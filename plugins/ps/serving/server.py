"""Adam's parameter server (section 3.3): one process's shards, served over the transport.

A :class:`ParameterServer` holds the shards of its buckets (:mod:`~hogwild_plugins.ps.layout`),
a :class:`~hogwild.net.router.Router` (the network thread) whose handler it is, an
:class:`~hogwild_plugins.ps.engine.UpdateEngine` (update threads pinned to ``node``'s CPUs, the
shards first-touched there), the I/O-free :class:`~hogwild_plugins.ps.shard.ShardBook` (versions,
staleness, refusals: owned by the network thread), and optionally a
:class:`~hogwild_plugins.ps.storage.Flusher` writing to an LMDB store.

For each request the network thread checks it, reserves a work slot (none free: a ``BUSY``
reply, the client retries), admits it in the book (its version; too stale: a ``STALE`` reply,
counted; the checks and the admission are :mod:`~hogwild_plugins.ps.serving.requests`, which the
replication's copies use too) and queues it for the shard's update thread. With
``ack = "queued"`` (the default) the network thread acknowledges it right then, with the version
the book gave it; with ``ack = "applied"`` the update thread does, once it has applied it. The two
promise the same: the version is decided at admission, each shard's queue is applied in order
(so any pull sent after the acknowledgement arrived, from any client, sees the update), and
either way the update lives in the server's memory only until the next flush. "queued" takes
two thread wake-ups (to the update thread and back) off every push's round trip, which on a
small virtual machine cost as much as the transfer of a 1 MiB shard; "applied" reports a failure
to apply (a bug: ``INTERNAL``) to the client that sent the update, and is what replication
starts from. A push of deltas for a shard whose update thread is idle, with
nothing pending for the shard, is applied by the network thread itself (``direct_pushes``,
:meth:`~hogwild_plugins.ps.engine.UpdateEngine.claim_idle`): on a lightly loaded server that
takes the wake-up of the update thread off the push as well; under load pushes queue and are
batched. With ``ack = "queued"`` it is acknowledged as a queued push is, and applied while the
acknowledgement goes out (:attr:`hogwild.net.router.Reply.then`: before the thread takes its next
request, so a pull after it sees it), which takes the add off the client's round trip; with
"applied", once applied. A pull of a shard with no write pending is answered by the network
thread too (one copy of every shard: the network thread queues every write, so it can read the
shard itself; :meth:`~hogwild_plugins.ps.engine.UpdateEngine.read_now`). Every other request
(pings, ``HELLO``, ``STATUS``, the driver's fences, the replication messages between copies, and
who may send them) takes the control path, :mod:`~hogwild_plugins.ps.serving.control`.

A ``PUSH_DELTAS`` may name a vector beside the parameters (a second frame, the name, checked as
vector-operation names are: :func:`~hogwild_plugins.ps.checks.check_named_push`): the delta is
added to that vector (``y[offset:offset + n] += d``) on the shard's update thread, in order with
everything else queued for the shard, without the rule, a version or staleness accounting: it is
not a parameter update (Sandblaster's replicas sum their gradients this way).

With ``copies > 1`` every write goes through :mod:`~hogwild_plugins.ps.replication` (parameter
updates, assignments, pushes into named vectors and vector operations that write): each gets the
shard's next version, so the copies apply them in the primary's order. Pulls and the reductions
(``dot``, ``asum``, ``amax``) are answered by the serving primary alone, queued behind every
write it acknowledged.

Received arrays go into blocks of a private :class:`~hogwild.shm.pool.BufferPool` (``recv =
"pool"``, :mod:`~hogwild_plugins.ps.serving.receive_pool`: one copy, from ZeroMQ's message into a
block that is then in this core's cache when the update reads it) or are used in place (ZeroMQ's
message buffers, no copy: ``recv = "inplace"``). The default, ``"auto"``, takes pool blocks for a
server of one copy on two CPUs or more, and frames in place on one CPU (where ZeroMQ's I/O thread
and the update share a cache and the copy is pure cost) and with copies (whose primaries forward
the frames they received). ``bench/figures/adam_fig9_ps.py`` measures both; the README quotes them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial

import numpy as np
from hogwild_plugins.ps import kernels
from hogwild_plugins.ps.engine import UpdateEngine
from hogwild_plugins.ps.layout import ModelGeometry, ShardLayout
from hogwild_plugins.ps.serving.control import DATA_TYPES, PEER_TYPES, ServerControl
from hogwild_plugins.ps.serving.options import ServerOptions
from hogwild_plugins.ps.serving.receive_pool import ReceivePool, recv_mode
from hogwild_plugins.ps.serving.requests import Admission
from hogwild_plugins.ps.shard import ShardBook
from hogwild_plugins.ps.stops import BucketStops
from hogwild_plugins.ps.storage import Flusher, ShardStore
from hogwild_plugins.ps.work import (
    Kind,
    Shard,
    Work,
)

from hogwild.blas import limit_blas_threads
from hogwild.errors import HogwildError
from hogwild.locks import compile_lock
from hogwild.net.address import Address, check_bind, parse_address
from hogwild.net.fencing import ReplacedError
from hogwild.net.router import Incoming, Reply, Router, reply_hwm
from hogwild.net.wire import (
    MAX_ARRAY_BYTES,
    ErrorCode,
    Header,
    MsgType,
    WireError,
    frame_nbytes,
    job_id,
)
from hogwild.numa.pinning import bind_memory

__all__ = ["ParameterServer"]


class ParameterServer:
    """One parameter server (see the module docstring).

    Args:
        geometry: The model's parameter count and fully connected layers.
        options: How to serve.
        initial: The initial parameters (the whole flat vector; None: zeros), used for shards
            the store does not hold.

    Raises:
        HogwildError: Bad options (:meth:`ServerOptions.check`), a store that cannot be used, an
            address that cannot be bound.
    """

    dedup_types = DATA_TYPES | PEER_TYPES
    receives_into_buffers = False  # True in pool mode: the router receives frame by frame

    def __init__(
        self, geometry: ModelGeometry, options: ServerOptions, initial: np.ndarray | None = None
    ) -> None:
        options.check()
        self.options, self.geometry = options, geometry
        self.job = job_id(options.job)
        self.layout = ShardLayout.compute(
            geometry.n_params,
            options.shard_kib,
            options.buckets,
            options.servers,
            geometry.fc_layers,
        )
        self.rule = kernels.RULES[options.rule]
        self.max_vectors = options.max_vectors
        if options.copies > 1:  # a catch-up carries a shard's vectors in one frame
            per_frame = MAX_ARRAY_BYTES // (4 * self.layout.shard_floats)
            self.max_vectors = max(1, min(self.max_vectors, per_frame))
        self.address = parse_address(options.bind or options.servers[options.index])
        check_bind(self.address, options.keys)  # before anything is built
        self.store = None
        if options.store:
            self.store = ShardStore(
                options.store,
                job=options.job,
                n_params=geometry.n_params,
                shard_floats=self.layout.shard_floats,
                rule=options.rule,
            )
        try:
            self._build_shards(initial)
        except BaseException:
            self._close_store()
            raise
        self.admission = Admission(
            options.job,
            self.job,
            self.layout,
            geometry,
            self.book,
            options.max_staleness,
            replicated=options.copies > 1,
            nonfinite=options.nonfinite,
            shards=self.shards,
        )
        self.router: Router | None = None
        self.engine: UpdateEngine | None = None
        self.flusher: Flusher | None = None
        self.receive_pool: ReceivePool | None = None  # with recv = "pool"
        self.recv = options.recv  # "auto" is decided by start(), which knows the CPUs
        self.replication = None
        self.control = ServerControl(self)  # pings, status, hello, fences, replication messages
        # buckets whose acknowledged writes failed to apply here: refused (STOPPED) from then on
        self.stops = BucketStops(options.index, self._bucket_stopped)

    def _build_shards(self, initial: np.ndarray | None) -> None:
        mine = (
            list(range(self.layout.n_shards))  # replicated: any bucket may come here
            if self.options.copies > 1
            else self.layout.shards_of(self.options.index)
        )
        sizes = {s: self.layout.shard_size(s) for s in mine}
        states = kernels.STATE_ARRAYS[self.rule]
        stored = self.store.load(mine, sizes, states) if self.store else {}
        self.shards: list[Shard] = []
        self.local: dict[int, int] = {}
        self._recovered = {shard: record[0] for shard, record in stored.items()}
        for shard in mine:
            lo, hi = self.layout.shard_range(shard)
            values = np.empty(hi - lo, np.float32)  # untouched: the update thread touches it
            state = np.empty(hi - lo if states else 0, np.float32)
            if self.options.node is not None:
                bind_memory(values, self.options.node)
                if state.size:
                    bind_memory(state, self.options.node)
            version, init = 0, (None if initial is None else initial[lo:hi], None)
            if shard in stored:
                version, values0, state0 = stored[shard]
                init = (values0, state0 if states else None)
            self.local[shard] = len(self.shards)
            self.shards.append(
                Shard(
                    shard,
                    lo,
                    values,
                    state,
                    applied=version,
                    snapshotted=version,
                    initial=init,
                    max_vectors=self.max_vectors,
                    refuse_nonfinite=self.options.nonfinite == "refuse",
                )
            )
        self.book = ShardBook(
            {s.index: s.applied for s in self.shards},
            staleness_rule=self.rule == kernels.RULE_STALENESS,
            decay=self.options.staleness_decay,
            max_staleness=self.options.max_staleness,
        )

    # ------------------------------------------------------------------ lifecycle

    def start(
        self, cpus: set[int] | None = None, stopping: Callable[[], bool] = lambda: False
    ) -> Address:
        """Compile the kernels, start the update threads, the flusher and the network thread
        (and, with copies, the replication: ``stopping()`` says a stop was asked for while it
        asks etcd again at its start, which then raises ``StartStopped``).

        Returns:
            The address it listens on (with the real port when it was 0).

        Raises:
            StartStopped: ``stopping()`` while etcd was asked again (the server is stopped).
            EtcdUnavailable: etcd did not answer the start's asks within their bound.
        """
        # Servers starting together: the first compiles, the others load what it wrote. A lock
        # of their own: the engine's and the data kernels are other code, compiled meanwhile.
        with compile_lock(kernels="ps-kernels"):
            kernels.compile_kernels()
        limit_blas_threads(1)  # one BLAS thread per update thread (API b's sgemm)
        try:
            self.router = Router(self.address, self, keys=self.options.keys,
                                 reply_hwm=reply_hwm(4 * self.layout.shard_floats))  # fmt: skip
            usable = cpus or os.sched_getaffinity(0)
            threads = self.options.threads or len(usable)
            self.recv = self._recv_mode(len(usable))
            self.engine = UpdateEngine(
                self.shards,
                rule=self.rule,
                lr=self.options.lr,
                mu=self.options.momentum,
                eps=self.options.adagrad_eps,
                threads=threads,
                cpus=cpus,
                replier=self.router.replier,
                scratch_floats=max((fc.n_in for fc in self.geometry.fc_layers), default=0),
            )
            if self.recv == "pool":
                self.receive_pool = ReceivePool(self.layout.shard_floats)
                self.receives_into_buffers = True
            self.engine.on_failed_after_ack = self._failed_after_ack
            self.engine.start()
            if self.engine.failures:
                raise HogwildError(f"update threads failed to start: {self.engine.failures}")
            if self.store is not None:
                self.flusher = Flusher(
                    lambda full: self.engine.snapshot(full=full), self.store, self.options.flush_s
                )
                self.flusher.flushed_versions = dict(self._recovered)
                self.flusher.start()
            self.address = self.router.start()
            if self.options.copies > 1:
                from hogwild_plugins.ps.replication import Replication

                self.replication = Replication(
                    self,
                    self.options.etcd,
                    self.options.copies,
                    self.options.lease_s,
                    self.options.min_copies,
                )
                self.replication.start(stopping)
        except BaseException:
            self.stop(final_flush=False)
            raise
        return self.address

    def _recv_mode(self, cpus: int) -> str:
        """``options.recv`` with ``"auto"`` decided for ``cpus`` CPUs (:func:`recv_mode`)."""
        return recv_mode(self.options.recv, self.options.copies, cpus)

    def stop(self, final_flush: bool = True) -> bool:
        """Stop serving: the network thread, a final flush (after what is queued), the update
        threads. True if that flush succeeded (or there is no store)."""
        flushed = True
        if self.router is not None:
            self.router.stop()  # no new requests; what is queued is still applied
        if self.replication is not None:
            self.replication.stop()  # gives the lease back: the others take over at once
        if self.flusher is not None:
            flushed = self.flusher.stop(final=final_flush)  # behind the queued updates
            self.flusher = None
        if self.engine is not None:
            self.engine.stop()
        if self.router is not None:
            if self.engine is None or self.engine.stopped:
                self.router.close()  # ends the context: waits for the update threads' sockets
            self.router = None
        if self.receive_pool is not None:
            self.receive_pool.close()
            self.receive_pool = None
        self._close_store()
        return flushed

    def _close_store(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    def __enter__(self) -> ParameterServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ the handler

    def buffers(self, header: Header) -> list | None:
        """Blocks to receive ``header``'s frames into (None: in place; see
        :mod:`~hogwild_plugins.ps.serving.receive_pool`)."""
        if self.receive_pool is None or header.type not in (
            MsgType.PUSH_DELTAS,
            MsgType.ASSIGN,
            MsgType.PUSH_VECTORS,
        ):
            return None
        self.admission.check(header)
        return self.receive_pool.buffers(frame_nbytes(header))

    def release(self, buffers: list) -> None:
        if self.receive_pool is not None:
            self.receive_pool.release(buffers)

    def _free_later(self, frames: list):
        if self.receive_pool is None:
            return None
        return self.receive_pool.free_later(frames)

    def handle(self, request: Incoming) -> Reply | None:
        header = request.header
        if header.type not in DATA_TYPES:  # the data path first: it is nearly every request
            return self.control.handle(request)
        fences = self.control.fences  # the driver's, for replicas it replaced
        if header.lease and fences.fences:  # a replica's request, and replicas replaced
            try:
                fences.check(header.lease)
            except ReplacedError as exc:
                raise WireError(str(exc), ErrorCode.REPLACED) from None
        shard = self.admission.check(header)
        if self.stops.buckets:  # a failure after an acknowledgement stopped a bucket here
            self.stops.check(self.layout.bucket_of(shard), shard, header.type.name)
        local = self.local[shard]
        replication = self.replication
        if self.options.copies > 1:
            if replication is None or replication.stopped:  # starting, or stopping
                raise WireError(
                    f"server {self.options.index} is not serving (starting or stopping)",
                    ErrorCode.NOT_PRIMARY,
                )
            work = self.admission.work(header, shard, local, request.frames)
            if self.admission.writes(work):
                work.keep = request.frames
                replication.submit(header, shard, work, request.frames)
                return None  # the replication thread answers, once every copy committed
            if not replication.answers_reads(shard):  # a pull or a reduction: the primary
                raise replication.not_primary(header, shard, read=True)
        else:
            work = self.admission.work(header, shard, local, request.frames)
            if work.kind == Kind.PULL and self.options.direct_pulls:
                # this thread queues every write (one copy): read it now if none is pending
                now = self.engine.read_now(work)
                if now is not None:
                    return Reply(*now)
            elif work.kind == Kind.DELTAS and self.options.direct_pushes:
                claimed = self.engine.claim_idle(local)  # its thread is idle: apply it here
                if claimed is not None:
                    try:
                        self.admission.admit(header, shard, work)
                    except BaseException:
                        claimed.release()
                        raise
                    try:
                        work.free = self._free_later(request.frames)
                        work.keep = request.frames
                        apply = partial(self._apply_claimed, work, claimed)
                        reply = Reply(header.reply(MsgType.ACK, version=work.version))
                    except BaseException:
                        self.engine.forgo(work)  # its version was given out: counts aligned
                        claimed.release()
                        raise
                    if self.options.ack == "queued":  # taken, as a queued push is acknowledged:
                        reply.then = apply  # applied as the reply goes out, before any request
                        return reply  # this thread handles next (a pull sees it)
                    apply()
                    return reply
        slot = self.engine.reserve()
        if slot is None:
            raise WireError("the server's queues are full; retry", ErrorCode.BUSY)
        try:
            self.admission.admit(header, shard, work)
        except WireError:
            self.engine.unreserve(slot)
            raise
        work.free = self._free_later(request.frames)
        work.keep = request.frames
        ack_now = self.options.ack == "queued" and work.kind in (
            Kind.DELTAS,
            Kind.VECTORS,
            Kind.ASSIGN,
            Kind.INTO,
        )
        work.acked = ack_now
        self.engine.put(slot, work)
        return Reply(header.reply(MsgType.ACK, version=work.version)) if ack_now else None

    def _apply_claimed(self, work: Work, claimed) -> None:
        """Apply a push on this thread with its shard's thread claimed, then let that go (a
        failure is in the status's ``failures``; after an acknowledgement the router counts it
        INTERNAL)."""
        try:
            self.engine.apply_claimed(work)
        finally:
            claimed.release()

    def _failed_after_ack(self, shard: Shard, text: str) -> None:
        """The engine's report of a write that failed to apply after its acknowledgement (or,
        with copies, after its commit on the other copies): the shard's bucket stops here."""
        bucket = self.layout.bucket_of(shard.index)
        self.stops.stop(bucket, shard.index, f"shard {shard.index}: {text}")

    def _bucket_stopped(self, bucket: int) -> None:
        """With copies, the bucket's role is told (a primary hands the bucket to a copy)."""
        if self.replication is not None:
            self.replication.bucket_stopped(bucket)

    def tick(self, now: float) -> None:
        self.control.tick(now)

    def hello(self) -> dict:
        return self.control.hello()

    def status(self) -> dict:
        """Counters for ``hogwild ps status`` (plain data: :meth:`ServerControl.status`)."""
        return self.control.status()
