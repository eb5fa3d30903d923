"""A server the driver replaced stops (plugins/ps/simulation/, as the real adapter exits 2): a map
read whose ``revoked/<i>`` marker names a lease its process held takes it away before any role
hears of that read, and the driver's next process of that server is a new incarnation, which the
marker does not stop. Scripted here for the case the driver is there for: a primary whose host is
cut off (both sides alive) is revoked, a copy takes its buckets over, and the cut server, back
on the network, stops at its first read of the map; nothing acknowledged is lost."""

from __future__ import annotations

from hogwild_plugins.ps.simulation import FAULTS, run_seed
from hogwild_plugins.ps.simulation.liveness import heal_and_check
from hogwild_plugins.ps.simulation.world import World, established

from tests.unit.simulation_support import primary_of

SHARD = 2  # of bucket 1


def write(world: World, client: int = 0) -> tuple[int, int]:
    """Client ``client``'s next update of ``SHARD``, sent and settled: its ``(sender, seq)``."""
    c = world.clients[client]
    c.seq += 1
    c.outstanding = (c.seq, SHARD)
    world.apply(("send", client))
    world.settle()
    return c.sender, c.seq


def test_a_cut_primary_revoked_by_the_driver_stops_once_back_and_loses_nothing():
    world = established()
    old = primary_of(world, SHARD).me
    before = write(world)
    assert before in world.clients[0].ledger
    world.apply(("cut", old))
    world.apply(("expire", old))  # the driver lost it: marked, then revoked
    world.apply(("revoke", old))
    for _ in range(3 * world.config.ttl):  # a copy takes the bucket over
        world.apply(("tick",))
        world.settle()
        if primary_of(world, SHARD) is not None and primary_of(world, SHARD).me != old:
            break
    new = primary_of(world, SHARD).me
    assert new != old
    after = write(world)
    assert after in world.clients[0].ledger  # acknowledged by the successor
    cut = world.servers[old]
    assert cut is not None and cut.stopped is None  # alive, cut off: it read no map

    world.apply(("heal", old))
    world.apply(("tick",))  # its replication thread reads the map (the real one every 50 ms)
    world.settle()  # and finds the marker naming its lease
    assert world.servers[old] is None and world.counts["replaced_stops"] == 1
    assert cut.stopped and f"revoked/{old}" in cut.stopped
    assert any("it stopped (replaced)" in line for line in world.schedule)
    assert world.counts["died_with_every_copy"] == 0
    successor = world.servers[new]
    assert {before, after} <= set(successor.values[SHARD])
    world.check(full=True)  # every acknowledged update on every in-sync copy, once

    world.apply(("restart", old))  # the driver's new process of that server
    for _ in range(2):
        world.apply(("tick",))
        world.settle()
    assert world.servers[old] is not None and world.servers[old].stopped is None
    heal_and_check(world)  # it serves again; every client's update acknowledged


def test_a_seed_that_revokes_a_cut_server_stops_it_and_keeps_every_invariant():
    """Seed 963 (60 steps, with cuts): server 1's host is cut off, the driver marks its lease
    revoked; back on the network, it takes a prepare, then reads the map and stops; its next
    process heals with the others (the updates the clients had out acknowledged then)."""
    world = run_seed(963, 60, faults=FAULTS | {"cut"})  # raises Violation at a broken step
    lines = world.schedule
    cut = lines.index(next(line for line in lines if "server 1's host is cut off" in line))
    marked = lines.index(next(line for line in lines if "server 1's lease marked" in line))
    stop = lines.index(next(line for line in lines if "it stopped (replaced)" in line))
    assert cut < marked < stop and lines[stop].split(": ", 1)[1].startswith("server 1 runs")
    assert world.counts["died_with_every_copy"] == 0
    heal_and_check(world)  # every client's update acknowledged, on every copy, once
    assert world.counts["acknowledged"] >= 1 and world.servers[1] is not None
