"""The lease clock, rendezvous placement and the records read back from etcd (a bucket's and a
member's: plugins/ps/failover.py). The bucket role's transitions have their own tests
(``test_bucket_role_*.py``), and so does a shard's log (``test_shard_log.py``).
"""

from __future__ import annotations

import pytest
from hogwild_plugins.ps.failover import (
    BucketRecord,
    LeaseClock,
    MemberRecord,
    desired_copies,
)

from tests.unit.bucket_role_support import (
    BUCKET,
    COPIES,
    LEASE,
    live,
)

# --------------------------------------------------------------------------- lease clock


def test_a_lease_is_valid_for_its_ttl_less_the_margin_after_the_grant_was_sent():
    clock = LeaseClock(margin=0.25)
    assert not clock.valid(0.0)
    clock.granted(lease=42, ttl_s=2.0, sent_at=100.0)
    assert clock.lease == 42
    assert clock.valid(100.0) and clock.valid(101.49)
    assert not clock.valid(101.5)


def test_a_renewal_extends_the_lease_from_when_it_was_sent():
    clock = LeaseClock(margin=0.25)
    clock.granted(42, 2.0, sent_at=100.0)
    assert clock.renewed(remaining_s=2.0, sent_at=101.0)
    assert clock.valid(102.49) and not clock.valid(102.5)
    assert clock.renewed(remaining_s=2.0, sent_at=100.5)  # a slower, older answer
    assert clock.valid(102.49)  # does not shorten it


def test_an_expired_lease_stays_lost_until_a_new_one_is_granted():
    clock = LeaseClock()
    clock.granted(42, 2.0, sent_at=0.0)
    assert not clock.renewed(remaining_s=0, sent_at=0.5)
    assert not clock.valid(0.5)
    assert not clock.renewed(remaining_s=2.0, sent_at=0.6)  # too late: it is gone
    assert not clock.valid(0.7)
    clock.granted(43, 2.0, sent_at=1.0)
    assert clock.lease == 43 and clock.valid(1.1)


def test_a_process_paused_past_its_lease_finds_it_invalid_on_waking():
    clock = LeaseClock()
    clock.granted(42, 2.0, sent_at=0.0)
    assert clock.valid(1.0)
    assert not clock.valid(1000.0)


def test_a_renewal_is_due_every_fifth_of_the_ttl():
    clock = LeaseClock()
    clock.granted(42, 2.0, sent_at=0.0)
    assert not clock.renew_due(now=10.3, last_sent=10.0)
    assert clock.renew_due(now=10.4, last_sent=10.0)


# --------------------------------------------------------------------------- placement


def test_desired_copies_are_deterministic_distinct_live_and_copies_long():
    members = live(range(6))
    for bucket in range(200):
        chosen = desired_copies(bucket, members, COPIES)
        assert chosen == desired_copies(bucket, frozenset(members), COPIES)
        assert len(chosen) == COPIES == len(set(chosen)) and set(chosen) <= set(members)
    assert sorted(desired_copies(BUCKET, live([4, 1]), COPIES)) == [1, 4]
    assert desired_copies(BUCKET, {}, COPIES) == []


def test_a_servers_departure_or_return_moves_only_the_buckets_it_holds():
    members = set(range(6))
    for server in members:
        without = members - {server}
        moved = 0
        for bucket in range(300):
            before = desired_copies(bucket, members, COPIES)
            after = desired_copies(bucket, without, COPIES)
            if server in before:
                moved += 1
                assert after[:-1] == [s for s in before if s != server]
                assert after[-1] not in before
            else:
                assert after == before
        assert 0 < moved < 300


def test_every_server_is_the_first_copy_of_some_buckets():
    members = set(range(6))
    firsts = {desired_copies(bucket, members, COPIES)[0] for bucket in range(200)}
    assert firsts == members


# --------------------------------------------------------------------------- records


def test_a_record_reads_back_what_it_wrote():
    record = BucketRecord(epoch=3, primary=1, lease=LEASE[1], in_sync=(1, 0, 2))
    assert BucketRecord.parse(record.value(), 17, 3, "sync/5") == BucketRecord(
        3, 1, LEASE[1], (1, 0, 2), revision=17
    )


def test_the_largest_epoch_a_header_carries_is_read_back():
    value = {"epoch": 2**32 - 1, "primary": 0, "lease": 2**63 - 1, "in_sync": [0]}
    assert BucketRecord.parse(value, 1, 3, "sync/5").epoch == 2**32 - 1


GOOD = {"epoch": 3, "primary": 1, "lease": 99, "in_sync": [1, 2]}


