"""The client's re-routing decisions, driven without sockets (:mod:`hogwild_plugins.ps.routing`)."""

from __future__ import annotations

import pytest
from hogwild_plugins.ps.routing import (
    LEASE_MARGIN_S,
    READS_WAIT_PAUSE_S,
    REFUSED_PAUSE_MAX_S,
    REFUSED_PAUSE_S,
    REROUTE_WAIT_S,
    AwaitMap,
    Exhausted,
    MapRead,
    MapSettled,
    Outcome,
    Pause,
    Ping,
    Pinged,
    ReadMap,
    Rerouting,
    Resend,
    Unfinished,
    Waiting,
    reply_outcome,
)

from hogwild.net.wire import ErrorCode, MsgType

DEADLINE = 100.0


def step(machine: Rerouting, stimulus) -> list:
    actions = machine.handle(stimulus)
    machine.validate_state()
    return actions


def test_a_reply_is_done_re_routed_counted_stale_or_an_error():
    assert reply_outcome(MsgType.ACK, 0, replicated=True) == Outcome.DONE
    assert reply_outcome(MsgType.DATA, 0, replicated=False) == Outcome.DONE
    for code in (ErrorCode.NOT_PRIMARY, ErrorCode.FENCED, ErrorCode.READS_WAITING):
        assert reply_outcome(MsgType.ERROR, code, replicated=True) == Outcome.RE_ROUTE
        assert reply_outcome(MsgType.ERROR, code, replicated=False) == Outcome.ERROR
    assert reply_outcome(MsgType.ERROR, ErrorCode.STALE, replicated=True) == Outcome.STALE
    assert reply_outcome(MsgType.ERROR, ErrorCode.STALE, replicated=False) == Outcome.STALE
    assert reply_outcome(MsgType.ERROR, ErrorCode.BAD_RANGE, replicated=True) == Outcome.ERROR


def test_refused_requests_wait_briefly_for_the_map_and_go_to_the_new_primaries():
    machine = Rerouting(DEADLINE)
    waiting = (Waiting(0, bucket=0, server=1, refused=True), Waiting(3, 2, 1, True))
    # server 1 lives (it refused): nobody to ping, so no read to decide pings; the wait reads
    actions = step(machine, Unfinished("u1", waiting, now=10.0))
    assert actions == [Pause(REFUSED_PAUSE_S), AwaitMap(frozenset({0, 2}), DEADLINE, {})]
    actions = step(machine, MapSettled("s1", [2, 0, None], now=11.0))
    assert actions == [Resend({0: 2, 3: 0})]  # no primary yet: server 0, as the routes say
    assert machine.phase == "idle" and machine.rounds == 1


def test_pulls_waiting_for_their_primarys_reads_go_again_to_it_after_a_pause_with_no_map_read():
    """``READS_WAITING``: the map is current, so re-reading it each ~10 ms for the lease-long
    wait would only load etcd during a failover; the same primary gets them after a pause."""
    machine = Rerouting(DEADLINE)
    waiting = (Waiting(0, 0, 1, refused=True, held=True), Waiting(2, 1, 2, True, True))
    actions = step(machine, Unfinished("u1", waiting, now=10.0))
    assert actions == [Pause(READS_WAIT_PAUSE_S), Resend({0: 1, 2: 2})]
    assert machine.phase == "idle" and machine.rounds == 1
    # one of them is not held (refused NOT_PRIMARY): the round waits for the map, as before
    mixed = (Waiting(0, 0, 1, True, True), Waiting(2, 1, 2, True))
    actions = step(machine, Unfinished("u2", mixed, now=10.2))
    assert actions == [Pause(REFUSED_PAUSE_S), AwaitMap(frozenset({0, 1}), DEADLINE, {})]
    assert step(machine, MapSettled("s2", [1, 0], now=10.3)) == [Resend({0: 1, 2: 0})]
    # held past the deadline: it gives up, naming the buckets
    actions = step(machine, Unfinished("u3", waiting, now=DEADLINE - READS_WAIT_PAUSE_S / 2))
    assert actions == [Exhausted(server=1, buckets=frozenset({0, 1}))]


