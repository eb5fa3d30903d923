"""A bucket role's wait for reads after a takeover (plugins/ps/replication/reads_gate.py, asked
through ``BucketRole.reads_open``), with no socket: who waits, and how long. A revoked holder
answers reads by its own clock, which runs on its own lease TTL (``members/<i>``'s ``lease_s``,
named again in its ``revoked/<i>`` marker), not on its successor's. Every stimulus is followed
by the role's ``validate_state``.
"""

from __future__ import annotations

import math

import pytest
from hogwild_plugins.ps.failover import (
    REVOKED_PREFIX,
    BucketRecord,
    revoked_ttl,
    unknown_markers,
)
from hogwild_plugins.ps.replication.bucket_role import Role
from hogwild_plugins.ps.replication.bucket_role_events import CampaignAnswered, MapRead
from hogwild_plugins.ps.replication.reads_gate import ReadsGate, takeover_wait

from hogwild.config.checks import MAX_LEASE_S
from tests.unit.bucket_role_support import (
    LEASE,
    NEW_LEASE,
    TTL,
    carry_out,
    lapsed_primary,
    step,
)


def take_over(revoked: float, own_ttl: float = TTL, at: float = 100.0):
    """An established bucket's primary lapsed; its lowest live in-sync copy, its lease TTL
    ``own_ttl``, reads the map with markers naming ``revoked`` (0: none) and wins at ``at``.
    The role, the keys, the other roles, the members."""
    roles, keys, primary, members = lapsed_primary()
    role = roles[min(members)]
    role.lease_ttl = own_ttl
    read = keys.read()
    [campaign] = step(role, MapRead, read, members, LEASE[role.me], True, revoked_ttl=revoked)
    assert keys.transact(campaign)
    carry_out(role, step(role, CampaignAnswered, True, keys.read(), at), keys, roles)
    assert role.serving
    return role, keys, roles, members


def test_reads_open_at_once_after_a_lapsed_lease_and_a_ttl_after_a_revoked_one():
    """``reads_open``: the first primary of a bucket answers reads at once (no predecessor), so
    does one that took the bucket from a primary whose lease lapsed (its holder's clock gave up
    before etcd dropped it: review E's A2); one that read a ``revoked/<i>`` marker with the
    map that showed the primary gone waits the marker's TTL from its campaign's answer (a
    revoked holder may still answer by its own clock)."""
    roles, _, primary, _ = lapsed_primary()
    assert roles[primary].reads_open(0.0)  # the first record, answered at 0.0: no wait
    for revoked, opens in ((0.0, 100.0), (TTL, 100.0 + TTL)):
        role, *_ = take_over(revoked)
        assert role.reads_open(opens) and not role.reads_open(opens - 0.5)


def test_a_successor_with_a_short_ttl_waits_the_revoked_holders_longer_one():
    """Servers may be given different lease TTLs (``ps serve --lease-s``): a successor whose
    own TTL is 1 waits the 10 its revoked predecessor's marker names. Before, it waited its own
    TTL, and the holder, its clock running on 10, answered older values meanwhile (review I's
    I7)."""
    role, *_ = take_over(revoked=TTL, own_ttl=1.0)
    assert not role.reads_open(100.0 + 1.0) and not role.reads_open(100.0 + TTL - 0.5)
    assert role.reads_open(100.0 + TTL)
    longer, *_ = take_over(revoked=2.0, own_ttl=TTL)  # a shorter marker: its TTL, not the own
    assert not longer.reads_open(101.5) and longer.reads_open(102.0)


def test_a_take_back_keeps_the_wait_it_owes():
    """A primary that took the bucket after a revocation, deposed inside its wait (its own
    lease lapsed) and taking its own record back, still waits what it owed: before the mend
    the take-back's answer reopened reads at once (review E, S1)."""
    role, keys, roles, members = take_over(revoked=TTL)
    survivor = role.me
    assert not role.reads_open(100.0 + TTL - 0.5) and role.reads_open(100.0 + TTL)
    members = {**members, survivor: NEW_LEASE[survivor]}  # its lease lapsed; registered again
    assert step(role, MapRead, keys.read(), members, NEW_LEASE[survivor], True) == []
    assert role.role is Role.DEPOSED
    [campaign] = step(role, MapRead, keys.read(), members, NEW_LEASE[survivor], True)
    assert campaign.record.primary == survivor and keys.transact(campaign)
    carry_out(role, step(role, CampaignAnswered, True, keys.read(), 101.0), keys, roles)
    assert role.serving and not role.reads_open(101.0) and role.reads_open(100.0 + TTL)


