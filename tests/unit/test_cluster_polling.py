"""How soon the cluster driver asks its replicas again: at its usual interval while none is due
to finish, on time for one that is, then often, backing off while it stays overdue."""

from __future__ import annotations

import pytest

from hogwild.cluster.driver import POLL_S, SOON_POLL_S, _share_rate, next_poll_s


def test_a_replica_far_from_its_end_is_asked_at_the_usual_interval():
    assert next_poll_s(30.0) == POLL_S


def test_a_replica_due_soon_is_asked_when_it_is_due():
    assert next_poll_s(POLL_S / 2) == pytest.approx(POLL_S / 2)
    assert next_poll_s(SOON_POLL_S / 10) == SOON_POLL_S  # never a busy loop


def test_an_overdue_replica_is_asked_often_at_first_then_less_and_less():
    waits = [next_poll_s(-late) for late in (0.0, 0.05, 0.2, 5.0)]
    assert waits[0] == SOON_POLL_S
    assert waits == sorted(waits)
    assert waits[-1] == POLL_S


def test_a_share_rate_comes_from_the_status_or_is_unknown():
    assert _share_rate({"examples": 500, "seconds": 0.25}) == 2000.0
    assert _share_rate({"examples": 0, "seconds": 1.0}) is None  # nothing trained yet
    assert _share_rate({"examples": 5, "seconds": 0.0}) is None
    assert _share_rate({"state": "idle"}) is None  # no share
