"""A copy's acceptance of its primary's ``PREPARE``, ``COMMIT`` and ``SNAPSHOT``: a state machine.

No I/O here (after dask's worker state machine): a :class:`CopySide` changes only through
:meth:`CopySide.handle`, which takes a stimulus and returns actions for the network thread to
carry out (:mod:`~hogwild_plugins.ps.replication.copy_adapter`; both kinds of record are in
:mod:`~hogwild_plugins.ps.replication.copy_side_events`); what the actions produce comes back
as the next stimulus. It holds the server's shard logs
(:class:`~hogwild_plugins.ps.shard_log.ShardLog`) and reads the bucket roles
(:class:`~hogwild_plugins.ps.replication.bucket_role.BucketRole`); the adapter holds the lock
they share with the replication thread while it calls :meth:`~CopySide.handle`.

One message from a primary goes through two steps:

1. :class:`PeerArrived`, the gate (:func:`gate`): a message of an
   older epoch or lease, or from another server than the record's primary, is refused
   (``FENCED``: the sender steps down); one of a newer epoch than this side knows asks for the
   record to be read again (:class:`RefreshRecord`) and is then gated once more
   (``refreshed``); still unknown, it is refused as ``BUSY`` (the primary retries).
   The gate and what follows are two steps (the network thread reads the message's frames
   between them, and the replication thread may act meanwhile), so the second step refuses
   (``FENCED``) a message of a primary older than one the shard's log already took something
   from (:meth:`~hogwild_plugins.ps.shard_log.ShardLog.stale`: a successor's catch-up or
   snapshot, or this server's own takeover, reached the log since the gate).
2. What it carries (a ``PREPARE``, ``COMMIT`` or catch-up for a bucket stopped here, whose
   memory failed a write, is refused ``NEED_SYNC`` until a snapshot replaces it):
   :class:`PrepareArrived` holds the update as the shard's next version (a gap: ``NEED_SYNC``, the
   primary drops this copy and sends it a snapshot; so does a ``PREPARE`` or ``COMMIT`` of a
   primary that has not caught this log up yet,
   :meth:`~hogwild_plugins.ps.shard_log.ShardLog.caught_up_by`); :class:`CommitArrived` commits the
   prepared updates up to a version (:class:`ApplyCommitted`; beyond what was prepared:
   ``NEED_SYNC``) only if the update engine has room for every one of them (its ``room``, slots the
   adapter holds: else ``BUSY`` with nothing committed, so an acknowledged commit is always applied
   whole and a refused one changed nothing); :class:`SnapshotArrived` replaces the shard's log
   (:class:`ApplySnapshot`) unless it is older than what this log committed from the same primary
   (refused, ``NEED_SYNC``: never an acknowledgement) or the engine has no room for it (``BUSY``,
   the log untouched), and :class:`SnapshotApplied`, once the values are in, acknowledges, and
   makes the bucket current (:class:`MarkRestored`) once every shard of the bucket holds that
   primary's snapshot.
   :class:`CatchUpArrived` does without the snapshot: a log that holds the primary's committed
   state (the same version of the same epoch, while no snapshot and no round of this server's
   own is still applying values the log already, or not yet, counts,
   :meth:`~hogwild_plugins.ps.shard_log.ShardLog.holds`; a copy that only missed a lease renewal,
   or whose primary took its bucket back under a new epoch) counts as restored by it, its stale
   prepared updates dropped; any other answers ``NEED_SYNC`` and the snapshot follows.

The invariant kept (:meth:`CopySide.validate_state`): every log's prepared versions follow its
committed version one by one, its committed state comes from no primary newer than its fence,
and its request table stays within its bounds (per client, and clients).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from enum import Enum

from hogwild_plugins.ps.replication.bucket_role import BucketRole, Role
from hogwild_plugins.ps.replication.copy_side_events import (
    Acknowledge,
    ApplyCommitted,
    ApplySnapshot,
    CatchUpArrived,
    CommitArrived,
    CopyStimulus,
    MarkRestored,
    Pass,
    PeerArrived,
    PrepareArrived,
    RefreshRecord,
    Refuse,
    SnapshotApplied,
    SnapshotArrived,
)
from hogwild_plugins.ps.shard_log import ShardLog

from hogwild.net.wire import ErrorCode

__all__ = ["CopySide", "Gate", "commit_log", "gate"]

STORY_LENGTH = 1024  # transitions the copy side remembers (:meth:`CopySide.story`)


# --------------------------------------------------------------------------- the gate


class Gate(Enum):
    ACCEPT = "accept"
    FENCED = "fenced"  # an older epoch (or lease) than the bucket's: refuse, the sender steps down
    REFRESH = "refresh"  # a newer epoch than this side knows: read the map again, then decide


def gate(role: BucketRole, epoch: int, lease: int, sender: int) -> Gate:
    """May a message from ``sender`` carrying ``epoch`` and ``lease`` change this copy?"""
    if role.record_lost:  # etcd's record is another history than this side's: never joined
        return Gate.FENCED
    record = role.record
    if record is None or epoch > record.epoch:
        return Gate.REFRESH
    if epoch < record.epoch or lease != record.lease or sender != record.primary:
        return Gate.FENCED
    if role.role is Role.PRIMARY and sender != role.me:
        return Gate.FENCED
    if role.role is Role.CANDIDATE:
        return Gate.REFRESH  # campaigning: the sender retries once the map settles
    return Gate.ACCEPT


# --------------------------------------------------------------------------- the machine


def commit_log(log: ShardLog, upto: int, epoch: int) -> list:
    """``log``'s prepared updates up to ``upto``, committed by the primary of ``epoch``, each
    client request recorded (a re-send is then answered, not applied again)."""
    items = log.commit(upto, epoch)
    for sender, seq, work in items:
        log.record(sender, seq, work.version)
    return items


class CopySide:
    """This server's side as a copy of every bucket (see the module docstring).

    Args:
        me: This server's index.
        roles: Every bucket's role (read here, changed by the roles' own stimuli).
        logs: Every shard's log (changed here, and by the primary's commit round).
    """

    def __init__(
        self,
        me: int,
        roles: Mapping[int, BucketRole],
        logs: Mapping[int, ShardLog],
        bucket_shards: Mapping[int, Sequence[int]],
    ) -> None:
        self.me, self.roles, self.logs = me, roles, logs
        self.bucket_shards = bucket_shards
        self.bucket_of = {s: b for b, shards in bucket_shards.items() for s in shards}
        self.restored: dict[int, int] = {}  # shard -> the epoch of the last snapshot applied
        self.counters = {
            "prepared": 0,
            "committed": 0,
            "snapshots_received": 0,
            "caught_up": 0,  # shards a primary found holding its state: no snapshot
            "outdated_snapshots": 0,
            "fenced": 0,
            "no_room": 0,  # commits and snapshots refused, nothing changed: the engine was full
            "stopped_refused": 0,  # prepares and commits refused: the bucket is stopped here
            "catch_up_while_restoring": 0,  # catch-ups refused: a snapshot still applying
            "catch_up_while_applying": 0,  # catch-ups refused: this side's own round applying
            "not_caught_up": 0,  # prepares and commits refused: their primary never caught up
        }
        self.transitions: deque = deque(maxlen=STORY_LENGTH)

    def handle(self, stimulus: CopyStimulus) -> list:
        """The one entry: take ``stimulus``, return what to do. Every transition goes into
        :meth:`story`."""
        match stimulus:
            case PeerArrived():
                actions = self._gate(stimulus)
            case PrepareArrived():
                actions = self._prepare(stimulus)
            case CommitArrived():
                actions = self._commit(stimulus)
            case SnapshotArrived():
                actions = self._snapshot(stimulus)
            case SnapshotApplied():
                self.counters["snapshots_received"] += 1
                actions = self._applied(stimulus)
            case CatchUpArrived():
                actions = self._catch_up(stimulus)
            case _:
                raise TypeError(f"copy side: not a stimulus: {stimulus!r}")
        self.transitions.append((stimulus.stimulus_id, type(stimulus).__name__, tuple(actions)))
        return actions

    def story(self) -> list[tuple]:
        """The last transitions, oldest first: ``(stimulus_id, stimulus, actions)``."""
        return list(self.transitions)

    def validate_state(self) -> None:
        """Check every log's invariants (tests call it after every stimulus).

        Raises:
            AssertionError: An invariant broken, with the last transitions.
        """
        for shard, log in self.logs.items():
            versions = [v for v, _ in log.prepared]
            expected = list(range(log.committed + 1, log.committed + 1 + len(versions)))
            if versions != expected:
                raise AssertionError(
                    f"shard {shard}: prepared {versions} do not follow committed "
                    f"{log.committed}; {self.story()[-5:]}"
                )
            if (
                log.epoch > log.fence  # its committed state from a primary it never fenced by
                or len(log.requests) > log.senders
                or any(len(mine) > log.window for mine in log.requests.values())
                or log.committed < 0
            ):
                raise AssertionError(f"shard {shard}: {log!r}; {self.story()[-5:]}")
        if min(self.counters.values()) < 0:
            raise AssertionError(f"counters {self.counters}")

    def _gate(self, s: PeerArrived) -> list:
        role = self.roles[s.bucket]
        verdict = gate(role, s.epoch, s.lease, s.sender)
        if verdict is Gate.ACCEPT:
            return [Pass()]
        if verdict is Gate.REFRESH and not s.refreshed:
            return [RefreshRecord(s.bucket)]
        self.counters["fenced"] += 1
        return [
            Refuse(
                ErrorCode.FENCED if verdict is Gate.FENCED else ErrorCode.BUSY,
                f"server {self.me}: bucket {s.bucket} is at epoch {role.epoch}, "
                f"primary {getattr(role.record, 'primary', None)}; a message of "
                f"epoch {s.epoch} from server {s.sender} is refused",
            )
        ]

    def _stopped(self, s: PrepareArrived | CommitArrived | CatchUpArrived, what: str) -> list:
        """``what`` refused while its shard's bucket is stopped here (a write failed to apply
        after its commit): the primary drops this copy and sends it a snapshot."""
        if not s.stopped:
            return []
        shard, bucket = s.shard, self.bucket_of.get(s.shard)
        self.counters["stopped_refused"] += 1
        return [
            Refuse(
                ErrorCode.NEED_SYNC,
                f"server {self.me}, shard {shard}: {what} refused: bucket "
                f"{bucket} is stopped here (a write failed to apply after its "
                "commit); it needs a snapshot",
            )
        ]

    def _late(self, shard: int, epoch: int, what: str) -> list:
        """``what`` refused (``FENCED``: its sender steps down) when it comes from a primary
        older than one ``shard``'s log took something from since the message passed the
        gate."""
        log = self.logs[shard]
        if not log.stale(epoch):
            return []
        self.counters["fenced"] += 1
        return [
            Refuse(
                ErrorCode.FENCED,
                f"server {self.me}, shard {shard}: a {what} of epoch {epoch} is late: this "
                f"log took the primary of epoch {log.fence}'s since",
            )
        ]

    def _not_caught_up(self, shard: int, epoch: int, what: str) -> list:
        """``what`` refused (``NEED_SYNC``: the primary drops this copy, or refuses its round,
        and catches it up) when it comes from a primary newer than any ``shard``'s log took
        something from: a copy it kept in ``in_sync`` while away, not caught up in its epoch
        (:meth:`~hogwild_plugins.ps.shard_log.ShardLog.caught_up_by`)."""
        self.counters["not_caught_up"] += 1
        return [
            Refuse(
                ErrorCode.NEED_SYNC,
                f"server {self.me}, shard {shard}: a {what} of epoch {epoch} before that "
                f"primary caught this log up (it holds the state of epoch {self.logs[shard].fence}"
                "'s primary): catch it up first",
            )
        ]

    def _prepare(self, s: PrepareArrived) -> list:
        stopped = self._stopped(s, "PREPARE") or self._late(s.shard, s.epoch, "PREPARE")
        if stopped:
            return stopped
        log = self.logs[s.shard]
        if not log.caught_up_by(s.epoch):
            return self._not_caught_up(s.shard, s.epoch, "PREPARE")
        if not log.prepare(s.version, s.item, s.epoch):
            return [
                Refuse(
                    ErrorCode.NEED_SYNC,
                    f"shard {s.shard}: version {s.version} does not follow {log.last} here",
                )
            ]
        self.counters["prepared"] += 1
        return [Acknowledge(s.version)]

    def _commit(self, s: CommitArrived) -> list:
        stopped = self._stopped(s, "COMMIT") or self._late(s.shard, s.epoch, "COMMIT")
        if stopped:
            return stopped
        log = self.logs[s.shard]
        if not log.caught_up_by(s.epoch):
            return self._not_caught_up(s.shard, s.epoch, "COMMIT")
        if s.upto > log.last:
            return [
                Refuse(
                    ErrorCode.NEED_SYNC,
                    f"shard {s.shard}: commit up to {s.upto}, prepared only to {log.last}",
                )
            ]
        wanted = log.committing(s.upto)
        if s.room is not None and wanted > s.room:
            self.counters["no_room"] += 1
            return [
                Refuse(
                    ErrorCode.BUSY,
                    f"server {self.me}, shard {s.shard}: the update queues have room for "
                    f"{s.room} of the {wanted} updates up to {s.upto}; nothing committed",
                )
            ]
        items = commit_log(log, s.upto, s.epoch)
        self.counters["committed"] += len(items)
        works = tuple(work for _, _, work in items)
        return [ApplyCommitted(s.shard, works, log.committed), Acknowledge(log.committed)]

    def _applied(self, s: SnapshotApplied) -> list:
        """A shard's snapshot is in. The bucket is restored (current) only once every one of
        its shards holds a snapshot of that primary's: a process that restarted holds nothing,
        and one shard's snapshot must not let it campaign without the others."""
        self.restored[s.shard] = s.epoch
        done = all(self.restored.get(x) == s.epoch for x in self.bucket_shards[s.bucket])
        restored = [MarkRestored(s.bucket, s.epoch)] if done else []
        return [*restored, Acknowledge(s.version)]

    def _catch_up(self, s: CatchUpArrived) -> list:
        """The log holds the primary's committed state: as good as its snapshot (the updates
        prepared here after it are dropped); otherwise ``NEED_SYNC``, and the primary sends the
        snapshot."""
        stopped = self._stopped(s, "a catch-up") or self._late(s.shard, s.epoch, "catch-up")
        if stopped:  # its log may hold the state, its memory does not
            return stopped
        if s.restoring:  # the log holds the snapshot's state, the memory not yet
            self.counters["catch_up_while_restoring"] += 1
            return [
                Refuse(
                    ErrorCode.BUSY,
                    f"shard {s.shard}: a snapshot's values are still being applied here; "
                    "catch up again later",
                )
            ]
        if s.applying:  # the memory holds more than the log: this side's own round's updates
            self.counters["catch_up_while_applying"] += 1
            return [
                Refuse(
                    ErrorCode.BUSY,
                    f"shard {s.shard}: this server's own round is applying updates its log does "
                    "not count yet; catch up again later",
                )
            ]
        log = self.logs[s.shard]
        if not log.holds(s.version, s.log_epoch):
            return [
                Refuse(
                    ErrorCode.NEED_SYNC,
                    f"shard {s.shard}: holds version {log.committed} of epoch {log.epoch}, not "
                    f"{s.version} of epoch {s.log_epoch}: send the snapshot",
                )
            ]
        log.catch_up(s.epoch)
        self.counters["caught_up"] += 1
        return self._applied(SnapshotApplied(s.shard, s.bucket, s.version, s.epoch, stimulus_id=""))

    def _snapshot(self, s: SnapshotArrived) -> list:
        late = self._late(s.shard, s.epoch, "SNAPSHOT")
        if late:
            return late
        log = self.logs[s.shard]
        if log.outdated(s.version, s.epoch):
            self.counters["outdated_snapshots"] += 1  # applied nowhere: nothing to undo
            # not an acknowledgement: a primary must never take this copy as synced by it
            return [
                Refuse(
                    ErrorCode.NEED_SYNC,
                    f"shard {s.shard}: a snapshot at version {s.version} of epoch "
                    f"{s.epoch} is older than version {log.committed} committed here from the "
                    "same primary; dropped",
                )
            ]
        if not s.room:
            self.counters["no_room"] += 1
            return [
                Refuse(
                    ErrorCode.BUSY,
                    f"server {self.me}, shard {s.shard}: the update queues are full; the "
                    f"snapshot at version {s.version} is not taken",
                )
            ]
        log.restore(s.version, list(s.table), s.epoch)
        return [ApplySnapshot(s.shard, s.version)]
