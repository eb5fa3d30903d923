"""A parcel that cannot be taken (the real server's engine barrier timed out, its queues full)
answers its ``Sync`` as the copy unreachable, under its ticket: seeded schedules with the
opt-in fault ``unbuilt`` (a fifth of the parcels not taken) keep every invariant, the copies
left out are caught up later, and every acknowledged update is kept
(plugins/ps/simulation/, ``SimServer.send_snapshot`` as ``Replication.send_snapshot``)."""

from __future__ import annotations

from hogwild_plugins.ps.simulation import FAULTS, run_seed

SEEDS = range(40)


def test_unbuilt_parcels_keep_every_invariant():
    unbuilt = acknowledged = 0
    for seed in SEEDS:
        world = run_seed(seed, 120, faults=FAULTS | {"unbuilt"})  # raises Violation if broken
        unbuilt += world.counts["parcels_not_built"]
        acknowledged += world.counts["acknowledged"]
    assert unbuilt > 0, "no parcel was left untaken: the fault was never reached"
    assert acknowledged > 0


def test_without_the_fault_every_parcel_is_taken():
    world = run_seed(1, 120)
    assert world.counts["parcels_not_built"] == 0
