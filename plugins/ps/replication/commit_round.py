"""A primary's commit round for a batch of client updates: a state machine.

No I/O here (after dask's worker state machine): a :class:`CommitRound` changes only through
:meth:`CommitRound.handle`, which takes a stimulus and returns actions for the replication thread
to carry out (:mod:`~hogwild_plugins.ps.replication.primary_round`; both kinds of record are in
:mod:`~hogwild_plugins.ps.replication.commit_round_events`); what they produce comes back as
the next stimulus. It reads the bucket roles and holds, with the copy side, the shard logs.

One round, for the updates that arrived together (the order of the stimuli):

1. :class:`BatchArrived`: an update of a bucket this server does not serve writes of (not its
   serving primary, fewer than ``min_copies`` copies in sync, or its lease no longer valid) is
   refused (:class:`RefuseNotPrimary`: the client re-reads the map); one
   whose ``(sender, seq)`` the shard's log already holds is answered with the version it got
   (:class:`AnswerDuplicate`), never applied again; the others go to the server's admission
   (:class:`Admit`: a version from the shard book, or a refusal the adapter sends itself).
2. :class:`Admitted`: the admitted updates are sent to every other in-sync copy
   (:class:`SendPrepares`), under the bucket's epoch as it is now.
3. :class:`PreparesAnswered`: every shard's updates are committed, up to the last version, on each
   in-sync copy that took its prepares (:class:`SendCommits`).
4. :class:`CommitsAnswered`: the updates are applied here (:class:`ApplyLocally`, in the
   engine's queues: only now, so that a pull, answered from this memory, never sees an update
   a failover could take back), each copy that failed a prepare or a commit is dropped
   (:class:`DropCopy`: the bucket's role writes it out of ``in_sync`` and re-syncs it), then the
   local application is awaited (:class:`AwaitApplied`).
5. :class:`LocalApplied`: each update is recorded in its shard's log (a re-send is then
   answered), and acknowledged (:class:`Acknowledge`) only if this server is still the bucket's
   primary, its lease still valid, every in-sync copy that failed it was re-synced since (from
   a snapshot holding the round: :meth:`CommitRound.snapshot_point`) and at least
   ``min_copies`` live in-sync copies hold it; otherwise refused as ``NOT_PRIMARY`` (the client
   re-sends; a re-send is answered as a duplicate once the bucket takes writes again).

:meth:`CommitRound.snapshot_point` is what a snapshot of a shard carries as its version and
request table (a snapshot sent while a round is open, to a copy that round dropped, included).
The invariants kept (:meth:`CommitRound.validate_state`): a round is open exactly while it has
updates, each shard's admitted versions rise one by one in the batch's order, and an admitted
update is answered only when the round closes (acknowledged or refused, once).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from enum import Enum

from hogwild_plugins.ps.replication.bucket_role import BucketRole, Role
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
    RoundStimulus,
    SendCommits,
    SendPrepares,
    Update,
)
from hogwild_plugins.ps.shard_log import ShardLog

__all__ = ["CommitRound", "Phase"]

STORY_LENGTH = 1024  # transitions the round remembers (:meth:`CommitRound.story`)


class Phase(Enum):
    IDLE = "idle"  # no round open
    ADMITTING = "admitting"  # waiting for the admission's versions
    PREPARING = "preparing"  # applied here and prepared on the copies: waiting for answers
    COMMITTING = "committing"  # commits out: waiting for answers
    APPLYING = "applying"  # copies dropped: waiting for the local application


# --------------------------------------------------------------------------- the machine


class CommitRound:
    """One primary's commit rounds, one at a time (see the module docstring).

    Args:
        me: This server's index.
        roles: Every bucket's role (read here).
        logs: Every shard's log (shared with the copy side; the adapter's lock guards both).
    """

    def __init__(
        self, me: int, roles: Mapping[int, BucketRole], logs: Mapping[int, ShardLog]
    ) -> None:
        self.me, self.roles, self.logs = me, roles, logs
        self.phase = Phase.IDLE
        self.updates: tuple[Update, ...] = ()
        self.accepted: list[int] = []  # indices admitted, in the batch's order
        self.versions: dict[int, int] = {}  # index -> version
        self.epochs: dict[int, int] = {}  # index -> the bucket's epoch when versioned
        self.failed: set[tuple[int, int]] = set()  # (bucket, copy) that failed this round
        self.answered: set[int] = set()  # indices answered (or left to the admission)
        self.twins: dict[int, int] = {}  # index -> the earlier index of the same request
        self.counters = {"duplicates": 0, "dropped_copies": 0}
        self.transitions: deque = deque(maxlen=STORY_LENGTH)

    def handle(self, stimulus: RoundStimulus) -> list:
        """The one entry: take ``stimulus``, return what to do. Every transition goes into
        :meth:`story`."""
        before = self.phase
        match stimulus:
            case BatchArrived():
                self._expect(Phase.IDLE, stimulus)
                actions = self._arrived(stimulus)
            case Admitted():
                self._expect(Phase.ADMITTING, stimulus)
                actions = self._admitted(stimulus)
            case PreparesAnswered():
                self._expect(Phase.PREPARING, stimulus)
                actions = self._prepared(stimulus)
            case CommitsAnswered():
                self._expect(Phase.COMMITTING, stimulus)
                actions = self._committed(stimulus)
            case LocalApplied():
                self._expect(Phase.APPLYING, stimulus)
                actions = self._applied(stimulus)
            case _:
                raise TypeError(f"commit round: not a stimulus: {stimulus!r}")
        self.transitions.append(
            (stimulus.stimulus_id, type(stimulus).__name__, before, self.phase, tuple(actions))
        )
        return actions

    def story(self) -> list[tuple]:
        """The last transitions, oldest first: ``(stimulus_id, stimulus, phase before, phase
        after, actions)``."""
        return list(self.transitions)

    def snapshot_point(self, shard: int) -> tuple[int, list[tuple[int, int, int]]]:
        """What a snapshot of ``shard`` taken now carries: its version and its request table
        (``(sender, seq, version)`` triples). Between rounds, the log's committed version and
        table. While a round is open past its admission, the values a snapshot reads (after the
        engine's barrier) hold the round's updates of the shard too, applied here first: so do
        its version (the round's last of the shard) and its table (a re-send of one of them is
        answered by the copy, never applied again)."""
        log = self.logs[shard]
        version, table = log.committed, log.table()
        if self.phase is not Phase.APPLYING:
            return version, table
        mine = [i for i in self.accepted if self.updates[i].shard == shard]
        for i in mine:
            u = self.updates[i]
            table.append((u.sender, u.seq, self.versions[i]))
        if mine:
            version = max(version, self.versions[mine[-1]])
        return version, table

    def validate_state(self) -> None:
        """Check the round's invariants (tests call it after every stimulus).

        Raises:
            AssertionError: An invariant broken, with the last transitions.
        """

        def check(ok: bool, what: str) -> None:
            if not ok:
                raise AssertionError(f"commit round on {self.me}: {what}; {self.story()[-5:]}")

        idle = self.phase is Phase.IDLE
        if idle != (not self.updates):
            check(False, f"{self.phase.value} with {len(self.updates)} updates")
        if idle:
            check(not (self.accepted or self.versions or self.failed), "idle with a round open")
            return
        n = len(self.updates)
        check(all(0 <= i < n for i in self.answered | set(self.accepted)), "an index beyond")
        check(not self.answered & set(self.accepted), "an admitted update answered early")
        check(all(self.twins[i] < i for i in self.twins), "a re-send before its first")
        check(not set(self.twins) & set(self.accepted), "a re-send in the same batch admitted")
        if self.phase is not Phase.ADMITTING:
            if not self.accepted:
                check(False, f"{self.phase.value} with nothing admitted")
            check(set(self.versions) == set(self.accepted), "admitted without a version")
            last: dict[int, int] = {}
            for i in self.accepted:
                shard = self.updates[i].shard
                check(
                    shard not in last or self.versions[i] == last[shard] + 1,
                    f"shard {shard}: version {self.versions[i]} after {last.get(shard)}",
                )
                last[shard] = self.versions[i]

    def _expect(self, phase: Phase, stimulus: RoundStimulus) -> None:
        if self.phase is not phase:
            raise RuntimeError(
                f"commit round on {self.me}: {type(stimulus).__name__} in phase "
                f"{self.phase.value} (expected {phase.value})"
            )

    def _serving(self, bucket: int, lease_valid: bool) -> bool:
        return self.roles[bucket].writable and lease_valid

    def _arrived(self, s: BatchArrived) -> list:
        actions, candidates, firsts, twins = [], [], {}, {}
        for i, u in enumerate(s.updates):
            if not self._serving(u.bucket, s.lease_valid):
                actions.append(RefuseNotPrimary(i))
                continue
            seen = self.logs[u.shard].seen(u.sender, u.seq)
            if seen is not None:
                self.counters["duplicates"] += 1
                actions.append(AnswerDuplicate(i, seen))
                continue
            first = firsts.setdefault((u.sender, u.seq, u.shard), i)
            if first != i:  # a re-send in the same batch: answered as its first is, not applied
                self.counters["duplicates"] += 1
                twins[i] = first
                continue
            candidates.append(i)
        if not candidates:
            return actions
        self.updates, self.twins = s.updates, twins
        self.answered = set(range(len(s.updates))) - set(candidates) - set(twins)
        self.phase = Phase.ADMITTING
        return [*actions, Admit(tuple(candidates))]

    def _admitted(self, s: Admitted) -> list:
        self.accepted = sorted(s.versions)
        self.versions = dict(s.versions)
        refused = {i for i in range(len(self.updates)) if i not in self.versions}
        self.answered |= refused - set(self.twins)
        # a re-send whose first the admission refused: refused too (the client sends it again)
        twins = [RefuseNotPrimary(i) for i, first in sorted(self.twins.items()) if first in refused]
        self.answered |= {t.index for t in twins}
        if not self.accepted:
            self._close()
            return twins
        prepares = []
        for i in self.accepted:
            self.epochs[i] = self.roles[self.updates[i].bucket].epoch
        for i in self.accepted:
            role = self.roles[self.updates[i].bucket]
            prepares += [(i, copy) for copy in role.record.in_sync if copy != self.me]
        self.phase = Phase.PREPARING
        return [*twins, SendPrepares(tuple(prepares))]

    def _prepared(self, s: PreparesAnswered) -> list:
        self.failed = set(s.failed)
        upto: dict[int, int] = {}
        for i in self.accepted:
            shard = self.updates[i].shard
            upto[shard] = max(upto.get(shard, 0), self.versions[i])
        commits = []
        for shard, version in upto.items():
            role = self.roles[self._bucket_of(shard)]
            for copy in role.record.in_sync:
                if copy != self.me and (role.bucket, copy) not in self.failed:
                    commits.append((shard, copy, version))
        self.phase = Phase.COMMITTING
        return [SendCommits(tuple(commits))]

    def _committed(self, s: CommitsAnswered) -> list:
        self.failed |= s.failed
        self.counters["dropped_copies"] += len(self.failed)
        self.phase = Phase.APPLYING
        # applied here only now: a pull (answered from this memory) sees an update only once
        # every in-sync copy that is kept committed it, so no failover takes it back
        drops = [DropCopy(b, c) for b, c in sorted(self.failed)]
        mine = tuple(i for i in self.accepted if self.ours(i))
        return [ApplyLocally(mine), *drops, AwaitApplied()]

    def applying(self, shard: int) -> bool:
        """Whether this round is applying updates of ``shard`` to this server's memory that its
        log does not count yet (between its commits' answers and ``LocalApplied``): the log is
        behind the memory meanwhile, so no primary may take it for the memory's state (a
        catch-up waits)."""
        return self.phase is Phase.APPLYING and any(
            self.updates[i].shard == shard for i in self.accepted
        )

    def ours(self, index: int) -> bool:
        """Whether update ``index`` may still be applied here: no newer primary's snapshot
        replaced its shard meanwhile (this side was deposed while the round was out; applied
        on top of that state, the update would be there twice), nor did a newer primary's
        catch-up find the shard's log holding its committed state (applied, the update would
        sit in this memory beyond what that primary counts this copy as holding, under a
        version it gives another update). The adapter asks again under the lock, as it queues
        the update."""
        return not self.logs[self.updates[index].shard].stale(self.epochs[index])

    def _applied(self, s: LocalApplied) -> list:
        actions = []
        for i in self.accepted:
            u = self.updates[i]
            role = self.roles[u.bucket]
            # applied here: a re-send is answered, never applied again
            self.logs[u.shard].applied(u.sender, u.seq, self.versions[i], self.epochs[i])
            # a copy that failed the round and is in sync again got a snapshot since, taken
            # with the round's updates in it (:meth:`snapshot_point`): it holds them
            lost = [
                c
                for c in role.record.in_sync
                if (role.bucket, c) in self.failed and c not in role.confirmed
            ]
            held = role.holders - sum(1 for c in lost if c in role.members)
            if role.role is not Role.PRIMARY or not s.lease_valid or lost or held < role.min_copies:
                answers = [RefuseNotPrimary(j) for j in (i, *self._twins_of(i))]
            else:
                answers = [Acknowledge(j, self.versions[i]) for j in (i, *self._twins_of(i))]
            actions += answers
        self._close()
        return actions

    def _twins_of(self, index: int) -> list[int]:
        return [i for i, first in sorted(self.twins.items()) if first == index]

    def _bucket_of(self, shard: int) -> int:
        return next(self.updates[i].bucket for i in self.accepted if self.updates[i].shard == shard)

    def _close(self) -> None:
        self.phase = Phase.IDLE
        self.updates, self.accepted, self.versions, self.epochs = (), [], {}, {}
        self.failed, self.answered, self.twins = set(), set(), {}