def test_takeover_wait_by_the_record_replaced():
    """Another's record: the markers' TTL (0: none); this side's own record won in this life:
    none new; handed with the hander's reads open: none; any other record naming this side:
    its own TTL, or the markers' if longer."""
    other = BucketRecord(4, 1, LEASE[1], (1, 0))
    mine = BucketRecord(4, 0, LEASE[0], (0, 1))
    handed = BucketRecord(4, 0, LEASE[0], (0, 1), handed=True)
    assert takeover_wait(other, 0, 0, 1.0, 0.0) == 0.0
    assert takeover_wait(other, 0, 0, 1.0, 7.0) == 7.0
    assert takeover_wait(mine, 0, 4, 1.0, 7.0) == 0.0  # won here: what it owes is kept
    assert takeover_wait(handed, 0, 0, 1.0, 7.0) == 0.0
    assert takeover_wait(mine, 0, 3, 1.0, 0.0) == 1.0
    assert takeover_wait(mine, 0, 3, 1.0, 7.0) == 7.0
    gate = ReadsGate()
    gate.campaigning(7.0)
    gate.won(10.0)
    gate.campaigning(0.0)
    gate.won(12.0)  # a take-back inside the wait: never shortened
    assert not gate.open(16.5) and gate.open(17.0)
    with pytest.raises(ValueError, match="wait for reads must be >= 0"):
        gate.campaigning(-1.0)


def test_revoked_ttl_is_the_longest_marker_and_a_marker_without_a_ttl_is_unbounded():
    """Only ``revoked/<i>`` of one of the job's servers counts (as the records are read); a
    marker naming no TTL no longer fails the read (review M's M1: every takeover of the job
    stopped while it lived): it gives an unbounded wait, and is named for the log."""
    entries = [
        ("members/0", {"lease_s": 60}),  # a member's TTL is not a marker's
        (f"{REVOKED_PREFIX}1", {"lease": 5, "lease_s": 3}),
        (f"{REVOKED_PREFIX}2", {"lease": 6, "lease_s": 9}),
        ("sync/0", {"epoch": 1}),
        (f"{REVOKED_PREFIX}foo", {"lease": 7}),  # names no server of the job
        (f"{REVOKED_PREFIX}4", {"lease": 8, "lease_s": 99}),  # index out of range
        (f"{REVOKED_PREFIX}\u00b2", {"lease": 9}),  # a digit to isdigit(), not to int()
    ]
    assert revoked_ttl(entries, n_servers=4) == 9.0
    assert unknown_markers(entries, n_servers=4) == []
    assert revoked_ttl(entries[:1], n_servers=4) == 0.0
    longest = [*entries, (f"{REVOKED_PREFIX}3", {"lease": 5, "lease_s": MAX_LEASE_S})]
    assert revoked_ttl(longest, n_servers=4) == MAX_LEASE_S  # the bound itself is a TTL
    # past MAX_LEASE_S no driver wrote it (ps.lease_s is bounded): named, closed while it lives,
    # not a wait owed for up to that long after it is gone
    over = [{"lease": 5, "lease_s": MAX_LEASE_S + 1}, {"lease": 5, "lease_s": 10**18}]
    for bad in ({"lease": 5}, {"lease": 5, "lease_s": 0}, {"lease_s": True}, "x", *over):
        marked = [*entries, (f"{REVOKED_PREFIX}3", bad)]
        assert revoked_ttl(marked, n_servers=4) == math.inf
        assert unknown_markers(marked, n_servers=4) == [f"{REVOKED_PREFIX}3"]


def test_a_marker_naming_no_ttl_keeps_reads_closed_until_a_later_read_holds_none():
    """Review M's M1: the takeover goes on (it serves writes), and its reads stay closed
    while a marker naming no TTL lives; the first map read after the win that holds none opens
    them that read's longest marker TTL later, never earlier than a wait still owed."""
    role, keys, _, members = take_over(revoked=math.inf)  # won at 100.0
    assert role.serving and not role.reads_open(10_000.0) and role.reads_from == math.inf

    def read(at: float, revoked: float) -> None:
        step(role, MapRead, keys.read(), members, LEASE[role.me], True, revoked_ttl=revoked, at=at)

    read(99.0, 0.0)  # read before the win: tells nothing of the marker since
    read(150.0, math.inf)  # still there
    assert not role.reads_open(10_000.0)
    read(200.0, 3.0)  # gone; another marker, of TTL 3, in the same read
    assert not role.reads_open(202.9) and role.reads_open(203.0) and role.reads_from == 203.0