def without(key: str) -> dict:
    return {k: v for k, v in GOOD.items() if k != key}


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("not a mapping", "epoch"),
        (without("epoch"), "epoch"),
        ({**GOOD, "epoch": 0}, "epoch"),
        ({**GOOD, "epoch": True}, "epoch"),
        ({**GOOD, "epoch": 3.0}, "epoch"),
        ({**GOOD, "epoch": 2**32}, "epoch"),  # it travels in a 32-bit header field
        (without("primary"), "primary"),
        ({**GOOD, "primary": 3}, "primary"),
        ({**GOOD, "primary": -1}, "primary"),
        ({**GOOD, "primary": True}, "primary"),
        (without("lease"), "lease"),
        ({**GOOD, "lease": "99"}, "lease"),
        ({**GOOD, "lease": -1}, "lease"),
        (without("in_sync"), "in_sync"),
        ({**GOOD, "in_sync": "1,2"}, "in_sync"),
        ({**GOOD, "in_sync": [1, True]}, "in_sync"),
        ({**GOOD, "in_sync": [1, 2.0]}, "in_sync"),
        ({**GOOD, "in_sync": [1, 3]}, "in_sync"),
        ({**GOOD, "in_sync": [1, -1]}, "in_sync"),
        ({**GOOD, "in_sync": [1, 2, 1]}, "in_sync"),
        ({**GOOD, "in_sync": [0, 2]}, "in_sync"),  # the primary is not among them
        ({**GOOD, "in_sync": []}, "in_sync"),
    ],
)
def test_a_bad_record_is_refused_naming_its_key_and_field(value, field):
    with pytest.raises(ValueError, match=rf"^etcd key sync/5: '{field}'"):
        BucketRecord.parse(value, 1, 3, "etcd key sync/5")


# --------------------------------------------------------------------------- member record


def test_a_member_reads_back_what_it_wrote_with_the_buckets_it_saw():
    member = MemberRecord("10.0.0.2:7000", LEASE[1], 2, frozenset({0, 5}))
    assert member.value()["seen"] == [0, 5]  # a list, sorted: JSON has no sets
    assert MemberRecord.parse(member.value(), 6, "members/1") == member
    nothing = MemberRecord("h:1", 7, 1, frozenset())
    assert MemberRecord.parse(nothing.value(), 6, "members/1").seen == frozenset()


MEMBER = {"address": "h:7000", "lease": 99, "lease_s": 2, "seen": [0, 3]}


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("h:7000", "a member must be an object"),
        ({k: v for k, v in MEMBER.items() if k != "address"}, "'address'"),
        ({**MEMBER, "address": ""}, "'address'"),
        ({**MEMBER, "address": 7000}, "'address'"),
        ({k: v for k, v in MEMBER.items() if k != "lease"}, "'lease'"),
        ({**MEMBER, "lease": -1}, "'lease'"),
        ({**MEMBER, "lease": "99"}, "'lease'"),
        ({**MEMBER, "lease_s": 0}, "'lease_s'"),
        ({**MEMBER, "lease_s": 2.5}, "'lease_s'"),
        ({k: v for k, v in MEMBER.items() if k != "seen"}, "'seen' must list"),
        ({**MEMBER, "seen": [0, 4]}, "'seen' must list"),  # 4 buckets: 0 to 3
        ({**MEMBER, "seen": [-1]}, "'seen' must list"),
        ({**MEMBER, "seen": [1, 1]}, "'seen' must list"),
        ({**MEMBER, "seen": [True]}, "'seen' must list"),
        ({**MEMBER, "seen": "0,3"}, "'seen' must list"),
        ({**MEMBER, "seen": True}, "'seen' is True .*earlier hogwild"),  # the old, per-job form
        ({**MEMBER, "seen": False}, "'seen' is False .*earlier hogwild"),
    ],
)
def test_a_bad_member_is_refused_naming_its_key_and_field(value, field):
    with pytest.raises(ValueError, match=rf"^etcd key members/1: {field}"):
        MemberRecord.parse(value, 4, "etcd key members/1")


# --------------------------------------------------------------------------- one TTL bound


def test_one_lease_ttl_bound_for_the_config_a_server_a_member_record_and_the_map():
    """``MAX_LEASE_S`` is the longest TTL everywhere: the config takes it and refuses a second
    more, a server's options likewise (``--lease-s`` bypasses the config's check), a member
    record holding it is read back and one a second longer is refused naming its key, so a
    client's map read never waits on a TTL that no server of the job can hold."""
    from hogwild_plugins.ps.routes import parse_map
    from hogwild_plugins.ps.serving.options import ServerOptions

    from hogwild.config import config_from_dict
    from hogwild.config.checks import MAX_LEASE_S
    from hogwild.errors import HogwildError
    from tests.config_cases import error_of, small

    assert config_from_dict(small(ps={"lease_s": MAX_LEASE_S})).ps.lease_s == MAX_LEASE_S
    assert f"ps.lease_s must be 0 (auto) to {MAX_LEASE_S}" in error_of(
        small(ps={"lease_s": MAX_LEASE_S + 1})
    )
    at = ServerOptions(job="j", servers=("127.0.0.1:1",), lease_s=MAX_LEASE_S, copies=1)
    at.check()
    over = ServerOptions(job="j", servers=("127.0.0.1:1",), lease_s=MAX_LEASE_S + 1, copies=1)
    with pytest.raises(HogwildError, match=rf"lease_s .* 1 to {MAX_LEASE_S} seconds, got 3601"):
        over.check()

    longest = {**MEMBER, "lease_s": MAX_LEASE_S}
    assert MemberRecord.parse(longest, 4, "members/1").lease_s == MAX_LEASE_S
    members, _ = parse_map({"members/1": (longest, 3)}, 2, 4)
    assert members[1].lease_s == MAX_LEASE_S
    with pytest.raises(HogwildError, match=r"etcd key members/1: 'lease_s' must be .*3601\)"):
        parse_map({"members/1": ({**MEMBER, "lease_s": MAX_LEASE_S + 1}, 3)}, 2, 4)


