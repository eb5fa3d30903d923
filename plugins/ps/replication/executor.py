"""The one executor of the replication's decisions: a bucket role's actions and a commit round's,
carried out through a host's effects, by the real server and by the simulator alike.

The state machines decide (:mod:`~hogwild_plugins.ps.replication.bucket_role`,
:mod:`~hogwild_plugins.ps.replication.commit_round`); this module is the loop that takes each
action they return, asks its host to do it (:class:`RoleEffects`, :class:`RoundEffects`) and
feeds what came of it back, in the order the machines expect. A host's effect that blocks (an
etcd transaction, an exchange with the copies, the wait for the local update engine) is a
generator: the real server's never yields (it does the I/O and returns:
:mod:`~hogwild_plugins.ps.replication.adapter`), the simulator's yields where the real thread
would block, so that its world decides what happens meanwhile
(:mod:`~hogwild_plugins.ps.simulation.server`). Both run the loops below, so a schedule the
simulator checks runs the executor the servers run.

What the executor itself decides (and so both hosts do the same): an etcd transaction that fails
is answered as lost (``CampaignAnswered``, ``InSyncWritten`` or ``HandOverAnswered`` with
``False`` and no record: not knowing is losing; the host counts the failure and reads the map
again), a campaign won with no record read back is not won, a snapshot not delivered is a copy
unreachable, and a copy a commit round drops is handed to its bucket's role at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

from hogwild_plugins.ps.replication.bucket_role import (
    BucketRole,
    Campaign,
    CampaignAnswered,
    CommitPrepared,
    CopyUnreachable,
    HandOver,
    HandOverAnswered,
    InSyncWritten,
    SnapshotDelivered,
    Sync,
    WriteInSync,
)
from hogwild_plugins.ps.replication.commit_round import (
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

from hogwild.errors import HogwildError

__all__ = ["RoleEffects", "RoundEffects", "carry_out", "run", "run_round"]

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

    def record_written(self, action: Campaign | WriteInSync | HandOver, done: bool) -> None:
        """The transaction came back (counters; a won takeover's start)."""

    def etcd_failed(self, exc: HogwildError) -> None:
        """An etcd call failed: counted, the map read again soon."""

    def send_snapshot(self, bucket: int, server: int) -> Iterator[str]:  # returns bool
        """Every shard of ``bucket`` to copy ``server``: whether it took them all."""

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
            actions += role.handle(answer(done, record, stimulus_id=sid))
        elif isinstance(action, Sync):
            delivered = yield from host.send_snapshot(action.bucket, action.server)
            actions += role.handle(
                SnapshotDelivered(action.server, stimulus_id=sid)
                if delivered
                else CopyUnreachable(action.server, stimulus_id=sid)
            )
        elif isinstance(action, CommitPrepared):
            host.commit_prepared(action.bucket)


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


def run(steps: Iterator[str]) -> None:
    """Run an executor whose host never blocks (the real server's) to its end."""
    for point in steps:
        raise AssertionError(f"a host that does its I/O in place yielded at {point!r}")
