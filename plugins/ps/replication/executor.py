"""The one executor of the replication's decisions: a bucket role's actions, a commit round's and
a copy side's, carried out through a host's effects, by the real server and by the simulator
alike.

The state machines decide (:mod:`~hogwild_plugins.ps.replication.bucket_role`,
:mod:`~hogwild_plugins.ps.replication.commit_round`,
:mod:`~hogwild_plugins.ps.replication.copy_side`); this module is the loop that takes each
action they return, asks its host to do it (:class:`RoleEffects`, :class:`RoundEffects`,
:class:`CopyEffects`) and feeds what came of it back, in the order the machines expect. A host's
effect that blocks (an etcd transaction, an exchange with the copies, the wait for the local
update engine) is a generator: the real replication thread's never yields (it does the I/O
and returns: :mod:`~hogwild_plugins.ps.replication.adapter`), except where a copy's flow waits
for etcd or for a snapshot's values (the copy adapter then hands the paused flow to a thread
that may wait: :mod:`~hogwild_plugins.ps.replication.copy_adapter`); the simulator's yields where
the real thread would block, so that its world decides what happens meanwhile
(:mod:`~hogwild_plugins.ps.simulation.server`). Both run the loops below, so a schedule the
simulator checks runs the executor the servers run.

What the executor itself decides (and so both hosts do the same): an etcd transaction that fails
is answered as lost (``CampaignAnswered``, ``InSyncWritten`` or ``HandOverAnswered`` with
``False`` and no record: not knowing is losing; the host counts the failure and reads the map
again), a campaign won with no record read back is not won, a snapshot not delivered is a copy
unreachable (told under the Sync's ticket, so that a host that sends snapshots beside its other
work may answer later: :func:`snapshot_answered`), and a copy a commit round drops is handed
to its bucket's role at once. On the copy side (:func:`receive`): which steps of a primary's
message are atomic (under the host's lock: the log counted and committed together, a
snapshot's log replaced and its restore queued together; the gate is a step of its own, and
what the replication thread does before the content's step is the simulator's to choose:
``outside_lock``), and that a record read again (``RefreshRecord``) is the one effect that
may block on etcd: the real network thread hands the message to another thread there and
answers it later (:mod:`~hogwild_plugins.ps.replication.copy_adapter`), the simulator reads
its etcd in place.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Protocol

from hogwild_plugins.ps.replication.bucket_role import BucketRole
from hogwild_plugins.ps.replication.bucket_role_events import (
    Campaign,
    CampaignAnswered,
    CommitPrepared,
    CopyUnreachable,
    Fenced,
    HandOver,
    HandOverAnswered,
    InSyncWritten,
    SnapshotDelivered,
    Sync,
    WriteInSync,
)
from hogwild_plugins.ps.replication.commit_round_events import (
    Acknowledge,
    Admit,
    Admitted,
    AnswerDuplicate,
    ApplyLocally,
    AwaitApplied,
    BatchArrived,
    CommitsAnswered,
    DropCopy,
    LocalApplied,
    PreparesAnswered,
    RefuseNotPrimary,
    SendCommits,
    SendPrepares,
    Update,
)
from hogwild_plugins.ps.replication.copy_side_events import (
    ApplyCommitted,
    CatchUpArrived,
    CommitArrived,
    CopyStimulus,
    MarkRestored,
    PeerArrived,
    PrepareArrived,
    RefreshRecord,
    Refuse,
    SnapshotApplied,
    SnapshotArrived,
)

from hogwild.errors import HogwildError

__all__ = [
    "CopyEffects",
    "PeerHeader",
    "RoleEffects",
    "RoundEffects",
    "carry_out",
    "receive",
    "run",
    "run_round",
    "snapshot_answered",
]

ANSWERS = {Campaign: CampaignAnswered, WriteInSync: InSyncWritten, HandOver: HandOverAnswered}


class RoleEffects(Protocol):
    """What a host does for a bucket role's actions."""

    def stimulus(self, what: str) -> str:
        """A new stimulus id."""

    def replace_record(
        self, action: Campaign | WriteInSync | HandOver
    ) -> Iterator[str]:  # returns (bool, BucketRecord | None)
        """The compare-and-swap of ``sync/<bucket>`` to ``action.record`` if it is still at
        ``action.expected``: whether it was done, and the record read back. Raises
        :class:`~hogwild.errors.HogwildError` when etcd did not answer."""

    def lease_time(self) -> float:
        """This server's lease clock now (seconds of ``failover.lease_now()``; the simulator's
        ticks): when a campaign's answer came (a successor's reads wait from it)."""

    def record_written(self, action: Campaign | WriteInSync | HandOver, done: bool) -> None:
        """The transaction came back (counters; a won takeover's start)."""

    def etcd_failed(self, exc: HogwildError) -> None:
        """An etcd call failed: counted, the map read again soon."""

    def send_snapshot(self, action: Sync) -> Iterator[str]:  # returns bool | None
        """Every shard of ``action.bucket`` to copy ``action.server``: whether it took them all;
        or None: under way beside the host's other work, its answer to come later through
        :func:`snapshot_answered` (on the thread that carries out the roles' actions)."""

    def stopped_here(self, bucket: int) -> bool:
        """Whether ``bucket`` is stopped on this server (a write failed to apply here; its role
        may not have heard yet)."""

    def commit_prepared(self, bucket: int) -> None:
        """What was prepared under the old primary, committed here (just won)."""