# --------------------------------------------------------------------------- replaced


def test_a_process_is_replaced_only_by_a_marker_naming_a_lease_it_held():
    """The driver's ``revoked/<i>`` marker names the lease it ended early: the process that
    held it stops (another is started as server ``i``); an earlier incarnation's marker, or
    another server's, or one naming no lease, leaves it running."""
    from hogwild_plugins.ps.failover import replaced

    mine = [0x11, 0x12]  # a lease lost (paused past it) and taken anew
    assert replaced([("revoked/1", {"lease": 0x11, "lease_s": 2})], 1, mine) == 0x11
    assert replaced([("revoked/1", {"lease": 0x12, "lease_s": 2})], 1, mine) == 0x12
    assert replaced([("revoked/1", {"lease": 0x0F, "lease_s": 2})], 1, mine) is None  # earlier
    assert replaced([("revoked/2", {"lease": 0x11, "lease_s": 2})], 1, mine) is None  # another
    assert replaced([("revoked/1", {"lease_s": 2}), ("revoked/1", "x")], 1, mine) is None
    assert replaced([("revoked/1", {"lease": True})], 1, [1]) is None  # a bool is no lease
    assert replaced([("members/1", {"lease": 0x11})], 1, mine) is None


def test_a_marker_names_every_lease_revoked_while_it_lived_and_each_holder_stops():
    """Review S, risk 1: a second revoke of index ``i`` while its marker lives names the first
    lease too, so the first process, back from a cut, still finds its own; a marker written
    before ``leases`` (its ``lease`` alone) is still read; the list is bounded, oldest dropped."""
    from hogwild_plugins.ps.failover import (
        MARKER_LEASES,
        marker_leases,
        merged_leases,
        replaced,
    )

    first = {"lease": 0x11, "leases": merged_leases(None, 0x11), "lease_s": 2}
    second = {"lease": 0x22, "leases": merged_leases(first, 0x22), "lease_s": 2}
    assert second["leases"] == [0x11, 0x22]
    assert replaced([("revoked/1", second)], 1, [0x11]) == 0x11  # the first incarnation
    assert replaced([("revoked/1", second)], 1, [0x22]) == 0x22
    assert replaced([("revoked/1", second)], 1, [0x11, 0x22]) == 0x22  # the newest first
    assert replaced([("revoked/1", second)], 1, [0x33]) is None  # a later incarnation
    assert marker_leases({"lease": 0x11, "lease_s": 2}) == [0x11]  # a marker of before
    assert merged_leases({"lease": 0x11}, 0x22) == [0x11, 0x22]
    assert marker_leases({"lease": 1, "leases": [True, "x", 2, 1]}) == [2, 1]
    assert merged_leases({"lease": 0x22, "leases": [0x22]}, 0x22) == [0x22]  # named once
    chain = None
    for lease in range(1, MARKER_LEASES + 3):
        chain = {"lease": lease, "leases": merged_leases(chain, lease)}
    assert chain["leases"] == list(range(3, MARKER_LEASES + 3))


def test_a_marker_read_counts_only_its_newest_leases_however_long_its_list():
    """Review U, risk 1: a ``revoked/<i>`` marker's ``leases`` comes from etcd, so anyone who
    can write the key can make it long; a read counts only its newest MARKER_LEASES (a holder
    named only further back goes on, as one dropped from a marker the driver wrote would)."""
    from hogwild_plugins.ps.failover import MARKER_LEASES, marker_leases, replaced

    huge = {"lease": 7, "leases": list(range(1, 200_001)), "lease_s": 2}
    newest = list(range(200_001 - MARKER_LEASES, 200_001))
    assert marker_leases(huge) == [*newest, 7]
    assert replaced([("revoked/1", huge)], 1, [newest[0]]) == newest[0]
    assert replaced([("revoked/1", huge)], 1, [newest[0] - 1]) is None  # too far back
    assert replaced([("revoked/1", huge)], 1, [7]) == 7
