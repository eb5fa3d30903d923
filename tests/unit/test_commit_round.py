"""A primary's commit round (plugins/ps/replication/commit_round.py), with no socket and no
thread: which updates are refused, answered as duplicates or admitted, what is prepared and
committed where, which copies are dropped, when an update is acknowledged; every stimulus
followed by ``validate_state``, and seeded random rounds checked against what the round promises
its clients.

:class:`Adapter` carries the round's actions out the way the replication thread does, against
the bucket roles of ``tests/unit/bucket_role_support.py`` (etcd's transactions stand in) and a
shard book that gives each shard's next version.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hogwild_plugins.ps.replication.bucket_role_events import CopyUnreachable, MapRead
from hogwild_plugins.ps.replication.commit_round import CommitRound, Phase
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
from hogwild_plugins.ps.replication.copy_side import CopySide
from hogwild_plugins.ps.replication.copy_side_events import CommitArrived, PrepareArrived, Refuse
from hogwild_plugins.ps.shard_log import ShardLog

from hogwild.net.wire import ErrorCode
from tests.unit.bucket_role_support import BUCKET, LEASE, carry_out, established, live, step

SHARDS = (20, 21)
_ids = itertools.count()


class Adapter:
    """One established bucket's primary and its round, carried out as the replication thread
    does. ``prepare_fails``/``commit_fails``: the copies that fail this round's prepares or
    commits; ``stale``: the updates (indices) the admission refuses; ``valid``: the lease."""

    def __init__(self) -> None:
        self.roles, self.keys, self.primary = established()
        self.role = self.roles[self.primary]
        self.logs = {s: ShardLog() for s in SHARDS}
        self.round = CommitRound(self.primary, {BUCKET: self.role}, self.logs)
        self.book = dict.fromkeys(SHARDS, 0)
        self.answers: dict[int, object] = {}
        self.prepared: list[tuple[int, int]] = []
        self.commits: list[tuple[int, int, int]] = []
        self.snapshots: list[tuple] = []  # (copy, shard, version, table) per shard and Sync
        self.reachable = lambda copy: True  # which copies a snapshot reaches

    @property
    def copies(self) -> list[int]:
        return [s for s in self.keys.read().in_sync if s != self.primary]

    def feed(self, stimulus) -> list:
        actions = self.round.handle(stimulus)
        self.round.validate_state()
        self.role.validate_state()
        return actions

    def run(self, updates, prepare_fails=(), commit_fails=(), stale=(), valid=True) -> list:
        """One batch through the round; every action carried out, in order."""
        done, todo = [], self.feed(BatchArrived(tuple(updates), valid, stimulus_id=self.sid()))
        while todo:
            action = todo.pop(0)
            done.append(action)
            if isinstance(action, RefuseNotPrimary | AnswerDuplicate | Acknowledge):
                assert action.index not in self.answers, "answered twice"
                self.answers[action.index] = action
            elif isinstance(action, Admit):
                versions = {}
                for i in action.indices:
                    if i in stale:
                        self.answers[i] = "stale"
                        continue
                    shard = updates[i].shard
                    self.book[shard] += 1
                    versions[i] = self.book[shard]
                todo += self.feed(Admitted(versions, stimulus_id=self.sid()))
            elif isinstance(action, SendPrepares):
                self.prepared += action.prepares
                failed = {(BUCKET, c) for _, c in action.prepares if c in prepare_fails}
                todo += self.feed(PreparesAnswered(frozenset(failed), stimulus_id=self.sid()))
            elif isinstance(action, SendCommits):
                self.commits += action.commits
                failed = {(BUCKET, c) for _, c, _ in action.commits if c in commit_fails}
                todo += self.feed(CommitsAnswered(frozenset(failed), stimulus_id=self.sid()))
            elif isinstance(action, DropCopy):
                carry_out(
                    self.role,
                    step(self.role, CopyUnreachable, action.copy),
                    self.keys,
                    self.roles,
                    reachable=self.snapshot,
                )
            elif isinstance(action, AwaitApplied):
                todo += self.feed(LocalApplied(valid, stimulus_id=self.sid()))
            else:
                assert isinstance(action, ApplyLocally)
        assert self.round.phase is Phase.IDLE
        assert set(self.answers) >= set(range(len(updates))), "an update left unanswered"
        return done

    def snapshot(self, copy: int) -> bool:
        """A :class:`Sync` to ``copy``: record what the snapshot of each shard carries."""
        if not self.reachable(copy):
            return False
        for shard in SHARDS:
            version, table = self.round.snapshot_point(shard)
            self.snapshots.append((copy, shard, version, table))
        return True

    @staticmethod
    def sid() -> str:
        return f"round-{next(_ids)}"


def updates(*seqs: int, shard: int = SHARDS[0], sender: int = 7) -> list[Update]:
    return [Update(sender, seq, shard, BUCKET) for seq in seqs]


def test_a_round_prepares_and_commits_on_every_in_sync_copy_then_acknowledges():
    a = Adapter()
    batch = updates(1, 2) + updates(1, shard=SHARDS[1])
    done = a.run(batch)
    assert ApplyLocally((0, 1, 2)) in done
    assert a.prepared == [(i, c) for i in range(3) for c in a.copies]
    assert sorted(a.commits) == sorted(
        (shard, c, v) for shard, v in ((SHARDS[0], 2), (SHARDS[1], 1)) for c in a.copies
    )
    assert a.answers == {0: Acknowledge(0, 1), 1: Acknowledge(1, 2), 2: Acknowledge(2, 1)}
    assert a.logs[SHARDS[0]].seen(7, 2) == 2 and a.logs[SHARDS[0]].committed == 2


def test_a_re_sent_update_is_answered_with_its_version_and_not_applied_again():
    a = Adapter()
    a.run(updates(1, 2))
    a.answers = {}
    done = a.run(updates(2, 3))
    assert a.answers[0] == AnswerDuplicate(0, 2) and a.answers[1] == Acknowledge(1, 3)
    assert ApplyLocally((1,)) in done and a.round.counters["duplicates"] == 1


def test_a_late_copy_older_than_the_clients_window_is_answered_not_applied_again():
    """A client's re-send that a cut host's TCP buffers delivered seconds late, after more than
    the window of that client's later updates were applied (issue 38's cut runs: it took a
    version of its own and was applied twice on every copy)."""
    a = Adapter()
    a.logs[SHARDS[0]].window = 2
    for seq in (1, 2, 3):
        a.answers = {}
        a.run(updates(seq))
    a.answers = {}
    done = a.run(updates(1))
    assert a.answers[0] == AnswerDuplicate(0, 0)  # answered long ago: its version forgotten
    assert not any(isinstance(action, Admit) for action in done)
    assert a.logs[SHARDS[0]].committed == 3


def test_without_a_valid_lease_nothing_is_admitted():
    a = Adapter()
    done = a.run(updates(1, 2), valid=False)
    assert done == [RefuseNotPrimary(0), RefuseNotPrimary(1)]
    assert a.book[SHARDS[0]] == 0


def test_an_update_the_admission_refuses_goes_no_further():
    a = Adapter()
    done = a.run(updates(1, 2), stale={0})
    assert ApplyLocally((1,)) in done and a.answers[0] == "stale"
    assert a.answers[1] == Acknowledge(1, 1)
    a.answers = {}
    assert a.run(updates(3), stale={0}) == [Admit((0,))]  # nothing admitted: the round closes


def test_a_copy_that_fails_a_prepare_gets_no_commit_and_is_re_synced_with_the_round_in_it():
    a = Adapter()
    lost = a.copies[0]
    done = a.run(updates(1, 2), prepare_fails={lost})
    assert all(c != lost for _, c, _ in a.commits)
    assert DropCopy(BUCKET, lost) in done and a.round.counters["dropped_copies"] == 1
    # written out, synced from a snapshot that holds the round's updates, written back: every
    # in-sync copy holds them, and they are acknowledged
    assert lost in a.keys.read().in_sync and a.role.serving
    assert (lost, SHARDS[0], 2, [(7, 1, 1), (7, 2, 2)]) in a.snapshots
    assert a.answers == {0: Acknowledge(0, 1), 1: Acknowledge(1, 2)}
    assert a.logs[SHARDS[0]].seen(7, 2) == 2


def test_a_copy_that_fails_a_prepare_and_its_snapshot_leaves_in_sync():
    a = Adapter()
    lost = a.copies[0]
    a.reachable = lambda copy: copy != lost
    a.run(updates(1, 2), prepare_fails={lost})
    assert lost not in a.keys.read().in_sync and not a.snapshots
    assert a.answers == {0: Acknowledge(0, 1), 1: Acknowledge(1, 2)}


def test_a_primary_deposed_during_the_round_acknowledges_nothing():
    a = Adapter()
    todo = a.feed(BatchArrived(tuple(updates(1)), True, stimulus_id=a.sid()))
    assert todo == [Admit((0,))]
    a.feed(Admitted({0: 1}, stimulus_id=a.sid()))
    # its own clock says its lease lapsed: it steps down while the prepares are out
    step(a.role, MapRead, a.keys.read(), live(range(3)), LEASE[a.primary], False)
    a.feed(PreparesAnswered(frozenset(), stimulus_id=a.sid()))
    a.feed(CommitsAnswered(frozenset(), stimulus_id=a.sid()))
    assert a.feed(LocalApplied(True, stimulus_id=a.sid())) == [RefuseNotPrimary(0)]


def test_a_deposed_primarys_round_leaves_a_log_its_successor_caught_up_alone():
    """Deposed while its round's prepares were out, this server was caught up by the primary of
    the next epoch (its log holds that primary's committed state). The round's update, applied
    here, would sit in memory beyond what that primary counts this copy as holding, under the
    version it gives its own next update: not applied, not recorded, not acknowledged."""
    a = Adapter()
    epoch = a.role.epoch
    a.feed(BatchArrived(tuple(updates(1)), True, stimulus_id=a.sid()))
    a.feed(Admitted({0: 1}, stimulus_id=a.sid()))
    step(a.role, MapRead, a.keys.read(), live(range(3)), LEASE[a.primary], False)
    a.logs[SHARDS[0]].catch_up(epoch + 1)
    a.feed(PreparesAnswered(frozenset(), stimulus_id=a.sid()))
    [apply, _] = a.feed(CommitsAnswered(frozenset(), stimulus_id=a.sid()))
    assert apply == ApplyLocally(()) and not a.round.ours(0)
    assert a.feed(LocalApplied(True, stimulus_id=a.sid())) == [RefuseNotPrimary(0)]
    assert a.logs[SHARDS[0]].committed == 0 and a.logs[SHARDS[0]].seen(7, 1) is None


def test_a_round_applying_a_shard_says_so_until_its_log_counts_what_it_applied():
    """Between its commits' answers and the local application's end, this server's memory holds
    more of a shard than its log counts: no catch-up may take that log for it meanwhile."""
    a = Adapter()
    a.feed(BatchArrived(tuple(updates(1)), True, stimulus_id=a.sid()))
    a.feed(Admitted({0: 1}, stimulus_id=a.sid()))
    a.feed(PreparesAnswered(frozenset(), stimulus_id=a.sid()))
    assert not a.round.applying(SHARDS[0])
    a.feed(CommitsAnswered(frozenset(), stimulus_id=a.sid()))
    assert a.round.applying(SHARDS[0]) and not a.round.applying(SHARDS[1])
    a.feed(LocalApplied(True, stimulus_id=a.sid()))
    assert not a.round.applying(SHARDS[0]) and a.logs[SHARDS[0]].committed == 1


def test_a_newer_primarys_prepare_while_this_sides_round_applies_is_refused():
    """A hole found while looking for issue 38's doubles (not their cause: that was a late copy
    of a re-send, ``test_a_late_copy_older_than_the_clients_window_...``). A primary cut off from
    its copies and etcd applies its round's update here once every copy failed it, and is
    deposed before it records it; a newer primary that never caught this log up sends a PREPARE
    of the shard's next version (the client's re-send of that update). Taken, that PREPARE would
    fence the log: the round's update recorded nowhere (``ShardLog.applied`` finds it stale)
    though in memory, the new primary's COMMIT applying it a second time, and the log then
    matching that primary's, so that no catch-up replaced this memory. Refused, the round
    records what it applied, and the new primary's catch-up finds a log that is not its state:
    a snapshot replaces it."""
    a = Adapter()
    epoch, shard = a.role.epoch, SHARDS[0]
    a.feed(BatchArrived(tuple(updates(1)), True, stimulus_id=a.sid()))
    a.feed(Admitted({0: 1}, stimulus_id=a.sid()))
    a.feed(PreparesAnswered(frozenset((BUCKET, c) for c in a.copies), stimulus_id=a.sid()))
    apply = a.feed(CommitsAnswered(frozenset(), stimulus_id=a.sid()))[0]
    assert apply == ApplyLocally((0,)) and a.round.applying(shard)  # in this memory now
    side = CopySide(a.primary, {BUCKET: a.role}, a.logs, {BUCKET: SHARDS})
    for stimulus in (
        PrepareArrived(shard, 1, (7, 1, None), epoch + 1, stimulus_id=a.sid()),
        CommitArrived(shard, 1, epoch + 1, stimulus_id=a.sid()),
    ):
        [refused] = side.handle(stimulus)
        side.validate_state()
        assert isinstance(refused, Refuse) and refused.code is ErrorCode.NEED_SYNC
    # its lease lapsed by its own clock while cut off: refused, but applied and recorded here
    assert a.feed(LocalApplied(False, stimulus_id=a.sid())) == [RefuseNotPrimary(0)]
    log = a.logs[shard]
    assert (log.committed, log.epoch, log.seen(7, 1), log.prepared) == (1, epoch, 1, [])
    assert not log.holds(0, epoch) and side.counters["not_caught_up"] == 2


def test_a_stimulus_out_of_its_phase_is_a_bug():
    a = Adapter()
    with pytest.raises(RuntimeError, match="expected admitting"):
        a.round.handle(Admitted({}, stimulus_id="late"))


def test_a_copy_re_synced_mid_round_gets_a_snapshot_holding_the_rounds_version():
    a = Adapter()
    lost = a.copies[0]
    a.run(updates(1, 2), prepare_fails={lost})
    copy, shard, version, table = a.snapshots[0]  # the round's shard (the other one is empty)
    assert (copy, shard) == (lost, SHARDS[0])
    # The barrier before the snapshot waits for the round's local application: the values it
    # carries hold versions 1 and 2 of the shard, and so must its version and request table.
    assert version == 2 and (7, 2, 2) in table


SEEDS = 300


def test_random_rounds_answer_every_update_once_and_acknowledge_only_what_every_copy_holds():
    """Each seed replays a few random batches (a failing seed names itself)."""
    for seed in range(SEEDS):
        try:
            run_random_rounds(seed)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}: {exc}") from exc


def run_random_rounds(seed: int) -> None:
    rng = random.Random(seed)
    a = Adapter()
    versions: dict[tuple[int, int], int] = {}  # (shard, seq) -> the version acknowledged
    for _ in range(4):
        batch = [
            Update(rng.randrange(2), rng.randrange(12), rng.choice(SHARDS), BUCKET)
            for _ in range(rng.randrange(1, 6))
        ]
        copies = a.copies
        prepare_fails = {c for c in copies if rng.random() < 0.15}
        commit_fails = {c for c in copies if rng.random() < 0.1}
        stale = {i for i in range(len(batch)) if rng.random() < 0.1}
        valid = rng.random() < 0.9
        a.answers = {}
        before = len(a.snapshots)
        a.run(batch, prepare_fails, commit_fails, stale, valid)
        for i, answer in a.answers.items():
            u = batch[i]
            if isinstance(answer, Acknowledge):
                assert valid
                # every in-sync copy that failed the round got a snapshot holding the update
                for c in (prepare_fails | commit_fails) & set(a.keys.read().in_sync):
                    assert any(
                        (copy, shard) == (c, u.shard) and version >= answer.version
                        for copy, shard, version, _ in a.snapshots[before:]
                    )
                versions[(u.sender, u.seq, u.shard)] = answer.version
            elif isinstance(answer, AnswerDuplicate):
                # a re-send gets the version its first application got
                assert a.logs[u.shard].seen(u.sender, u.seq) == answer.version
                key = (u.sender, u.seq, u.shard)
                assert versions.get(key, answer.version) == answer.version
        for shard in SHARDS:
            assert a.logs[shard].committed == a.book[shard]  # recorded what was applied


def test_below_min_copies_nothing_is_acknowledged_and_the_last_copy_stays_in_sync():
    a = Adapter()
    a.role.min_copies = 2
    first, second = a.copies
    a.reachable = lambda copy: False  # both copies stalled: their snapshots fail too
    a.run(updates(1), prepare_fails={first, second})
    # one is written out; the other stays in in_sync (not caught up): the bucket serves nothing
    in_sync = a.keys.read().in_sync
    assert len(in_sync) == 2 and a.primary in in_sync
    assert a.answers == {0: RefuseNotPrimary(0)} and not a.role.serving
    a.answers = {}
    assert a.run(updates(1)) == [RefuseNotPrimary(0)]  # a re-send waits too
