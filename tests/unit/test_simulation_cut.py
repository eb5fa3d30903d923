"""A host cut off with both sides alive (the opt-in fault ``cut`` of plugins/ps/simulation/): its
messages wait until it is back, its heartbeat fails, its map reads fail, a record write waits and
reaches etcd once the link returns. Seeded schedules with it keep every invariant and heal, and
the schedule that found a campaign taken as won after another overtook it (seed 1538: the
record read back named the other copy) keeps them too."""

from __future__ import annotations

from hogwild_plugins.ps.simulation import FAULTS, run_seed
from hogwild_plugins.ps.simulation.liveness import heal_and_check

SEEDS = range(30)


def test_cut_hosts_keep_every_invariant():
    cuts = acknowledged = 0
    for seed in SEEDS:
        world = run_seed(seed, 120, faults=FAULTS | {"cut"})  # raises Violation if broken
        cuts += sum("is cut off" in line for line in world.schedule)
        acknowledged += world.counts["acknowledged"]
    assert cuts > 0, "no host was cut off: the fault was never reached"
    assert acknowledged > 0


def test_a_campaign_overtaken_before_its_read_back_is_lost():
    world = run_seed(1538, 200, faults=FAULTS | {"cut"})
    assert any("is cut off" in line for line in world.schedule)
    heal_and_check(world)