class RoundEffects(RoleEffects, Protocol):
    """What a host does for a commit round's actions (``index``: an update of the batch)."""

    def round(self, stimulus) -> list:
        """The commit round's answer to ``stimulus``."""

    def valid(self) -> bool:
        """This server's lease is valid now (by its own clock)."""

    def refuse(self, index: int) -> None:
        """Answer the update ``NOT_PRIMARY``."""

    def answer_duplicate(self, index: int, version: int) -> None:
        """Answer a re-sent update with the version its first application got."""

    def admit(self, indices: tuple[int, ...]) -> dict[int, int]:
        """Give each update its version (those refused answered here): index -> version."""

    def apply_locally(self, indices: tuple[int, ...]) -> None:
        """Queue the updates this round still owns on this server's update engine."""

    def send_prepares(self, prepares) -> Iterator[str]:  # returns frozenset
        """``PREPARE`` each ``(index, copy)``: the ``(bucket, copy)`` pairs that failed."""

    def send_commits(self, commits) -> Iterator[str]:  # returns frozenset
        """``COMMIT`` each ``(shard, copy, version)``: the ``(bucket, copy)`` pairs that failed."""

    def await_applied(self) -> Iterator[str]:
        """Until the local application queued by :meth:`apply_locally` is done."""

    def acknowledge(self, index: int, version: int) -> None:
        """Answer the update with its version: every kept copy committed it."""


class PeerHeader(Protocol):
    """What a copy reads of a primary's message before its content: ``kind`` (``"PREPARE"``,
    ``"COMMIT"``, ``"SNAPSHOT"``, ``"CATCHUP"``), the bucket and shard, the primary's ``epoch``
    and ``lease``, the ``sender`` server and the ``version`` (a prepare's; a commit's ``upto``;
    a snapshot's; a catch-up's, with ``log_epoch``: the primary's committed state)."""

    kind: str
    bucket: int
    shard: int
    epoch: int
    lease: int
    sender: int
    version: int
    log_epoch: int


class CopyEffects(Protocol):
    """What a host does for the copy side's actions (``held``: engine slots, None: no limit)."""

    def stimulus(self, what: str) -> str:
        """A new stimulus id."""

    def locked(self) -> AbstractContextManager:
        """The lock the copy side shares with the replication thread (the logs, the roles)."""

    def copy(self, stimulus: CopyStimulus) -> list:
        """The copy side's answer to ``stimulus`` (called under :meth:`locked`)."""

    def committing(self, shard: int, upto: int) -> int:
        """How many of ``shard``'s prepared updates a commit up to ``upto`` applies."""

    def refresh_record(self, bucket: int) -> Iterator[str]:
        """Read ``sync/<bucket>`` again and give it to the bucket's role (may block on etcd)."""

    def outside_lock(self, message: PeerHeader) -> Iterator[str]:
        """Between the gate and the content, where the network thread reads the message's
        frames without the lock: the replication thread may act meanwhile (read a new record,
        win a campaign, commit what was prepared). The real host goes straight on; the
        simulator's world may run that thread here."""

    def prepared_item(self, message: PeerHeader) -> tuple:
        """The ``(sender, seq, work)`` a ``PREPARE`` carries, checked (raises when it is not)."""

    def hold(self, n: int) -> list | None:
        """Up to ``n`` of the update engine's slots, taken now (None: the host has no limit)."""

    def release(self, held: list | None) -> None:
        """Give back the held slots not used."""

    def apply_committed(self, action: ApplyCommitted, held: list | None) -> None:
        """Queue the committed updates on the engine; the shard's version is ``committed``."""

    def snapshot_of(self, message: PeerHeader) -> tuple:
        """A ``SNAPSHOT``'s request table and what it restores, checked: ``(table, content)``."""

    def stopped(self, shard: int) -> bool:
        """Whether ``shard``'s bucket is stopped on this server (a write failed to apply)."""

    def restoring_shard(self, shard: int) -> bool:
        """Whether a snapshot of ``shard`` is queued and its values not in yet."""

    def applying_shard(self, shard: int) -> bool:
        """Whether this server's commit round applies updates of ``shard`` its log does not
        count yet (called under :meth:`locked`)."""

    def apply_snapshot(self, message: PeerHeader, content, held: list | None) -> object:
        """Queue the restore (the shard's version is the snapshot's from then on); returns what
        :meth:`await_snapshot` waits on."""

    def await_snapshot(self, message: PeerHeader, pending: object) -> Iterator[str]:
        """Until the restore is in: may pause the flow (its host resumes it later); raises when
        the restore failed. A stop the restore replaced is lifted here."""

    def restored(self, bucket: int, epoch: int, stimulus_id: str) -> None:
        """Tell ``bucket``'s role that its primary of ``epoch`` restored this copy (locked)."""


