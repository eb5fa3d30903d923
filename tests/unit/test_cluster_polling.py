"""How soon the cluster driver asks its replicas again (hogwild.cluster.polling, no clock of its
own): at its usual interval while none is due to finish, on time for one that is, then often,
backing off while it stays overdue, and afresh for the next portion or epoch; a replica's rate from
its portion under way, or from its epoch before it trained any of the portion."""

from __future__ import annotations

import pytest

from hogwild.cluster.polling import POLL_S, SOON_POLL_S, PollSchedule, next_poll_s, training_rate


def test_a_replica_far_from_its_end_is_asked_at_the_usual_interval():
    assert next_poll_s(30.0) == POLL_S
    assert PollSchedule().delay(100.0, {}) == POLL_S  # nobody to go by


def test_a_replica_due_soon_is_asked_when_it_is_due():
    assert next_poll_s(POLL_S / 2) == pytest.approx(POLL_S / 2)
    assert next_poll_s(SOON_POLL_S / 10) == SOON_POLL_S  # never a busy loop
    schedule = PollSchedule()
    assert schedule.delay(100.0, {0: (3, 130.0), 1: (3, 100.05)}) == pytest.approx(0.05)


def test_an_overdue_replica_is_asked_often_at_first_then_less_and_less():
    schedule = PollSchedule()
    # each poll's status moves the estimate to "due now": the back-off counts from the first
    waits, now = [], 10.0
    for _ in range(40):
        wait = schedule.delay(now, {0: (5, now)})
        waits.append(wait)
        now += wait
    assert waits[0] == SOON_POLL_S
    assert waits == sorted(waits)
    assert waits[-1] == POLL_S
    polls_in_2_s = sum(1 for end in _running_sum(waits) if end <= 2.0)
    assert polls_in_2_s < 30  # not 200 a second


def test_the_back_off_starts_afresh_when_the_replica_is_due_again_or_in_a_new_epoch():
    schedule = PollSchedule()
    schedule.delay(10.0, {0: (1, 9.9)})  # overdue since 9.9
    assert schedule.delay(10.3, {0: (1, 10.2)}) == pytest.approx(0.1)  # 0.4 s overdue / 4
    assert schedule.delay(10.3, {0: (2, 10.3)}) == SOON_POLL_S  # the next epoch's portion
    assert schedule.delay(10.4, {0: (2, 10.5)}) == pytest.approx(0.1)  # due again, later
    assert schedule.delay(10.5, {0: (2, 10.5)}) == SOON_POLL_S  # overdue afresh


def test_a_replica_that_left_the_schedule_is_overdue_afresh_when_it_comes_back():
    schedule = PollSchedule()
    schedule.delay(10.0, {0: (1, 9.0)})  # overdue since 9.0
    schedule.delay(10.5, {})  # it finished, or died
    assert schedule.overdue_since == {}
    assert schedule.delay(11.0, {0: (1, 11.0)}) == SOON_POLL_S  # rejoined the same epoch


def test_a_training_rate_comes_from_the_status_or_is_unknown():
    assert training_rate({"examples": 500, "seconds": 0.25}) == 2000.0
    assert training_rate({"examples": 0, "seconds": 1.0}) is None  # nothing trained yet
    assert training_rate({"examples": 5, "seconds": 0.0}) is None
    assert training_rate({"state": "idle"}) is None  # no portion


def test_the_rate_of_the_portion_under_way_comes_first_then_the_epochs():
    status = {"examples": 900, "seconds": 1.0, "portion": {"examples": 300, "seconds": 0.1}}
    assert training_rate(status) == 3000.0  # the portion's: what it trains at now
    status["portion"] = {"examples": 0, "seconds": 0.001}  # just begun: the epoch's
    assert training_rate(status) == 900.0
    status["portion"] = "junk"
    assert training_rate(status) == 900.0


def test_the_back_off_starts_afresh_at_the_next_portion_of_the_same_epoch():
    schedule = PollSchedule()
    schedule.delay(10.0, {0: ((1, 0), 9.0)})  # overdue since 9.0
    assert schedule.delay(10.4, {0: ((1, 0), 10.3)}) == pytest.approx(0.2)  # 1.4 s overdue: capped
    assert schedule.delay(10.4, {0: ((1, 500), 10.4)}) == SOON_POLL_S  # its next portion


def _running_sum(values):
    total = 0.0
    for value in values:
        total += value
        yield total
