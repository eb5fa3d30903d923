"""The fault bench's figures from its records (bench/support/failover_stages.py's pure functions, on
made-up acknowledgements, map history and takeovers): each fault's outage is its own, not the
next fault's; a cut's lease stage is bounded by the takeover it allowed; a cut whose etcd
leader was not known is counted as unknown, not as a kept leader; a stuck wait is told in a line;
the ledger servers' lease is ``ps serve``'s default unless asked."""

from __future__ import annotations

from hogwild_plugins.ps.serving.options import DEFAULT_LEASE_S

from bench.figures import partitions
from bench.support import failover_stages, hosts_cluster


def acks_every(start: float, stop: float, step: float = 0.1) -> list[list[float]]:
    """Acknowledgements ``[sent, acknowledged]`` every ``step`` from ``start`` to ``stop``."""
    n = round((stop - start) / step)
    return [[start + i * step - 0.05, start + i * step] for i in range(n + 1)]


def test_a_fault_is_not_charged_with_the_next_faults_outage():
    # fault A at 10 s heals at 11 s: no acknowledgement from 10.0 to 12.0 (2 s); fault B starts
    # at 12.5 s, 1.5 s after A healed (inside A's window of SETTLE_S after it): nothing is
    # acknowledged from 12.4, the last acknowledgement before it, to 19.5 (7.1 s)
    acks = acks_every(0.0, 10.0) + acks_every(12.0, 12.4) + acks_every(19.5, 25.0)
    a_end = min(11.0 + partitions.SETTLE_S, 12.5)
    assert failover_stages.longest_gap(acks, 10.0, a_end, next_fault=12.5) == 2.0
    assert failover_stages.longest_gap(acks, 12.5, 12.5 + partitions.SETTLE_S) == 7.1
    # unbounded, the gap around B's outage starts inside A's window: 7.1 s for A too
    assert failover_stages.longest_gap(acks, 10.0, a_end) == 7.1


def test_a_gap_open_when_the_next_fault_starts_counts_up_to_it_for_the_first():
    # no acknowledgement from 10.0 to 16.0; the next fault starts at 13.0, inside that gap
    acks = acks_every(0.0, 10.0) + acks_every(16.0, 20.0)
    assert failover_stages.longest_gap(acks, 10.0, 13.0, next_fault=13.0) == 3.0
    assert failover_stages.longest_gap(acks, 13.0, 13.0 + partitions.SETTLE_S) == 6.0  # from 10.0
    assert failover_stages.longest_gap([], 10.0, 13.0, next_fault=13.0) is None


def cut(leader_host: int | None = 2) -> dict:
    """A cut of host 2 (server 1), primary of bucket 0 at epoch 3, at 100 s."""
    return {"kind": "cut_primary", "host": 2, "at": 100.0, "until": 110.0,
            "primary_of": [0], "epochs": {"0": 3}, "etcd_leader_host": leader_host}  # fmt: skip


def takeover(won: float, epoch: int = 4, serving: float | None = None, ack: float | None = None):
    return {"bucket": 0, "epoch": epoch, "server": 2, "won_at": won,
            "serving_at": serving, "first_ack_at": ack}  # fmt: skip


def test_the_lease_stage_is_bounded_by_the_takeover_when_the_read_came_late():
    # the map read without server 1 came at 103.0, but the takeover was won at 102.0: the
    # lease was gone by 102.0 (a successor campaigns only then), and the read was late
    history = [[99.0, [0, 1, 2], 1, {}], [103.0, [0, 2], 1, {}]]
    stages = failover_stages.breakdown(cut(), 113.0, history, [takeover(102.0, serving=102.5)])
    assert stages["lease_gone_by_s"] == 2.0 and stages["lease_read_late"] is True
    assert stages["recorded_s"] == 2.0 and stages["serving_s"] == 2.5
    assert stages["first_ack_s"] is None  # no first acknowledgement seen: not made up


def test_the_lease_stage_is_the_read_when_it_came_first_and_ignores_reads_after_the_window():
    history = [[99.0, [0, 1, 2], 1, {}], [101.5, [0, 2], 1, {}]]
    stages = failover_stages.breakdown(cut(), 113.0, history, [takeover(102.0, ack=102.7)])
    assert stages["lease_gone_by_s"] == 1.5 and stages["lease_read_late"] is False
    assert stages["first_ack_s"] == 2.7
    # the cut ended before any takeover and the server's member went missing later, after the
    # window's end: that lapse is not this cut's
    late = [[99.0, [0, 1, 2], 1, {}], [130.0, [0, 2], 1, {}]]
    stages = failover_stages.breakdown(cut(), 113.0, late, [])
    assert stages["lease_gone_by_s"] is None and stages["lease_read_late"] is None
    assert stages["back_before_takeover"] == [0] and stages["recorded_s"] is None


def test_a_partial_ledger_result_leaves_every_takeover_stage_unknown():
    # the client stopped before it read the servers' takeovers: none is "no takeover"
    history = [[99.0, [0, 1, 2], 1, {}], [101.5, [0, 2], 1, {}]]
    stages = failover_stages.breakdown(cut(), 113.0, history, None)
    assert stages["lease_gone_by_s"] == 1.5  # the map read's bound, which needs no takeover
    for stage in ("lease_read_late", "recorded_s", "serving_s", "first_ack_s"):
        assert stages[stage] is None, stage
    assert stages["back_before_takeover"] is None and stages["takeovers"] is None
    assert failover_stages.breakdown(cut(), 113.0, history, [])["back_before_takeover"] == [0]


def test_a_cut_whose_etcd_leader_was_not_known_is_counted_as_unknown():
    history: list[list] = []
    assert failover_stages.breakdown(cut(2), 113.0, history, [])["etcd_leader_cut"] is True
    assert failover_stages.breakdown(cut(3), 113.0, history, [])["etcd_leader_cut"] is False
    assert failover_stages.breakdown(cut(None), 113.0, history, [])["etcd_leader_cut"] is None
    old = {k: v for k, v in cut().items() if k != "etcd_leader_host"}  # a record from before
    assert failover_stages.breakdown(old, 113.0, history, [])["etcd_leader_cut"] is None


def test_the_ledger_servers_lease_is_ps_serves_default_unless_asked():
    assert partitions.parse_args([]).lease_s == DEFAULT_LEASE_S == 2
    assert partitions.parse_args(["--lease-s", "1"]).lease_s == 1


def test_a_stuck_wait_is_told_in_a_line_naming_the_short_buckets_and_who_is_alive():
    report = {
        "least": 2,
        "map": {
            "age_s": 0.4,
            "last_ack_age_s": 71.2,
            "buckets_short": ["3"],
            "buckets": {"2": [0, [0, 1], 4], "3": [1, [1], 5]},
        },
        "client_alive": True,
        "servers_alive": {1: True, 2: False, 3: True},
        "etcd_alive": {1: True, 2: True, 3: True},
    }
    line = hosts_cluster.stuck_brief(report)
    assert "last map 0.4 s old" in line and "last acknowledgement 71.2 s ago" in line
    assert "or 2 in-sync servers: 3 [1, [1], 5]," in line and "2 [0, [0, 1], 4]" not in line
    assert "ledger servers {1: True, 2: False, 3: True}" in line
    never = {**report, "map": {**report["map"], "last_ack_age_s": None, "buckets_short": []}}
    assert "servers: none, last acknowledgement never" in hosts_cluster.stuck_brief(never)
    assert hosts_cluster.stuck_brief({**report, "map": None}).startswith("no map published; alive")