def receive(message: PeerHeader, host: CopyEffects) -> Iterator[str]:
    """A primary's message through the copy side: its gate (the record read again when it asks),
    then its content. Returns the answer: the copy side's ``Refuse`` or ``Acknowledge``."""
    refreshed = False
    while True:
        stimulus = PeerArrived(
            message.bucket,
            message.epoch,
            message.lease,
            message.sender,
            refreshed,
            stimulus_id=host.stimulus(message.kind),
        )
        with host.locked():
            [verdict] = host.copy(stimulus)
        if not isinstance(verdict, RefreshRecord):
            break
        yield from host.refresh_record(message.bucket)
        refreshed = True
    if isinstance(verdict, Refuse):
        return verdict
    # not atomic with the gate: the content's step refuses a primary deposed since (a newer
    # primary's message, or this server's own takeover, reached the shard's log meanwhile)
    yield from host.outside_lock(message)
    shard, version, epoch = message.shard, message.version, message.epoch
    if message.kind == "PREPARE":
        item = host.prepared_item(message)
        sid = host.stimulus("prepare")
        with host.locked():
            stopped = host.stopped(shard)
            stimulus = PrepareArrived(shard, version, item, epoch, stopped, stimulus_id=sid)
            [action] = host.copy(stimulus)
        return action
    if message.kind == "COMMIT":
        sid = host.stimulus("commit")
        with host.locked():  # the log cannot change between counting and committing
            held = host.hold(host.committing(shard, version))
            try:
                room = None if held is None else len(held)
                stopped = host.stopped(shard)
                stimulus = CommitArrived(shard, version, epoch, room, stopped, stimulus_id=sid)
                actions = host.copy(stimulus)
                for action in actions[:-1]:
                    if isinstance(action, ApplyCommitted):
                        host.apply_committed(action, held)
            finally:
                host.release(held)
        return actions[-1]
    if message.kind == "CATCHUP":
        sid = host.stimulus("catch-up")
        with host.locked():  # what the memory holds, read with the log it is compared with
            stimulus = CatchUpArrived(
                shard,
                message.bucket,
                version,
                message.log_epoch,
                epoch,
                host.stopped(shard),
                host.restoring_shard(shard),
                host.applying_shard(shard),
                stimulus_id=sid,
            )
            return _restored(stimulus, message.bucket, sid, host)
    table, content = host.snapshot_of(message)
    sid = host.stimulus("snapshot")
    with host.locked():  # the log replaced and the restore queued together
        held = host.hold(1)
        try:
            room = held is None or bool(held)
            stimulus = SnapshotArrived(shard, version, epoch, table, room, stimulus_id=sid)
            [action] = host.copy(stimulus)
            if isinstance(action, Refuse):
                return action
            pending = host.apply_snapshot(message, content, held)
        finally:
            host.release(held)
    yield from host.await_snapshot(message, pending)
    # only now does this copy hold the state: a restore that failed must not let it campaign
    sid = host.stimulus("restored")
    stimulus = SnapshotApplied(shard, message.bucket, version, epoch, stimulus_id=sid)
    with host.locked():
        return _restored(stimulus, message.bucket, sid, host)


def _restored(stimulus: CopyStimulus, bucket: int, sid: str, host: CopyEffects):
    """A shard restored (a snapshot applied, or a catch-up): the copy side's answer, the bucket's
    role told once every shard of it is (the caller holds the host's lock)."""
    for action in host.copy(stimulus):
        if isinstance(action, MarkRestored):
            host.restored(bucket, action.epoch, sid)
        else:
            return action
    raise AssertionError("the copy side answered a restore with nothing")