def test_a_silent_primary_that_answers_a_ping_gets_its_requests_again_at_once():
    machine = Rerouting(DEADLINE)
    waiting = (Waiting(0, 0, 2, False), Waiting(1, 1, 2, False), Waiting(2, 3, 0, False))
    assert step(machine, Unfinished("u1", waiting, now=10.0)) == [ReadMap()]  # whom to ping
    # buckets 0 and 1 are still on server 2 (one ping for both); bucket 3 moved to server 1
    actions = step(machine, MapRead("m1", [2, 2, 0, 1], [5, 6, 1, 9], lease_s=2.0))
    assert actions == [Ping(2)]
    actions = step(machine, Pinged("p2", 2, alive=True))
    assert actions == [Pause(REFUSED_PAUSE_S), AwaitMap(frozenset({0, 1, 3}), DEADLINE, {})]
    assert step(machine, MapSettled("s1", [2, 2, 0, 1], now=10.5)) == [Resend({0: 2, 1: 2, 2: 1})]


def test_a_dead_primary_waits_for_a_newer_epoch_or_its_lease():
    machine = Rerouting(DEADLINE)
    waiting = (Waiting(0, 0, 2, False), Waiting(1, 1, 0, False))
    step(machine, Unfinished("u1", waiting, now=10.0))
    assert step(machine, MapRead("m1", [2, 0], [5, 6], lease_s=2.0)) == [Ping(2), Ping(0)]
    assert step(machine, Pinged("p2", 2, alive=False)) == []  # one ping still out
    assert machine.phase == "pinging"
    actions = step(machine, Pinged("p0", 0, alive=True))
    until = 10.0 + 2.0 + LEASE_MARGIN_S
    assert actions == [AwaitMap(frozenset({0, 1}), DEADLINE, {0: (5, until)})]  # no pause
    assert step(machine, MapSettled("s1", [1, 0], now=12.0)) == [Resend({0: 1, 1: 0})]


def test_with_no_lease_known_a_dead_primary_is_waited_for_the_default_time():
    machine = Rerouting(DEADLINE)
    step(machine, Unfinished("u1", (Waiting(7, 0, 1, False),), now=3.0))
    step(machine, MapRead("m1", [1], [2], lease_s=0.0))
    actions = step(machine, Pinged("p1", 1, alive=False))
    assert actions == [AwaitMap(frozenset({0}), DEADLINE, {0: (2, 3.0 + REROUTE_WAIT_S)})]


def test_past_the_deadline_it_gives_up_naming_the_buckets():
    machine = Rerouting(DEADLINE)
    waiting = (Waiting(0, 4, 1, True), Waiting(1, 2, 0, True))
    step(machine, Unfinished("u1", waiting, now=99.0))
    actions = step(machine, MapSettled("s1", [None] * 5, now=DEADLINE + 0.01))
    assert actions == [Exhausted(server=1, buckets=frozenset({2, 4}))]
    assert machine.phase == "idle"


def test_rounds_repeat_and_the_story_records_every_transition():
    machine = Rerouting(DEADLINE)
    for round_ in range(3):
        step(machine, Unfinished(f"u{round_}", (Waiting(0, 0, 1, False),), now=float(round_)))
        step(machine, MapRead(f"m{round_}", [1], [1], lease_s=1.0))
        step(machine, Pinged(f"p{round_}", 1, alive=True))
        step(machine, MapSettled(f"s{round_}", [1], now=float(round_)))
    assert machine.rounds == 3
    story = machine.story()
    assert [entry[0] for entry in story] == [f"{k}{r}" for r in range(3) for k in "umps"]
    assert story[0] == ("u0", "Unfinished", "idle", "reading", ("ReadMap",))
    assert story[1] == ("m0", "MapRead", "reading", "pinging", ("Ping",))
    assert story[2] == ("p0", "Pinged", "pinging", "waiting", ("Pause", "AwaitMap"))
    assert story[3] == ("s0", "MapSettled", "waiting", "idle", ("Resend",))


def pauses_of_refused_rounds(machine: Rerouting, rounds: list) -> list[float]:
    """The pause before each round's wait for the map, a round being ``(waiting, primaries the
    map names when the wait ends)``."""
    pauses = []
    for i, (waiting, primaries) in enumerate(rounds):
        actions = step(machine, Unfinished(f"u{i}", waiting, now=float(i)))
        assert isinstance(actions[0], Pause) and isinstance(actions[1], AwaitMap), actions
        pauses.append(actions[0].seconds)
        step(machine, MapSettled(f"s{i}", primaries, now=float(i)))
    return pauses


