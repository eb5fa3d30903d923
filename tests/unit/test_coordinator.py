"""The cluster coordinator's epochs, through every rule, without a socket or a process.

Portions handed out on demand (shrinking, tiling each epoch's permutation, one held ahead, a
faster replica taking more, the replicas finishing an epoch within one small
portion of each other where fixed shards leave the slower one's difference); fixed shards for a
coordinated topology; every replica starts once all joined; warm start (replica 0 alone until it
trained ``warm_start`` examples, or finished what it may take); the epoch rule across replicas
(the others closed once enough finished, what was not handed out dropped, replicas that never
started skipped); late and repeated answers ignored; resume from a later epoch; the end; a
replica that dies (what it held handed out again, whole, or dropped once the epoch is closed;
never counted twice, never waited for); a status answer read into events, its bad fields left
out; the transition log and the invariants checked after every step.
"""

from __future__ import annotations

import math

import pytest

from hogwild.cluster.coordinator import (
    Close,
    Coordinator,
    EpochEnd,
    Finished,
    Joined,
    Lost,
    PortionDone,
    Progress,
    StartPortion,
    status_events,
)


@pytest.fixture(autouse=True)
def validated(monkeypatch):
    """Every test checks the coordinator's invariants after every step it takes."""
    handle, advance = Coordinator.handle, Coordinator.advance

    def checked(step):
        def run(self, *args):
            out = step(self, *args)
            self.validate_state()
            return out

        return run

    monkeypatch.setattr(Coordinator, "handle", checked(handle))
    monkeypatch.setattr(Coordinator, "advance", checked(advance))


def make(replicas=2, **kw) -> Coordinator:
    options = dict(n_train=1000, epochs=2, start_epoch=0, seed=1, lr_of=lambda e: 0.1 / (e + 1))
    return Coordinator(replicas, **{**options, **kw})


def shards(replicas=2, **kw) -> Coordinator:
    return make(replicas, guided=False, **kw)


def join_all(c: Coordinator) -> list:
    out = []
    for r in range(c.replicas):
        out += c.handle(Joined(r))
    return out


