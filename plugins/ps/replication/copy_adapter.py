"""The network thread's side as a copy: a primary's messages into the copy side, its answers out.

The server's router hands every ``PREPARE``, ``COMMIT`` and ``SNAPSHOT`` to
:meth:`CopyAdapter.handle_peer`, which decides nothing: it reads the frames (the client's update a
``PREPARE`` forwards, through the server's :class:`~hogwild_plugins.ps.serving.requests.Admission`;
a snapshot's frames, :mod:`~hogwild_plugins.ps.replication.frames`), feeds the
:class:`~hogwild_plugins.ps.replication.copy_side.CopySide` one stimulus at a time, under the lock
it shares with the replication thread, and carries out what it returns: a refreshed record read
from etcd, work queued on the update engine, the bucket role told it was restored, the reply.

The network thread never waits for an update thread: a ``COMMIT`` takes the engine's slots for
all it commits or is refused (``BUSY``), and a ``SNAPSHOT``'s reply waits for its values to be in
on the replication thread (:meth:`CopyAdapter.finish_restores`), which then makes the bucket
current and answers; meanwhile the network thread answers everything else (``STATUS``
included).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hogwild_plugins.ps.etcd import EtcdUnavailable
from hogwild_plugins.ps.failover import BucketRecord
from hogwild_plugins.ps.replication.bucket_role import (
    BucketRole,
    RecordRefreshed,
    Restored,
    StopLifted,
)
from hogwild_plugins.ps.replication.copy_side import (
    ApplyCommitted,
    CommitArrived,
    CopySide,
    CopyStimulus,
    MarkRestored,
    PeerArrived,
    PrepareArrived,
    RefreshRecord,
    Refuse,
    SnapshotApplied,
    SnapshotArrived,
)
from hogwild_plugins.ps.replication.frames import parse_snapshot
from hogwild_plugins.ps.replication.local import LOCAL_APPLY_S, Countdown, LocalApplier
from hogwild_plugins.ps.replication.peer_link import PEER_SENDER
from hogwild_plugins.ps.work import Restore

from hogwild.errors import HogwildError
from hogwild.net.router import Incoming, Reply, error_reply
from hogwild.net.wire import ErrorCode, Header, MsgType, WireError, unpack_header

__all__ = ["REPLICATED_TYPES", "CopyAdapter"]

REPLICATED_TYPES = frozenset(
    {MsgType.PUSH_DELTAS, MsgType.PUSH_VECTORS, MsgType.ASSIGN, MsgType.VECTOR_OP}
)


class CopyAdapter:
    """Carries out the copy side's decisions on the network thread (see the module docstring).

    Args:
        server: The :class:`~hogwild_plugins.ps.serving.server.ParameterServer`.
        copy_side: The machine.
        roles: Every bucket's role (a refreshed record and a restore are fed to it).
        lock: Shared with the replication thread (the logs, the roles).
        local: Queues work on this server's update engine.
        read_record: ``sync/<bucket>`` as etcd has it now (None: absent).
        changed: Called once a record was read again (the replication thread reads the map).
        stimulus: A new stimulus id for what happened.
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
    ) -> None:
        self.server, self.copy_side, self.roles, self.lock = server, copy_side, roles, lock
        self.local, self.read_record, self.changed = local, read_record, changed
        self.stimulus = stimulus
        self.layout = server.layout
        # snapshots queued on the update engine, oldest first: their replies wait for them
        self.restoring: deque[PendingRestore] = deque()

    def handle_peer(self, request: Incoming) -> Reply:
        """A primary's ``PREPARE``, ``COMMIT`` or ``SNAPSHOT`` to this copy: through the copy
        side's gate, then its content."""
        header = request.header
        shard = self.server.admission.check(header)
        bucket = self.layout.bucket_of(shard)
        sender = header.sender - PEER_SENDER
        refreshed = False
        while True:
            stimulus = PeerArrived(
                bucket,
                header.aux,  # aux: the primary's epoch
                header.lease,
                sender,
                refreshed,
                stimulus_id=self.stimulus(header.type.name),
            )
            [verdict] = self._copy(stimulus)
            if not isinstance(verdict, RefreshRecord):
                break
            self._refresh_record(bucket)
            refreshed = True
        if isinstance(verdict, Refuse):
            raise WireError(verdict.message, verdict.code)
        if header.type == MsgType.PREPARE:
            return self._prepare(header, shard, request.frames)
        if header.type == MsgType.COMMIT:
            return self._commit(header, shard)
        return self._restore(header, shard, request.frames)

    def _copy(self, stimulus: CopyStimulus) -> list:
        """The copy side's answer to ``stimulus`` (under the lock it shares with the rounds)."""
        with self.lock:
            return self.copy_side.handle(stimulus)

    @staticmethod
    def _answer(header: Header, action) -> Reply:
        """A copy side's last action as the reply to the primary's message."""
        if isinstance(action, Refuse):
            raise WireError(action.message, action.code)
        return Reply(header.reply(MsgType.ACK, version=action.version))

    def _refresh_record(self, bucket: int) -> None:
        try:
            record = self.read_record(bucket)
        except EtcdUnavailable:
            raise
        except HogwildError:  # not a record: the gate decides on what this side knew
            return
        if record is None:
            return
        with self.lock:  # not in the middle of the replication thread's observe
            self.roles[bucket].handle(RecordRefreshed(record, stimulus_id=self.stimulus("refresh")))
        self.changed()

    def _prepare(self, header: Header, shard: int, frames: list) -> Reply:
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
        work.version = header.version
        admission.decide(work, client, header.a)
        work.keep = frames
        item = (client.sender, client.seq, work)
        sid = self.stimulus("prepare")
        stopped = self.server.stops.stopped(self.layout.bucket_of(shard))
        stimulus = PrepareArrived(shard, header.version, item, stopped, stimulus_id=sid)
        [action] = self._copy(stimulus)
        return self._answer(header, action)

    def _commit(self, header: Header, shard: int) -> Reply:
        sid = self.stimulus("commit")
        with self.lock:  # the log cannot change between counting and committing
            slots = self.local.hold(self.copy_side.logs[shard].committing(header.version))
            try:
                # aux: the primary's epoch
                stimulus = CommitArrived(
                    shard,
                    header.version,
                    header.aux,
                    room=len(slots),
                    stopped=self.server.stops.stopped(self.layout.bucket_of(shard)),
                    stimulus_id=sid,
                )
                actions = self.copy_side.handle(stimulus)
                for action in actions[:-1]:
                    if isinstance(action, ApplyCommitted):
                        self.local.apply_held(list(action.works), slots)
                        book = self.server.book
                        book.set_version(shard, max(action.committed, book.version(shard)))
            finally:
                self.local.release(slots)
        return self._answer(header, actions[-1])

    def _restore(self, header: Header, shard: int, frames: list) -> Reply | None:
        """Replace the shard's log and queue the snapshot's values on its update thread; the
        reply waits for them, off this thread (:meth:`finish_restores`): the network thread goes
        on answering while an update thread is busy."""
        size = self.layout.shard_size(shard)
        state_size = self.server.shards[self.server.local[shard]].state.size
        snapshot = parse_snapshot(header, frames, size, state_size)
        work = Restore(
            self.server.local[shard],
            version=header.version,
            keep=frames,
            values=snapshot.values,
            state=snapshot.state,
            vectors=snapshot.vectors,
        )
        sid = self.stimulus("snapshot")
        done = Countdown(1)
        with self.lock:  # the log replaced and the restore queued together (see the adapter)
            slots = self.local.hold(1)
            try:
                stimulus = SnapshotArrived(
                    shard,
                    header.version,
                    header.aux,  # the primary's epoch
                    tuple(snapshot.table),
                    room=bool(slots),
                    stimulus_id=sid,
                )
                [action] = self.copy_side.handle(stimulus)
                if not isinstance(action, Refuse):
                    self.local.apply_held([work], slots, done)
                    # the log's version now (a commit after it, queued behind it, raises it)
                    self.server.book.set_version(shard, header.version)
                    # queued after the shard failed a write: applied after it, it replaces it
                    replaces = self.server.stops.failed(self.layout.bucket_of(shard), shard)
                    self.restoring.append(
                        PendingRestore(header, shard, work, done, time.monotonic(), replaces)
                    )
            finally:
                self.local.release(slots)
        if isinstance(action, Refuse):
            return self._answer(header, action)
        return None  # answered by finish_restores, once the values are in

    def finish_restores(self, send: Callable[[Reply], None], stops: Callable[[], None]) -> None:
        """Answer the snapshots whose values are in (the replication thread, every turn):
        only then does this copy hold the state (a restore that failed, or did not apply within
        ``LOCAL_APPLY_S``, is refused and makes nothing current). ``send`` carries a reply out;
        ``stops`` first tells the roles of the buckets stopped so far (a stop lifted here comes
        after them)."""
        stops()
        for pending in list(self.restoring):  # (the network thread appends meanwhile)
            late = time.monotonic() - pending.since > LOCAL_APPLY_S
            if not (pending.done.wait(0) or late):
                continue
            self.restoring.remove(pending)
            try:
                send(self._restored(pending, late))
            except WireError as exc:
                send(error_reply(pending.header, exc.code, str(exc)))

    def _restored(self, pending: PendingRestore, late: bool) -> Reply:
        header, shard = pending.header, pending.shard
        if late:
            raise WireError(
                f"shard {shard}: the snapshot was not applied within {LOCAL_APPLY_S:g} s",
                ErrorCode.BUSY,
            )
        if pending.work.failed is not None:
            raise WireError(
                f"shard {shard}: the snapshot failed to apply: {pending.work.failed}",
                ErrorCode.INTERNAL,
            )
        bucket = self.layout.bucket_of(shard)
        sid = self.stimulus("restored")
        if pending.replaces and self.server.stops.replaced(bucket, shard):  # no failed shard
            with self.lock:  # left: the bucket's memory is its primaries' snapshots again
                self.roles[bucket].handle(StopLifted(stimulus_id=sid))
        applied = SnapshotApplied(shard, bucket, header.version, header.aux, stimulus_id=sid)
        for action in self._copy(applied):
            if isinstance(action, MarkRestored):
                with self.lock:
                    self.roles[bucket].handle(Restored(action.epoch, stimulus_id=sid))
            else:
                return self._answer(header, action)
        raise AssertionError("the copy side acknowledged no restore")


@dataclass
class PendingRestore:
    """A snapshot queued on an update thread, its reply waiting for it (since: when queued)."""

    header: Header
    shard: int
    work: Restore
    done: Countdown
    since: float
    replaces: bool = False  # queued after the shard failed a write: it replaces that memory