def test_requests_refused_again_by_the_primary_the_map_names_back_off_to_a_bound():
    """A winner catching its copies up (or short of min_copies) refuses ``NOT_PRIMARY`` while
    the map names it: each round pauses twice as long, up to the bound, not ~10 ms each."""
    machine = Rerouting(DEADLINE)
    stuck = (Waiting(0, 0, 1, refused=True), Waiting(1, 1, 1, True))
    pauses = pauses_of_refused_rounds(machine, [(stuck, [1, 1])] * 9)
    assert pauses == [min(REFUSED_PAUSE_S * 2**k, REFUSED_PAUSE_MAX_S) for k in range(9)]
    assert pauses[-1] == REFUSED_PAUSE_MAX_S and machine.rounds == 9


def test_the_back_off_starts_over_when_the_map_moves_or_a_request_is_answered():
    machine = Rerouting(DEADLINE)
    stuck = (Waiting(0, 0, 1, refused=True), Waiting(1, 1, 1, True))
    # refused twice by server 1, then the map names server 2 for bucket 1 (moved): start over
    moved = [(stuck, [1, 1]), (stuck, [1, 1]), (stuck, [1, 2])]
    assert pauses_of_refused_rounds(machine, moved) == [0.01, 0.02, 0.04]
    again = (Waiting(0, 0, 1, True), Waiting(1, 1, 2, True))
    assert pauses_of_refused_rounds(machine, [(again, [1, 2])] * 2) == [0.01, 0.02]
    # request 1 answered meanwhile: fewer wait, progress, start over
    one = (Waiting(0, 0, 1, True),)
    assert pauses_of_refused_rounds(machine, [(one, [1, 2])]) == [0.01]
    # an unanswered request (a ping round) is no refusal: the back-off starts over after it
    step(machine, Unfinished("u-silent", (Waiting(0, 0, 1, refused=False),), now=20.0))
    step(machine, MapRead("m-silent", [1, 2], [3, 3], lease_s=1.0))
    assert step(machine, Pinged("p-silent", 1, alive=True))[0] == Pause(REFUSED_PAUSE_S)
    step(machine, MapSettled("s-silent", [1, 2], now=20.1))
    assert pauses_of_refused_rounds(machine, [(one, [1, 2])]) == [0.01]


def test_nothing_waiting_needs_no_round():
    machine = Rerouting(DEADLINE)
    assert step(machine, Unfinished("u0", (), now=0.0)) == []
    assert machine.phase == "idle" and machine.rounds == 0


def test_a_stimulus_out_of_its_phase_or_an_unasked_ping_is_refused():
    machine = Rerouting(DEADLINE)
    with pytest.raises(ValueError, match="MapRead in phase 'idle'"):
        machine.handle(MapRead("m0", [0], [0], 0.0))
    step(machine, Unfinished("u1", (Waiting(0, 0, 1, False),), now=0.0))
    with pytest.raises(ValueError, match="Unfinished in phase 'reading'"):
        machine.handle(Unfinished("u2", (Waiting(0, 0, 1, False),), now=0.0))
    step(machine, MapRead("m1", [1], [1], lease_s=1.0))
    with pytest.raises(ValueError, match="server 3: a ping answered that was not asked"):
        machine.handle(Pinged("p3", 3, alive=True))
    step(machine, Pinged("p1", 1, alive=True))
    with pytest.raises(ValueError, match="Pinged in phase 'waiting'"):
        machine.handle(Pinged("p1", 1, alive=True))
    with pytest.raises(TypeError):
        machine.handle("not a stimulus")


def test_validate_state_catches_an_inconsistent_machine():
    machine = Rerouting(DEADLINE)
    step(machine, Unfinished("u1", (Waiting(0, 0, 1, False),), now=0.0))
    machine.away[5] = (0, 1.0)  # a bucket no request waits on
    with pytest.raises(AssertionError, match="no request needs"):
        machine.validate_state()


def test_a_held_request_that_was_not_refused_is_refused_at_construction():
    """``held`` implies ``refused`` (review G, G2): checked where the held path reads it, since
    a round of held requests never reaches ``validate_state``."""
    with pytest.raises(ValueError, match="request 3: held"):
        Waiting(3, bucket=0, server=1, refused=False, held=True)


def test_a_map_key_whose_index_is_no_ascii_number_is_not_the_jobs():
    from hogwild_plugins.ps.routes import parse_map

    # "²" passes str.isdigit but int() refuses it: a foreign key in the job's prefix must not
    # fail every map read with a ValueError
    members, records = parse_map({"sync/²": ("{}", 1), "members/¹": ("{}", 2)}, 2, 4)
    assert members == {} and records == [None] * 4