def done(r, epoch, start, n=500):
    return PortionDone(r, epoch, start, n, loss=0.5 * n, correct=n // 2)


def finish(c: Coordinator, start: StartPortion, n: int | None = None) -> list:
    """``start``'s portion done, all of it (or ``n`` examples)."""
    size = start.stop - start.start if n is None else n
    return c.handle(done(start.replica, start.epoch, start.start, size))


# -- fixed shards (a coordinated topology) ------------------------------------------------------


def test_shards_tile_the_permutation_and_everyone_starts_once_all_joined():
    c = shards(replicas=3)
    assert c.handle(Joined(0)) == [] and c.handle(Joined(2)) == []
    starts = c.handle(Joined(1))
    assert [type(i) for i in starts] == [StartPortion] * 3
    assert [(s.start, s.stop) for s in starts] == [(0, 333), (333, 667), (667, 1000)]
    assert {s.epoch for s in starts} == {0} and {s.lr for s in starts} == {0.1}
    assert len({s.seed for s in starts}) == 3


def test_an_epoch_ends_when_every_replica_answered_then_advances_and_finishes():
    c = shards()
    join_all(c)
    assert c.handle(done(0, 0, 0)) == []
    (end,) = c.handle(done(1, 0, 500, 400))
    assert isinstance(end, EpochEnd)
    assert (end.epoch, end.examples, end.correct) == (0, 900, 450)
    assert end.per_replica == {0: 500, 1: 400}
    nxt = c.advance()
    assert [(s.replica, s.epoch, s.lr) for s in nxt] == [(0, 1, 0.05), (1, 1, 0.05)]
    c.handle(done(0, 1, 0))
    c.handle(done(1, 1, 500))
    assert c.advance() == [Finished()]
    assert c.handle(Joined(1)) == []  # nothing after the end


def test_warm_start_trains_replica_0_alone_until_its_examples():
    c = shards(replicas=3, warm_start=200)
    (only,) = join_all(c)
    assert only.replica == 0
    assert c.handle(Progress(0, 0, 0, 150)) == []
    joined = c.handle(Progress(0, 0, 0, 210))
    assert sorted(s.replica for s in joined) == [1, 2]
    assert c.handle(Progress(0, 0, 0, 300)) == []  # nobody is started twice


def test_warm_start_ends_when_replica_0_finishes_its_shard_first():
    c = shards(warm_start=10_000)
    join_all(c)
    out = c.handle(done(0, 0, 0))
    assert [type(i) for i in out] == [StartPortion] and out[0].replica == 1


def test_warm_start_applies_only_to_a_fresh_jobs_first_epoch():
    assert len(join_all(shards(warm_start=200, start_epoch=1))) == 2  # a resumed job: everyone


def test_the_epoch_rule_closes_the_stragglers_and_skips_who_never_started():
    c = shards(replicas=4, fraction=0.5)
    join_all(c)
    assert c.handle(done(1, 0, 250, 250)) == []
    out = c.handle(done(3, 0, 750, 250))
    assert out == [Close(0, 0), Close(2, 0)]
    assert c.handle(done(0, 0, 0, 100)) == []
    (end,) = c.handle(done(2, 0, 500, 80))
    assert end.examples == 250 + 250 + 100 + 80
    warm = shards(replicas=3, fraction=0.3, warm_start=10_000)  # 1 finished shard closes it
    join_all(warm)
    out = warm.handle(done(0, 0, 0, 333))  # replicas 1 and 2 never started: nothing to wait for
    assert [type(i) for i in out] == [EpochEnd]


def test_late_and_duplicate_answers_change_nothing():
    c = shards()
    join_all(c)
    c.handle(done(0, 0, 0))
    assert c.handle(done(0, 0, 0)) == []  # twice
    assert c.handle(done(1, 0, 0)) == []  # not its portion
    c.handle(done(1, 0, 500))
    c.advance()
    assert c.handle(done(0, 0, 0)) == [] and c.handle(Progress(1, 0, 500, 99)) == []  # over
    assert c.state_of(0) == "training"
    with pytest.raises(TypeError):
        c.handle(object())


def test_resume_starts_at_the_checkpointed_epoch():
    c = shards(start_epoch=1)
    starts = join_all(c)
    assert {s.epoch for s in starts} == {1}
    c.handle(done(0, 1, 0))
    c.handle(done(1, 1, 500))
    assert c.advance() == [Finished()]


def test_a_dead_replicas_shard_is_handed_out_again_whole_when_it_rejoins():
    c = shards()
    join_all(c)
    c.handle(Progress(1, 0, 500, 300))
    assert c.handle(Lost(1)) == [] and c.state_of(1) == "waiting"
    assert c.handle(done(0, 0, 0)) == []  # fraction 1: the epoch waits for replica 1's shard
    (again,) = c.handle(Joined(1))
    assert (again.replica, again.epoch, again.start, again.stop) == (1, 0, 500, 1000)
    c.handle(Progress(1, 0, 500, 100))
    (end,) = c.handle(done(1, 0, 500))
    assert end.examples == 1000 and end.per_replica == {0: 500, 1: 500}  # not 300 + 500


def test_a_replica_dead_after_the_epoch_closed_counts_as_done_with_nothing():
    c = shards(replicas=3, fraction=0.5)
    join_all(c)
    c.handle(done(0, 0, 0, 333))
    assert c.handle(done(1, 0, 333, 334)) == [Close(2, 0)]
    c.handle(Progress(2, 0, 667, 40))
    (end,) = c.handle(Lost(2))  # the answer it owed will not come: the epoch ends
    assert isinstance(end, EpochEnd) and end.examples == 667 and end.per_replica[2] == 0
    assert [s.replica for s in c.advance()] == [0, 1]  # replica 2 is not back yet
    (late,) = c.handle(Joined(2))
    assert (late.replica, late.epoch) == (2, 1)


def test_a_replica_still_away_when_the_epoch_closes_is_skipped():
    c = shards(replicas=3, fraction=0.5)
    join_all(c)
    c.handle(Lost(2))
    c.handle(done(0, 0, 0, 333))
    (end,) = c.handle(done(1, 0, 333, 334))
    assert isinstance(end, EpochEnd) and end.per_replica == {0: 333, 1: 334, 2: 0}
    assert c.handle(Joined(2)) == []  # nothing until the next epoch begins


def test_a_warm_start_ends_when_replica_0_dies():
    c = shards(replicas=3, warm_start=10_000)
    join_all(c)
    out = c.handle(Lost(0))
    assert sorted(s.replica for s in out) == [1, 2]
    (again,) = c.handle(Joined(0))
    assert again.replica == 0 and again.start == 0


def test_remaining_counts_down_a_portion_and_the_warm_start_and_is_zero_once_closed():
    c = shards(warm_start=100)
    join_all(c)  # replica 0 trains alone: its next event is the warm start's end
    assert c.remaining(0) == 100 and c.remaining(1) is None  # replica 1 trains nothing yet
    c.handle(Progress(0, 0, 0, 60))
    assert c.remaining(0) == 40
    c.handle(Progress(0, 0, 0, 120))  # past the warm start: replica 1 starts
    assert c.remaining(0) == 500 - 120 and c.remaining(1) == 500
    assert c.current(1) == 500
    c = shards(fraction=0.5)
    join_all(c)
    c.handle(done(0, 0, 0))
    assert c.remaining(0) is None and c.current(0) is None  # done: nothing to train
    assert c.remaining(1) == 0  # closed: it stops at its next chunk


# -- portions on demand ---------------------------------------------------------------------


def test_portions_tile_the_permutation_shrinking_to_the_smallest():
    c = make(n_train=60_000, min_portion=512)
    plan = c.plan()
    assert plan[0] == (0, 15_000)  # the part left over twice the replicas
    assert all(a[1] == b[0] for a, b in zip(plan, plan[1:], strict=False)) and plan[-1][1] == 60_000
    sizes = [stop - start for start, stop in plan]
    assert sizes == sorted(sizes, reverse=True) and min(sizes[:-1]) == 512
    assert make(replicas=1, n_train=60_000).plan() == [(0, 60_000)]  # nobody to balance


def test_each_replica_holds_one_portion_ahead():
    c = make(n_train=60_000, min_portion=512)
    starts = join_all(c)
    # everyone's current portion first, then one ahead each
    assert [(s.replica, s.start) for s in starts] == [(0, 0), (1, 15_000), (0, 26_250), (1, 34_688)]
    assert len({s.seed for s in starts}) == 4
    out = finish(c, starts[1])  # replica 1 finished one: it takes the next, still one ahead
    assert [(s.replica, s.start) for s in out] == [(1, 41_016)]
    assert c.current(1) == 34_688 and c.remaining(1) == 41_016 - 34_688


def simulate(c: Coordinator, speeds: dict[int, float]) -> dict[int, float]:
    """Replicas training what they hold in order at ``speeds`` (examples/s), every answer
    handled at once: when each replica ran out of work in epoch 0."""
    clock: dict[int, float] = {r: 0.0 for r in speeds}
    queues: dict[int, list[StartPortion]] = {r: [] for r in speeds}
    idle_at: dict[int, float] = {}

    def take(instructions):
        for i in instructions:
            if isinstance(i, StartPortion):
                queues[i.replica].append(i)
            elif isinstance(i, EpochEnd):
                return i
        return None

    end = take(join_all(c))
    for _ in range(10_000):  # bounded: every step finishes one portion
        if end is not None:
            return idle_at
        busy = [r for r in speeds if queues[r]]
        r = min(busy, key=lambda r: clock[r] + (queues[r][0].stop - queues[r][0].start) / speeds[r])
        portion = queues[r].pop(0)
        clock[r] += (portion.stop - portion.start) / speeds[r]
        end = take(finish(c, portion))
        for replica in speeds:
            if not queues[replica] and replica not in idle_at and c.state_of(replica) == "done":
                idle_at[replica] = clock[replica]
    raise AssertionError("the epoch did not end")


def test_a_faster_replica_takes_more_and_the_replicas_finish_together():
    speeds = {0: 6_000.0, 1: 5_000.0}  # replica 1 shares its core with a server
    idle = simulate(make(n_train=60_000, min_portion=512), speeds)
    assert abs(idle[0] - idle[1]) < 2 * 512 / 5_000  # within a couple of small portions
    fixed = simulate(shards(n_train=60_000), speeds)
    assert abs(fixed[0] - fixed[1]) > 0.9  # one share each: replica 0 idles a second
    guided = make(n_train=60_000, min_portion=512)
    simulate(guided, speeds)
    per = {r: sum(d.examples for d in p.done) for r, p in guided.parts.items()}
    assert per[0] > per[1] and per[0] + per[1] == 60_000


def drain(c: Coordinator, replica: int) -> list:
    """``replica`` trains everything it holds and is given, whole; the instructions."""
    out = []
    for _ in range(1000):  # bounded: each step finishes one portion
        part = c.parts[replica]
        if not part.held or part.state != "training":
            return out
        start, stop = c.portions[part.held[0]]
        out += c.handle(done(replica, c.epoch, start, stop - start))
    raise AssertionError("it never ran out")


def test_a_dead_replicas_portions_go_to_whoever_asks_next_and_count_once():
    c = make(min_portion=100)  # portions 0:250, 250:438, 438:579, 579:685, ... 985:1000
    starts = join_all(c)
    assert [(s.replica, s.start) for s in starts] == [(0, 0), (1, 250), (0, 438), (1, 579)]
    c.handle(Progress(1, 0, 250, 40))
    assert c.handle(Lost(1)) == []  # replica 0 holds two already: nothing to give it yet
    out = c.handle(done(0, 0, 0, 250))  # replica 0 asks: the lost ones come first, in order
    assert [(s.replica, s.start) for s in out] == [(0, 250)]
    (end,) = [i for i in drain(c, 0) if isinstance(i, EpochEnd)]
    assert end.examples == 1000 and end.per_replica == {0: 1000, 1: 0}  # the 40 not counted
    assert c.handle(Joined(1)) == []  # the epoch ended: nothing for it until the next


def test_an_idle_replica_takes_a_dead_ones_portion_at_once():
    c = make(n_train=600, min_portion=100)
    starts = join_all(c)
    out = []
    for s in starts:
        if s.replica == 0:
            out += finish(c, s)
    while any(isinstance(i, StartPortion) and i.replica == 0 for i in out):
        out = [x for i in out if isinstance(i, StartPortion) for x in finish(c, i)]
    assert c.state_of(0) == "done" and c.state_of(1) == "training"
    again = c.handle(Lost(1))  # replica 0 was idle with nothing left: it takes them
    assert again and {s.replica for s in again} == {0}


def test_the_epoch_rule_in_portions_closes_the_others_once_nothing_is_left():
    c = make(fraction=0.5, n_train=3000, min_portion=100)
    join_all(c)
    out = []
    for _ in range(100):  # replica 0 works through what it is given; replica 1 stalls
        if not c.parts[0].held:
            break
        start, stop = c.portions[c.parts[0].held[0]]
        out = c.handle(done(0, 0, start, stop - start))
    assert c.state_of(0) == "done" and out == [Close(1, 0)]  # 1 of 2 finished: the rule
    assert c.remaining(1) == 0
    held = list(c.parts[1].held)
    assert len(held) == 2  # its current portion and the one ahead, which stops at once
    out = c.handle(done(1, 0, c.portions[held[0]][0], 7))
    assert out == []
    (end,) = c.handle(done(1, 0, c.portions[held[1]][0], 0))
    assert end.per_replica[1] == 7 and end.examples == end.per_replica[0] + 7 < 3000


def test_warm_start_in_portions_keeps_replica_0_alone_past_its_portions():
    c = make(warm_start=600, min_portion=100)
    starts = join_all(c)
    assert [(s.replica, s.start) for s in starts] == [(0, 0), (0, 250)]
    more = c.handle(done(0, 0, 0, 250)) + c.handle(done(0, 0, 250, 188))
    assert [(s.replica, s.start) for s in more] == [(0, 438), (0, 579)]  # still alone
    assert c.remaining(0) == 579 - 438 and c.state_of(1) == "waiting"  # its portion ends first
    assert c.handle(Progress(0, 0, 438, 100)) == [] and c.remaining(0) == 41
    (more,) = c.handle(done(0, 0, 438, 141))  # 579 trained: one more for replica 0 alone
    assert (more.replica, more.start) == (0, 685)
    assert c.remaining(0) == 21  # the warm start ends before its portion does
    joined = c.handle(Progress(0, 0, 579, 21))  # 600 trained: the others take part
    assert [(s.replica, s.start) for s in joined] == [(1, 785), (1, 885)]


def test_a_status_answer_becomes_events_and_bad_fields_are_left_out():
    status = {
        "epoch": 3,
        "finished": [
            {"start": 0, "examples": 500, "loss": 12.5, "correct": 450, "data_wait_s": 0.5},
            {"start": "0", "examples": 1},  # a string: left out
            {"start": 500, "examples": True},  # a bool is no count
            "junk",
        ],
        "portion": {"start": 900, "stop": 1000, "examples": 40, "seconds": 0.1},
    }
    assert status_events(1, status) == [
        PortionDone(1, 3, 0, 500, 12.5, 450, 0.5, 0.0),
        Progress(1, 3, 900, 40),
    ]
    assert status_events(1, {"state": "idle"}) == []
    assert status_events(1, {"epoch": -1, "portion": {"start": 0, "examples": 1}}) == []
    bad = status_events(
        0, {"epoch": 0, "finished": [{"start": 0, "examples": 5, "loss": math.inf}]}
    )
    assert bad == [PortionDone(0, 0, 0, 5, 0.0, 0, 0.0, 0.0)]


def test_with_few_portions_everyone_takes_its_current_one_before_any_is_held_ahead():
    c = make(replicas=2, fraction=0.5)  # min 512: two portions, 0:512 and 512:1000
    starts = join_all(c)
    assert [(s.replica, s.start) for s in starts] == [(0, 0), (1, 512)]
    assert c.handle(Progress(0, 0, 0, 10)) == []  # nobody closed: nobody has finished
    many = make(replicas=4, fraction=0.5)  # two portions for four replicas
    starts = join_all(many)
    assert [(s.replica, s.start) for s in starts] == [(0, 0), (1, 512)]
    assert many.state_of(2) == many.state_of(3) == "done"  # nothing for them: no finishers
    assert many.handle(Progress(0, 0, 0, 10)) == []  # so the epoch rule closes nobody
    assert many.handle(done(0, 0, 0, 512)) == []  # 1 finisher of the 2 the rule needs
    (end,) = many.handle(done(1, 0, 512, 488))
    assert end.examples == 1000


def test_without_ahead_a_replica_holds_one_portion_at_a_time():
    c = make(ahead=0, min_portion=100)
    starts = join_all(c)
    assert [(s.replica, s.start) for s in starts] == [(0, 0), (1, 250)]
    (nxt,) = finish(c, starts[0])
    assert (nxt.replica, nxt.start) == (0, 438)


def test_a_replica_lost_and_back_in_the_same_epoch_takes_what_is_left():
    c = make(min_portion=100)
    starts = join_all(c)
    c.handle(done(1, 0, 250, 188))  # replica 1 finished one portion: counted
    c.handle(Lost(1))
    (back, ahead) = c.handle(Joined(1))
    assert back.replica == ahead.replica == 1 and back.start == 579  # its lost portion first
    out = drain(c, 0) + drain(c, 1)
    (end,) = [i for i in out if isinstance(i, EpochEnd)]
    assert end.examples == 1000 and end.per_replica[1] >= 188  # the finished one stays counted
    assert starts[0].start == 0


def test_a_warm_start_in_portions_ends_when_replica_0_dies():
    c = make(warm_start=600, min_portion=100)
    join_all(c)
    out = c.handle(Lost(0))  # what it held goes back, and replica 1 starts with it
    assert [(s.replica, s.start) for s in out] == [(1, 0), (1, 250)]
    assert not c.alone


def test_a_replica_claiming_more_examples_than_its_portion_has_is_capped():
    c = make(min_portion=100)
    starts = join_all(c)
    c.handle(Progress(0, 0, 0, 10**9))
    assert c.remaining(0) == 0
    c.handle(done(0, 0, 0, 10**9))
    assert c.parts[0].done[0].examples == 250 == starts[0].stop


def test_during_the_warm_start_replica_0_leaves_a_portion_for_each_of_the_others():
    c = make(warm_start=100)  # two portions, 0:512 and 512:1000
    (only,) = join_all(c)  # not both: replica 1 would have nothing when the warm start ends
    assert (only.replica, only.start) == (0, 0)
    (other,) = c.handle(Progress(0, 0, 0, 100))
    assert (other.replica, other.start) == (1, 512)
    wide = make(replicas=4, n_train=4096, min_portion=256, ahead=2, warm_start=100)
    held = [s.start for s in join_all(wide)]
    assert len(held) <= len(wide.portions) - 3  # one left for each of the three others


def test_the_story_tells_each_replica_s_transitions_with_their_stimulus() -> None:
    c = make(n_train=1000, min_portion=1000)  # one portion: replica 1 finds nothing
    c.handle(Joined(0, stimulus_id="join-0"))
    [start] = c.handle(Joined(1, stimulus_id="join-1"))
    c.handle(done(0, 0, 0, 1000) if start.replica == 0 else done(1, 0, 0, 1000))
    assert c.story(0)[0] == ("join-1", 0, 0, None, "training")
    assert c.story(1)[0] == ("join-1", 1, 0, None, "done")  # nothing left for it
    last = c.story(0)[-1]
    assert last[0].startswith("PortionDone-") and last[3:] == ("training", "done")
    c.advance("next")
    [entry] = [t for t in c.story(0) if t[0] == "next"]
    assert entry[2:] == (1, None, "training")  # epoch 1 began


def test_validate_state_finds_a_portion_held_twice_or_a_closed_epoch_handing_out() -> None:
    c = make(n_train=4000, min_portion=500)
    join_all(c)
    c.validate_state()
    c.parts[1].held.append(c.parts[0].held[0])
    with pytest.raises(AssertionError):
        c.validate_state()
    c.parts[1].held.pop()
    c.closed = True
    with pytest.raises(AssertionError):
        c.validate_state()  # portions left to hand out, replicas still training
