"""The read-back verdict of a compare-and-swap whose answer was lost (:func:`judge`): not applied
while the compared key is at the expected revision, ours when every key holds our value and lease
at one revision, another's otherwise; and the first timeout's size (:func:`write_retry_s`)."""

from __future__ import annotations

import pytest
from hogwild_plugins.ps.etcd_cas import LOST, UNAPPLIED, WON, judge, write_retry_s

from hogwild.errors import HogwildError

PUTS = [{"key": "a2V5", "value": "b3Vycw==", "lease": 7}, {"key": "b3RoZXI=", "value": "eA=="}]


def _kv(value: str, mod: int, lease: int = 0) -> dict:
    kv = {"key": "k", "value": value, "mod_revision": str(mod)}
    if lease:
        kv["lease"] = str(lease)
    return kv


def test_a_key_still_at_the_expected_revision_was_not_applied():
    assert judge([[_kv("b2xk", 5)], []], 5, PUTS) == UNAPPLIED
    assert judge([[], []], 0, PUTS) == UNAPPLIED  # a create whose key is still absent


def test_every_key_holding_our_values_at_one_revision_is_ours():
    assert judge([[_kv("b3Vycw==", 9, lease=7)], [_kv("eA==", 9)]], 5, PUTS) == WON
    assert judge([[_kv("b3Vycw==", 9, lease=7)], [_kv("eA==", 9)]], 0, PUTS) == WON


@pytest.mark.parametrize(
    "kvs",
    [
        [[_kv("b3RoZXI=", 9, lease=7)], [_kv("eA==", 9)]],  # another value
        [[_kv("b3Vycw==", 9, lease=8)], [_kv("eA==", 9)]],  # another lease
        [[_kv("b3Vycw==", 9)], [_kv("eA==", 9)]],  # no lease
        [[_kv("b3Vycw==", 9, lease=7)], [_kv("eA==", 8)]],  # not one transaction
        [[_kv("b3Vycw==", 9, lease=7)], []],  # a key of ours deleted since
        [[], [_kv("eA==", 9)]],  # the compared key deleted
    ],
)
def test_anything_else_is_another_write_that_came_first(kvs):
    assert judge(kvs, 5, PUTS) == LOST


def test_bad_read_backs_and_election_timeouts_are_refused():
    with pytest.raises(HogwildError, match="1 ranges for 2 keys"):
        judge([[]], 5, PUTS)
    with pytest.raises(HogwildError, match="mod_revision"):
        judge([[{"key": "k"}], []], 5, PUTS)
    with pytest.raises(HogwildError, match="election timeout 0 ms"):
        write_retry_s(0, 2.0)
    assert write_retry_s(200, 2.0) == 0.4 and write_retry_s(50, 2.0) == 0.25


def test_a_long_election_leaves_the_read_back_its_asks_within_the_clients_timeout():
    # two election timeouts of 1 s would be the whole 2 s: a lost first ask never read back
    assert write_retry_s(1000, 2.0) == pytest.approx(2.0 / 3)
    assert write_retry_s(5000, 2.0) == pytest.approx(2.0 / 3)
    assert write_retry_s(1000, 6.0) == 2.0
