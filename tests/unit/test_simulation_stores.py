"""Servers with a store in the simulator (plugins/ps/simulation/, plugins/ps/replication/marks.py):
after etcd lost its keys, a server restarted on its store never starts a bucket afresh nor
joins one started afresh elsewhere, and one bucket's ``seen`` holds back no other bucket's first
primary. Scripted schedules of a few
hundred steps each (the seeded run, with stores on two servers of three, is test_simulation's).
"""

from __future__ import annotations

from hogwild_plugins.ps.simulation import Config, World
from hogwild_plugins.ps.simulation.world import established


def tick_and_settle(world: World, ticks: int) -> None:
    for _ in range(ticks):
        world.apply(("tick",))
        world.settle()


def acknowledged_then_wiped_and_every_server_restarted(config: Config) -> World:
    """An update acknowledged, etcd wiped, every server killed and restarted (in order), the
    clock run past the settle time and several leases: every step checked."""
    world = established(config)
    client = world.clients[0]
    client.outstanding, client.seq = (1, 0), 1
    world.apply(("send", 0))
    world.apply(("deliver", len(world.network) - 1))
    world.settle()
    assert client.ledger == {(100, 1): (0, 1)}
    world.apply(("wipe",))
    for i in range(config.servers):
        world.apply(("kill", i))
    for i in range(config.servers):
        world.apply(("restart", i))
    tick_and_settle(world, 3 * config.ttl)
    return world


def test_servers_restarted_on_their_stores_after_a_wipe_start_no_bucket_afresh():
    """Servers 0 and 1 have a store (they remember every bucket's epoch), server 2 has none: it
    learns from their ``members/<i>`` that each bucket had a record."""
    world = acknowledged_then_wiped_and_every_server_restarted(Config(stores=2))
    assert [world.etcd.record(b) for b in world.bucket_shards] == [None, None]
    for s in world.live():
        for bucket, role in s.roles.items():
            assert not role.serving and role.role.value == "follower"
            if s.me in world.stores:
                assert role.record_lost and s.marks.remembered[bucket][0] >= 1
            else:
                assert role.history.started and not role.record_lost
    assert world.etcd.seen() == {0, 1}  # the stores' servers list both buckets


def test_without_stores_a_wipe_and_every_server_restarted_starts_the_buckets_afresh():
    """The weaker promise, pinned: no server remembers, nobody registered saw a record; the
    update acknowledged before died with every process (forgiven), the buckets start again at
    epoch 1 as a new job's would."""
    world = acknowledged_then_wiped_and_every_server_restarted(Config(stores=0))
    assert [world.etcd.record(b).epoch for b in world.bucket_shards] == [1, 1]
    assert world.counts["died_with_every_copy"] == 1


def test_a_server_restarted_on_its_store_alone_waits_for_nobody_and_starts_nothing():
    """Only server 0 (with a store) comes back after the wipe: it is settled alone, first in no
    order that matters: it starts neither bucket over what it remembers."""
    config = Config(stores=1)
    world = established(config)
    world.apply(("wipe",))
    for i in range(config.servers):
        world.apply(("kill", i))
    world.apply(("restart", 0))
    tick_and_settle(world, 3 * config.ttl)
    assert [world.etcd.record(b) for b in world.bucket_shards] == [None, None]
    assert all(role.record_lost for role in world.servers[0].roles.values())


def test_one_buckets_seen_holds_back_no_other_buckets_first_primary():
    """A cold start: bucket 0's first primary (server 1) wins it and registers again (its lease
    expired early) listing bucket 0 before bucket 1's first primary (server 2) ran at all; with
    a ``seen`` for the whole job, bucket 1 would never start."""
    world = World(0, Config(), faults=())
    first0, first1 = world.servers[1], world.servers[2]
    for _ in range(10):
        if world.etcd.record(0) is not None:
            break
        world.apply(("run", first0.me))
    assert world.etcd.record(0) is not None and world.etcd.record(1) is None
    world.apply(("expire", first0.me))
    world.apply(("revoke", first0.me))  # answered at once
    for _ in range(5):  # its heartbeat finds the lease gone and registers again
        if world.etcd.member(first0.me) is not None:
            break
        world.apply(("tick",))
    assert world.etcd.member(first0.me).seen == {0}
    assert world.etcd.record(1) is None  # bucket 1's first primary has not run yet
    tick_and_settle(world, 2)
    assert world.etcd.record(1) is not None and world.etcd.record(1).epoch >= 1
    assert any(s.roles[1].serving for s in world.live())
    assert first1.roles[1].known_epoch >= 1


def test_a_server_restarted_on_its_store_never_joins_a_bucket_started_afresh_elsewhere():
    """The servers with a store die with etcd's keys; the one without restarts alone and, when
    it settles, starts both buckets afresh (its promise: it knew nothing). Server 0 then comes
    back on its store: the fresh records (epoch 1, or its own epoch under another holder) are
    another history to it: it never follows them, its memory is never replaced by their
    snapshots, and its store keeps the history it saw."""
    config = Config(stores=2)
    world = established(config)
    marked = dict(world.stores[0].epochs)
    world.apply(("wipe",))
    for i in range(config.servers):
        world.apply(("kill", i))
    world.apply(("restart", 2))
    tick_and_settle(world, 2 * config.settle)
    assert [world.etcd.record(b).primary for b in world.bucket_shards] == [2, 2]
    world.apply(("restart", 0))
    tick_and_settle(world, 2 * config.ttl)
    back = world.servers[0]
    for bucket, role in back.roles.items():
        assert role.record_lost and not role.current and role.record is None
        assert 0 not in world.etcd.record(bucket).in_sync
    assert world.stores[0].epochs == marked
