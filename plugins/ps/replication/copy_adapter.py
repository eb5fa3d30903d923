"""The network thread's side as a copy: a primary's messages into the copy side, its answers out.

The server's router hands every ``PREPARE``, ``COMMIT`` and ``SNAPSHOT`` to
:meth:`CopyAdapter.handle_peer`, which decides nothing: it runs the executor's
:func:`~hogwild_plugins.ps.replication.executor.receive` (the one the simulator runs) with this
class as its host. The effects: the frames read (the client's update a ``PREPARE`` forwards,
through the server's :class:`~hogwild_plugins.ps.serving.requests.Admission`; a snapshot's
frames, :mod:`~hogwild_plugins.ps.replication.frames`), the copy side fed under the lock it
shares with the replication thread, work queued on the update engine, the bucket role told it was
restored, the reply.

The network thread never waits on etcd. When the copy side's gate asks for the bucket's record
to be read again (a message of a newer epoch than this side knows), the message goes, with the
executor paused where it would read, to this adapter's **refresher** thread, which reads etcd,
finishes the message and answers it through its own replier; the network thread goes on
answering pulls, ``STATUS`` and the rest meanwhile. Messages from primaries that arrive while
any wait there queue behind them (at most ``MAX_DEFERRED``; beyond, ``BUSY``), so a copy still
takes each primary's messages in the order they came.

The network thread never waits for an update thread either: a ``COMMIT`` takes the engine's slots
for all it commits or is refused (``BUSY``), and a ``SNAPSHOT``'s flow pauses once its values are
queued (the log already replaced); the replication thread resumes it every turn
(:meth:`CopyAdapter.finish_restores`) and, once the values are in, makes the bucket current and
answers. A snapshot queued after the shard failed a write (its bucket stopped here) lifts the
stop once it is in (:class:`~hogwild_plugins.ps.replication.bucket_role_events.StopLifted`,
before the primary's ``Restored``).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from hogwild_plugins.ps.etcd import EtcdUnavailable
from hogwild_plugins.ps.failover import BucketRecord
from hogwild_plugins.ps.replication.bucket_role import BucketRole
from hogwild_plugins.ps.replication.bucket_role_events import RecordRefreshed, Restored, StopLifted
from hogwild_plugins.ps.replication.copy_side import CopySide
from hogwild_plugins.ps.replication.copy_side_events import ApplyCommitted, CopyStimulus, Refuse
from hogwild_plugins.ps.replication.executor import receive
from hogwild_plugins.ps.replication.frames import parse_snapshot
from hogwild_plugins.ps.replication.local import LOCAL_APPLY_S, Countdown, LocalApplier
from hogwild_plugins.ps.replication.peer_link import PEER_SENDER
from hogwild_plugins.ps.work import Restore

from hogwild.errors import HogwildError
from hogwild.net.router import Incoming, Reply, error_reply
from hogwild.net.wire import ErrorCode, Header, MsgType, WireError, unpack_header

__all__ = ["MAX_DEFERRED", "REPLICATED_TYPES", "CopyAdapter", "PeerMessage"]

REPLICATED_TYPES = frozenset(
    {MsgType.PUSH_DELTAS, MsgType.PUSH_VECTORS, MsgType.ASSIGN, MsgType.VECTOR_OP}
)
MAX_DEFERRED = 1024  # primaries' messages waiting for the refresher; beyond: answered BUSY
_STOP = object()
RESTORING = "wait for the snapshot's values"  # the flow pauses here: finish_restores resumes it


@dataclass(frozen=True, slots=True)
class PeerMessage:
    """A primary's message as the executor reads it (its
    :class:`~hogwild_plugins.ps.replication.executor.PeerHeader`), with the wire's header and
    frames. A catch-up travels as a ``SNAPSHOT`` without frames, the epoch of the primary's
    committed state in ``offset``."""

    kind: str
    bucket: int
    shard: int
    epoch: int
    lease: int
    sender: int
    version: int
    log_epoch: int
    header: Header
    frames: list

    @classmethod
    def of(cls, header: Header, frames: list, shard: int, bucket: int) -> PeerMessage:
        """The message ``header`` (checked: of ``shard``, in ``bucket``) and ``frames`` carry."""
        catch_up = header.type == MsgType.SNAPSHOT and header.frames == 0
        return cls(
            "CATCHUP" if catch_up else header.type.name,
            bucket,
            shard,
            header.aux,  # the primary's epoch
            header.lease,
            header.sender - PEER_SENDER,
            header.version,
            header.offset if catch_up else 0,  # the epoch of the primary's committed state
            header,
            frames,
        )


class CopyAdapter:
    """Carries out the copy side's decisions (see the module docstring).

    Args:
        server: The :class:`~hogwild_plugins.ps.serving.server.ParameterServer`.
        copy_side: The machine.
        roles: Every bucket's role (a refreshed record and a restore are fed to it).
        lock: Shared with the replication thread (the logs, the roles).
        local: Queues work on this server's update engine.
        read_record: ``sync/<bucket>`` as etcd has it now (None: absent); called on the
            refresher thread only.
        changed: Called once a record was read again (the replication thread reads the map).
        stimulus: A new stimulus id for what happened.
        applying: Whether this server's commit round applies updates of a shard that its log
            does not count yet (called under ``lock``).
        stopping: Why this server decided to stop (its replication failed, or the driver
            replaced it); None while it goes on. It is set under ``lock`` and read under it
            at every step of a message through the copy side (:meth:`copy`), on every
            thread (network, refresher, and the replication thread's :meth:`finish_restores`),
            so the decision and each step are ordered: a step after the decision refuses the
            message ``REPLACED``, and the primary counts no ``PREPARE``, ``COMMIT``, catch-up
            or snapshot that reaches the copy side after it, since what this process holds
            dies with it. A message whose last step came before the decision is answered as
            usual, possibly after it (an acknowledgement followed by the process's end, as a
            kill right after an ack). An orderly stop (``ParameterServer.stop``) sets no
            reason: it stops the network thread first, so no answer leaves after it.
    """

    def __init__(
        self,
        server,
        copy_side: CopySide,
        roles: Mapping[int, BucketRole],
        lock: threading.Lock,
        local: LocalApplier,
        read_record: Callable[[int], BucketRecord | None],
        changed: Callable[[], None],
        stimulus: Callable[[str], str],
        applying: Callable[[int], bool],
        stopping: Callable[[], str | None],
    ) -> None:
        self.server, self.copy_side, self.roles, self._lock = server, copy_side, roles, lock
        self.stopping = stopping
        self.applying_shard = applying
        self.local, self.read_record, self.changed = local, read_record, changed
        self.stimulus = stimulus
        self.layout = server.layout
        self._deferred: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting = 0  # messages handed to the refresher and not answered yet
        self._count = threading.Lock()
        self._thread: threading.Thread | None = None
        self.deferred = 0  # messages the network thread handed to the refresher (status)
        # snapshots queued on the update engine, oldest first: their flows wait for them
        # (appended by the network and refresher threads, resumed by the replication thread)
        self.restoring: deque[tuple[PeerMessage, Iterator[str]]] = deque()
        self._restoring_lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle

    def start(self, replier: Callable[[], object]) -> None:
        """Start the refresher thread; ``replier()`` makes its way to answer (the router's)."""
        self._thread = threading.Thread(
            target=self._refresher, args=(replier,), name="hogwild-copy-refresh", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the refresher (the messages still waiting go unanswered: their primaries time
        out); returns once it ended, within ``timeout`` plus one etcd request."""
        if self._thread is not None:
            self._deferred.put(_STOP)
            self._thread.join(timeout)
            self._thread = None

    # ------------------------------------------------------------------ network thread

    def handle_peer(self, request: Incoming) -> Reply | None:
        """A primary's ``PREPARE``, ``COMMIT`` or ``SNAPSHOT`` to this copy: answered now, or
        (None) by the refresher once it read etcd."""
        header = request.header
        shard = self.server.admission.check(header)
        message = PeerMessage.of(header, request.frames, shard, self.layout.bucket_of(shard))
        if self._waiting:  # earlier messages wait for the refresher: this one after them
            return self._defer(message, None)
        steps = receive(message, self)
        try:
            pause = next(steps)
        except StopIteration as end:
            return self._answer(header, end.value)
        if pause is RESTORING:
            self._paused(message, steps)  # answered by finish_restores
            return None
        return self._defer(message, steps)  # it would read etcd here: the refresher goes on

    def _defer(self, message: PeerMessage, steps: Iterator[str] | None) -> None:
        with self._count:
            if self._waiting >= MAX_DEFERRED:
                raise WireError(
                    f"{self._waiting} replication messages wait for etcd here; send again",
                    ErrorCode.BUSY,
                )
            self._waiting += 1
            self.deferred += 1
        self._deferred.put((message, steps))
        return None

    def _refuse_if_stopping(self) -> None:
        """Raise (``REPLACED``, naming why) once this server decided to stop (the caller holds
        the lock the decision is taken under): the primary then drops it from ``in_sync`` as it
        would a dead copy, instead of counting its memory."""
        why = self.stopping()
        if why is not None:
            raise WireError(
                f"server {self.server.options.index} is stopping ({why}): it takes no "
                "replication messages",
                ErrorCode.REPLACED,
            )

    @staticmethod
    def _answer(header: Header, action) -> Reply:
        """The copy side's last action as the reply to the primary's message."""
        if isinstance(action, Refuse):
            raise WireError(action.message, action.code)
        return Reply(header.reply(MsgType.ACK, version=action.version))

    # ------------------------------------------------------------------ refresher thread

    def _refresher(self, make_replier: Callable[[], object]) -> None:
        replier = make_replier()
        try:
            while (item := self._deferred.get()) is not _STOP:
                message, steps = item
                try:
                    reply = self._finish(message, steps)
                finally:
                    with self._count:
                        self._waiting -= 1
                if reply is not None:  # None: a snapshot's, answered by finish_restores
                    replier.send(reply.header, reply.frames)
        finally:
            replier.close()

    def _finish(self, message: PeerMessage, steps: Iterator[str] | None) -> Reply | None:
        """Run the executor for ``message`` to its answer (here it may wait on etcd); None when
        it pauses for a snapshot's values (:meth:`finish_restores` answers it)."""
        header = message.header
        try:
            steps = steps if steps is not None else receive(message, self)
            while True:
                try:
                    pause = next(steps)
                except StopIteration as end:
                    return self._answer(header, end.value)
                if pause is RESTORING:
                    self._paused(message, steps)
                    return None
        except WireError as exc:
            return error_reply(header, exc.code, str(exc))
        except EtcdUnavailable as exc:
            return error_reply(header, ErrorCode.BUSY, f"the bucket's record is unknown: {exc}")
        except Exception as exc:  # noqa: BLE001 - a bug must not end the thread: reported
            return error_reply(header, ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ replication thread

    def finish_restores(self, send: Callable[[Reply], None], stops: Callable[[], None]) -> None:
        """Resume the snapshots' flows whose values are in, or that waited ``LOCAL_APPLY_S``
        (the replication thread, every turn), and ``send`` their answers. ``stops`` first tells
        the roles of the buckets stopped so far (a stop lifted here comes after them)."""
        stops()
        with self._restoring_lock:
            waiting = list(self.restoring)
        for item in waiting:
            message, steps = item
            try:
                if next(steps) is RESTORING:
                    continue  # the values are not in yet
                raise AssertionError("a snapshot's flow paused for something else")
            except StopIteration as end:
                reply = self._answer(message.header, end.value)
            except WireError as exc:
                reply = error_reply(message.header, exc.code, str(exc))
            except Exception as exc:  # noqa: BLE001 - a bug: reported, as the refresher does
                text = f"{type(exc).__name__}: {exc}"
                reply = error_reply(message.header, ErrorCode.INTERNAL, text)
            with self._restoring_lock:
                self.restoring.remove(item)
            send(reply)

    def _paused(self, message: PeerMessage, steps: Iterator[str]) -> None:
        with self._restoring_lock:
            self.restoring.append((message, steps))

    # ------------------------------------------------------------------ the executor's effects
    # (executor.receive: the simulator's SimServer is the other host)

    def locked(self) -> threading.Lock:
        return self._lock

    def copy(self, stimulus: CopyStimulus) -> list:
        # under the lock (the executor takes it): the stop's decision came before this step or
        # comes after it, whichever thread runs the message (see the class's ``stopping``)
        self._refuse_if_stopping()
        return self.copy_side.handle(stimulus)

    def committing(self, shard: int, upto: int) -> int:
        return self.copy_side.logs[shard].committing(upto)

    def refresh_record(self, bucket: int) -> Iterator[str]:
        yield "read the record from etcd"  # never on the network thread: the refresher goes on
        try:
            record = self.read_record(bucket)
        except EtcdUnavailable:
            raise
        except HogwildError:  # not a record: the gate decides on what this side knew
            return
        if record is None:
            return
        with self._lock:  # not in the middle of the replication thread's observe
            self.roles[bucket].handle(RecordRefreshed(record, stimulus_id=self.stimulus("refresh")))
        self.changed()

    @staticmethod
    def outside_lock(message: PeerMessage) -> Iterator[str]:
        yield from ()  # nothing to wait for: the executor reads the frames next, on this thread

    def prepared_item(self, message: PeerMessage) -> tuple:
        frames, shard = message.frames, message.shard
        if len(frames) < 1:
            raise WireError("PREPARE needs the client's header frame", ErrorCode.BAD_FRAMES)
        client = unpack_header(memoryview(frames[0]))
        if client.target != shard or client.type not in REPLICATED_TYPES:
            raise WireError(
                "PREPARE carries an update of another shard or kind", ErrorCode.BAD_FRAMES
            )
        if client.frames != len(frames) - 1:
            raise WireError(
                "PREPARE: the client's frames do not match its header", ErrorCode.BAD_FRAMES
            )
        admission = self.server.admission
        admission.check(client)
        work = admission.work(client, shard, self.server.local[shard], frames[1:])
        if not admission.writes(work):
            raise WireError("PREPARE carries a reduction (it writes nothing)", ErrorCode.BAD_FRAMES)
        work.version = message.version
        admission.decide(work, client, message.header.a)
        work.keep = frames
        return client.sender, client.seq, work

    def hold(self, n: int) -> list[int]:
        return self.local.hold(n)

    def release(self, held: list[int]) -> None:
        self.local.release(held)

    def apply_committed(self, action: ApplyCommitted, held: list[int]) -> None:
        self.local.apply_held(list(action.works), held)
        book = self.server.book
        book.set_version(action.shard, max(action.committed, book.version(action.shard)))

    def snapshot_of(self, message: PeerMessage) -> tuple:
        shard = message.shard
        size = self.layout.shard_size(shard)
        state_size = self.server.shards[self.server.local[shard]].state.size
        snapshot = parse_snapshot(message.header, message.frames, size, state_size)
        work = Restore(
            self.server.local[shard],
            version=message.version,
            keep=message.frames,
            values=snapshot.values,
            state=snapshot.state,
            vectors=snapshot.vectors,
        )
        return tuple(snapshot.table), work

    def stopped(self, shard: int) -> bool:
        return self.server.stops.stopped(self.layout.bucket_of(shard))

    def restoring_shard(self, shard: int) -> bool:
        with self._restoring_lock:
            return any(message.shard == shard for message, _ in self.restoring)

    def apply_snapshot(
        self, message: PeerMessage, work: Restore, held: list[int]
    ) -> PendingRestore:
        done = Countdown(1)
        self.local.apply_held([work], held, done)
        shard = message.shard
        # the log's version now (a commit after it, queued behind it, raises it)
        self.server.book.set_version(shard, message.version)
        # queued after the shard failed a write: applied after it, it replaces that memory
        replaces = self.server.stops.failed(self.layout.bucket_of(shard), shard)
        return PendingRestore(work, done, time.monotonic(), replaces)

    def await_snapshot(self, message: PeerMessage, pending: PendingRestore) -> Iterator[str]:
        shard = message.shard
        while not pending.done.wait(0):
            if time.monotonic() - pending.since > LOCAL_APPLY_S:
                raise WireError(
                    f"shard {shard}: the snapshot was not applied within {LOCAL_APPLY_S:g} s",
                    ErrorCode.BUSY,
                )
            yield RESTORING
        if pending.work.failed is not None:
            raise WireError(
                f"shard {shard}: the snapshot failed to apply: {pending.work.failed}",
                ErrorCode.INTERNAL,
            )
        bucket = self.layout.bucket_of(shard)
        if pending.replaces and self.server.stops.replaced(bucket, shard):  # no failed shard
            with self._lock:  # left: the bucket's memory is its primaries' snapshots again
                self.roles[bucket].handle(StopLifted(stimulus_id=self.stimulus("stop lifted")))

    def restored(self, bucket: int, epoch: int, stimulus_id: str) -> None:
        self.roles[bucket].handle(Restored(epoch, stimulus_id=stimulus_id))


@dataclass
class PendingRestore:
    """A snapshot queued on an update thread (since: when queued), its flow waiting for it."""

    work: Restore
    done: Countdown
    since: float
    replaces: bool = False  # queued after the shard failed a write: it replaces that memory