def carry_out(actions: list, roles: Mapping[int, BucketRole], host: RoleEffects) -> Iterator[str]:
    """Carry out bucket roles' ``actions`` and every action their answers bring."""
    while actions:
        action = actions.pop(0)
        role = roles[action.bucket]
        sid = host.stimulus(type(action).__name__)
        if isinstance(action, Campaign | WriteInSync | HandOver):
            answer = ANSWERS[type(action)]
            try:
                done, record = yield from host.replace_record(action)
            except HogwildError as exc:
                host.etcd_failed(exc)
                role.handle(answer(False, None, stimulus_id=sid))  # not knowing is losing
                continue
            host.record_written(action, done)
            if isinstance(action, Campaign):
                done = done and record is not None
                won = CampaignAnswered(done, record, at=host.lease_time(), stimulus_id=sid)
                actions += role.handle(won)
                continue
            actions += role.handle(answer(done, record, stimulus_id=sid))
        elif isinstance(action, Sync):
            if host.stopped_here(action.bucket):
                # a write failed to apply here since the role decided (a prepared update it
                # just committed, say): its memory is no snapshot to spread, so none is sent.
                # The role hears of the stop at the next turn, once these actions are done: a
                # Stopped now would queue its HandOver behind a record write already in this
                # list, whose new revision the hand-over would then miss (and lose: stuck)
                continue
            delivered = yield from host.send_snapshot(action)
            if delivered is not None:
                actions += snapshot_answered(action, delivered, False, roles, host, sid)
        elif isinstance(action, CommitPrepared):
            host.commit_prepared(action.bucket)


def snapshot_answered(
    action: Sync,
    delivered: bool,
    fenced: bool,
    roles: Mapping[int, BucketRole],
    host: RoleEffects,
    stimulus_id: str | None = None,
) -> list:
    """What ``action``'s snapshot came to, told to its bucket's role under the Sync's ticket
    (the role takes an answer to a Sync it no longer waits for as no news): ``fenced``, a copy
    refused it as an old epoch's; then delivered, or the copy unreachable. The role's actions,
    for :func:`carry_out`."""
    role, ticket = roles[action.bucket], action.ticket
    actions = []
    if fenced:
        actions += role.handle(Fenced(ticket, stimulus_id=host.stimulus("fenced")))
    sid = stimulus_id or host.stimulus("snapshot answered")
    if delivered:
        return actions + role.handle(SnapshotDelivered(action.server, ticket, stimulus_id=sid))
    return actions + role.handle(CopyUnreachable(action.server, ticket, stimulus_id=sid))


def run_round(
    updates: tuple[Update, ...], roles: Mapping[int, BucketRole], host: RoundEffects
) -> Iterator[str]:
    """One commit round for ``updates``: what the round decides carried out, what came of it
    fed back, until it has nothing more to do."""
    todo = host.round(BatchArrived(updates, host.valid(), stimulus_id=host.stimulus("batch")))
    while todo:
        action = todo.pop(0)
        if isinstance(action, RefuseNotPrimary):
            host.refuse(action.index)
        elif isinstance(action, AnswerDuplicate):
            host.answer_duplicate(action.index, action.version)
        elif isinstance(action, Admit):
            versions = host.admit(action.indices)
            todo += host.round(Admitted(versions, stimulus_id=host.stimulus("admitted")))
        elif isinstance(action, ApplyLocally):
            host.apply_locally(action.indices)
        elif isinstance(action, SendPrepares):
            failed = yield from host.send_prepares(action.prepares)
            todo += host.round(PreparesAnswered(failed, stimulus_id=host.stimulus("prepared")))
        elif isinstance(action, SendCommits):
            failed = yield from host.send_commits(action.commits)
            todo += host.round(CommitsAnswered(failed, stimulus_id=host.stimulus("committed")))
        elif isinstance(action, DropCopy):
            sid = host.stimulus("dropped")
            dropped = roles[action.bucket].handle(CopyUnreachable(action.copy, stimulus_id=sid))
            yield from carry_out(dropped, roles, host)
        elif isinstance(action, AwaitApplied):
            yield from host.await_applied()
            todo += host.round(LocalApplied(host.valid(), stimulus_id=host.stimulus("applied")))
        elif isinstance(action, Acknowledge):
            host.acknowledge(action.index, action.version)


def run(steps: Iterator[str]):
    """Run an executor whose host never blocks (the real server's) to its end; what it
    returns."""
    try:
        point = next(steps)
    except StopIteration as end:
        return end.value
    raise AssertionError(f"a host that does its I/O in place yielded at {point!r}")
