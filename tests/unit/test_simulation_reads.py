"""What a pull may see after a failover (plugins/ps/simulation/, the wait for reads of
``BucketRole.reads_open``): a primary whose lease etcd dropped early (revoked: the driver ends the
lease of a server it takes for dead, which may only be paused) still believes its lease by its own
clock, so its successor answers no pull until that clock must have run out (the lease TTL after
its campaign came back). Found by ``bench/simulate.py --with cut`` at seeds 2496 (100 steps) and
25155 (300 steps): the paused primary, resumed, answered a pull with values older than what its
client had read from the successor.
"""

from __future__ import annotations

import pytest
from hogwild_plugins.ps.failover import REVOKED_TTLS, desired_copies
from hogwild_plugins.ps.replication import bucket_role_map_read
from hogwild_plugins.ps.simulation import FAULTS, Violation, run_seed
from hogwild_plugins.ps.simulation.etcd import SimEtcd
from hogwild_plugins.ps.simulation.liveness import heal_and_check
from hogwild_plugins.ps.simulation.world import Config, World, established

from tests.unit.simulation_support import primary_of

SHARD = 2  # of bucket 1
MIXED_SEEDS = 60  # seeded schedules with mixed lease TTLs (about half a CPU-s)
# a server whose lease the driver revoked goes on (it does not stop at its next map read): the
# model of a holder whose replication thread reads no map while it is revoked
GOES_ON = Config(replaced_stops=False)


def pull(world: World, server: int, client: int = 0) -> int:
    """Client ``client``'s pull of ``SHARD`` put on its way to ``server``: its index in flight."""
    sender = world.clients[client].sender
    world.network.append((server, (None, 0, ("PULL", sender, SHARD, frozenset()))))
    return len(world.network) - 1


def write(world: World, client: int = 0) -> None:
    """Client ``client``'s next update of ``SHARD``, sent and settled (acknowledged if served)."""
    c = world.clients[client]
    c.seq += 1
    c.outstanding = (c.seq, SHARD)
    world.apply(("send", client))
    world.settle()


def deposed_while_paused(config: Config | None = None) -> tuple[World, int, int]:
    """The established world of ``config``, a pull of client 0 waiting at the paused primary of
    ``SHARD``'s bucket, whose lease etcd then drops early; a copy takes the bucket and
    acknowledges client 0's write. The world, the deposed primary, the successor."""
    world = established(config or Config())
    old = primary_of(world, SHARD).me
    pull(world, old)  # waits in the paused server's socket
    world.apply(("pause", old))
    world.apply(("expire", old))  # etcd drops its lease; its own clock still says valid
    world.apply(("revoke", old))  # answered at once
    world.apply(("tick",))
    world.settle()
    new = primary_of(world, SHARD)
    assert new.me != old and new.serving(SHARD)
    write(world)
    assert (100, 1) in world.clients[0].ledger
    return world, old, new.me


def test_a_successor_answers_no_pull_until_its_predecessors_lease_clock_ran_out():
    """Before the wait the successor answered at once, then the resumed primary answered the
    waiting pull without the write the client had read there: reads going back."""
    world, old, new = deposed_while_paused()
    reads = world.clients[0].reads
    assert world.servers[new].roles[1].reads_from == world.time + world.config.ttl
    pull(world, new)
    world.settle()
    assert not reads.get(SHARD), "the successor answered a pull inside its wait"
    world.apply(("resume", old))  # the waiting pull reaches it: its clock still says valid
    world.settle()
    assert reads[SHARD] == [(reads[SHARD][0][0], frozenset())]  # (asked before the write)
    for _ in range(2 * world.config.ttl):  # the bucket serves reads again (handed back, say)
        primary = primary_of(world, SHARD)
        if primary.answers_reads(SHARD):
            break
        world.apply(("tick",))
        world.settle()
    pull(world, primary.me)
    world.settle()
    assert reads[SHARD][-1][1] == {(100, 1)}


def test_without_the_wait_the_deposed_primary_answers_older_values_than_its_successor():
    """The same schedule with the wait taken away: the deposed primary's answer, served after
    the successor's and missing the write read there, is caught by the read invariant."""
    world, old, new = deposed_while_paused()
    world.servers[new].roles[1].reads.opens_at = world.time  # reads open at once, as before
    pull(world, new)
    world.settle()
    assert world.clients[0].reads[SHARD][-1][1] == {(100, 1)}
    world.apply(("resume", old))  # answers the waiting pull without it
    with pytest.raises(Violation) as caught:
        world.settle()
    assert "read shard 2 going back: [(100, 1)] seen, then not" in str(caught.value)


def test_the_seeds_that_found_reads_going_back_keep_every_invariant_and_heal():
    for seed, steps in ((2496, 100), (25155, 300)):
        heal_and_check(run_seed(seed, steps, faults=FAULTS | {"cut"}))


def test_a_primary_taking_back_its_own_record_keeps_the_wait_it_still_owes():
    """The successor's own lease ends inside its wait; it registers again and takes back the
    record it won (its thread first). Before the mend that campaign set its wait to nothing,
    it answered the write to a pull, and the resumed predecessor answered an older one."""
    # a successor whose lease the driver ends and that goes on (its replication thread reads
    # no map meanwhile; a real one that reads revoked/<me> stops: test_simulation_replaced.py)
    world, old, new = deposed_while_paused(GOES_ON)
    role = world.servers[new].roles[1]
    owed = role.reads_from
    assert owed > world.time
    world.apply(("expire", new))  # the successor's own lease ends early
    world.apply(("revoke", new))  # answered at once
    lease = world.servers[new].lease
    while world.servers[new].lease == lease:
        world.apply(("tick",))
    for _ in range(30):  # its thread runs before any copy's
        world.apply(("run", new))
        if role.role.value == "primary":
            break
    assert role.role.value == "primary" and primary_of(world, SHARD).me == new
    assert role.reads_from >= owed, "taking its record back shortened the wait it owed"
    # (once its reads open it may hand the bucket back, marked: its successor answers at once;
    # the paused predecessor still believes its lease)
    while not any(s.answers_reads(SHARD) for s in world.live() if s.me != old):
        assert world.time < owed, "answered no pull once the owed wait was over"
        world.apply(("tick",))
        world.settle()
    assert world.time >= owed
    world.apply(("resume", old))  # its clock has run out by now: it answers nothing
    world.settle()
    pull(world, primary_of(world, SHARD).me)
    world.settle()
    assert world.clients[0].reads[SHARD][-1][1] == {(100, 1)}


def test_a_successor_of_a_lapsed_lease_answers_at_once_and_reads_still_never_go_back():
    """A paused primary whose lease etcd lets lapse (no revocation, so no ``revoked/`` marker):
    its own clock gave up before etcd dropped the lease, so its successor answers pulls as its
    campaign comes back (review E's A2), and the resumed primary answers nothing older."""
    world = established()
    old = primary_of(world, SHARD).me
    pull(world, old)  # waits in the paused server's socket
    world.apply(("pause", old))
    lease = world.servers[old].lease
    while lease in world.etcd.leases:  # its heartbeat stopped: the lease lapses in time
        world.apply(("tick",))
    world.settle()
    assert not world.etcd.revoked()
    new = primary_of(world, SHARD)
    assert new.me != old and new.answers_reads(SHARD)
    write(world)
    pull(world, new.me)
    world.settle()
    assert world.clients[0].reads[SHARD][-1][1] == {(100, 1)}
    world.apply(("resume", old))  # the waiting pull reaches it: its clock ran out, it refuses
    world.settle()
    assert all(values == {(100, 1)} for _, values in world.clients[0].reads[SHARD])


def test_a_revocation_without_its_marker_lets_two_servers_answer_reads():
    """The schedule of :func:`deposed_while_paused` with the lease revoked as before the
    marker (``etcd.revoke`` alone) and no pull anywhere: the successor would answer at once
    while the paused primary's clock still says valid. The one-reader invariant (review I2)
    names it at the step the successor takes the bucket, though no client ever pulls; the
    marker is what makes the successor wait."""
    world = established()
    old = primary_of(world, SHARD).me
    world.apply(("pause", old))
    world.etcd.revoke(world.servers[old].lease)  # no revoked/<old> marker
    world.apply(("tick",))
    with pytest.raises(Violation) as caught:
        world.settle()
    assert "bucket 1's pulls answered by servers" in str(caught.value)
    assert not any(line.endswith("-> []") or "PULL" in line for line in world.schedule)


def test_a_pull_inside_the_wait_is_held_and_sent_again_to_the_same_primary():
    """The simulated client's held path (the real client's ``READS_WAITING``): a pull the
    successor refuses inside its wait comes back ``READS_WAITING``, the client holds it for
    that server, and the re-sends (no map read) are answered once the wait is over."""
    world, old, new = deposed_while_paused()
    client = world.clients[0]
    pull(world, new)
    world.settle()
    assert client.held is not None and client.held[:2] == (new, SHARD)
    while not client.reads.get(SHARD):
        assert world.time <= world.servers[new].roles[1].reads_from, "never answered"
        if client.held is not None:
            world.apply(("resend held", 0))  # to the same server, as it was refused by
            assert world.network[-1][0] == new
        world.settle()
        if not client.reads.get(SHARD):
            world.apply(("tick",))
    assert client.reads[SHARD][-1][1] == {(100, 1)}


def revoked_late(world: World) -> tuple[int, int]:
    """The driver marks the primary of ``SHARD``'s bucket revoked, its revoke comes back as late
    as the driver still sends it (``REVOKED_TTLS`` TTLs: the primary renewed its lease all
    along), the primary is paused as it lands, and a copy takes the bucket a tick later:
    the primary and its successor."""
    old = primary_of(world, SHARD).me
    world.revokes.randrange = lambda start, stop: stop - 1  # too late by itself: sent below
    world.apply(("expire", old))  # the marker
    marked = world.time
    while world.time < marked + REVOKED_TTLS * world.config.ttl:
        world.apply(("tick",))
        world.settle()
    assert world.servers[old].serving(SHARD)  # renewed all along
    world.apply(("pause", old))
    world.apply(("revoke", old))  # sent just in time
    assert old not in world.etcd.members()
    world.apply(("tick",))
    world.settle()
    return old, primary_of(world, SHARD).me


def test_a_late_revoke_keeps_its_marker_past_the_holders_last_answer(monkeypatch):
    """Review I1: the revoked holder answers by its clock up to 3/4 TTL after the revoke, so
    the marker must live that long after the revoke, not after its grant: the driver renews
    it once the revoke came back. Without the renewal the successor of a late revoke finds no
    marker, answers at once, and two servers answer the bucket's pulls."""
    world = established(GOES_ON)  # a holder that reads no map from its marker to its pause
    old, new = revoked_late(world)
    assert new != old and world.etcd.revoked()
    assert world.servers[new].roles[1].reads_from > world.time  # it waits

    monkeypatch.setattr(SimEtcd, "revoke_marked", lambda etcd, lease, *_: etcd.revoke(lease))
    with pytest.raises(Violation, match="bucket 1's pulls answered by servers"):
        revoked_late(established(GOES_ON))


LONG, SHORT = 20, 4  # ticks: a revoked holder's lease TTL, and its successors'


def mixed_ttls() -> Config:
    """Servers given different lease TTLs (``ps serve --lease-s``): the primary of ``SHARD``'s
    bucket in the established start holds the long one, the others the short one."""
    first = desired_copies(1, range(Config().servers), Config().copies)[0]
    return Config(ttls=tuple(LONG if i == first else SHORT for i in range(Config().servers)))


def revoked_while_paused(config: Config) -> tuple[World, int, int]:
    """The established world of ``config``; the primary of ``SHARD``'s bucket paused, its
    lease revoked (marked, naming its TTL), a copy taking the bucket: the world, the holder,
    the successor."""
    world = established(config)
    old = primary_of(world, SHARD).me
    assert world.servers[old].ttl == LONG
    world.apply(("pause", old))
    world.apply(("expire", old))
    world.apply(("revoke", old))
    world.apply(("tick",))
    world.settle()
    new = primary_of(world, SHARD).me
    assert new != old and world.servers[new].ttl == SHORT
    return world, old, new


def test_a_successor_with_a_short_ttl_waits_out_the_revoked_holders_long_one():
    """Review I's I7: the successor waits the TTL its predecessor's marker names (the
    holder's clock runs on its own lease TTL), not its own; the one-reader invariant checks
    every step of the wait, and the successor answers once it is over."""
    world, old, new = revoked_while_paused(mixed_ttls())
    assert world.etcd.revoked() == LONG
    assert world.servers[new].roles[1].reads_from == world.time + LONG
    for _ in range(LONG):  # every step checked: at most one server answers the bucket's pulls
        assert not world.servers[new].answers_reads(SHARD)
        world.apply(("tick",))
        world.settle()
    assert primary_of(world, SHARD).answers_reads(SHARD)


def test_a_successor_waiting_its_own_short_ttl_lets_two_servers_answer_reads(monkeypatch):
    """The same schedule with the wait as it was (the successor's own TTL): the paused holder,
    its clock on its long TTL, still answers by it when the successor's reads open."""

    def own_ttl(record, me, won_epoch, own, revoked):
        return own if record.primary != me and revoked else 0.0

    monkeypatch.setattr(bucket_role_map_read, "takeover_wait", own_ttl)
    world, old, new = revoked_while_paused(mixed_ttls())
    with pytest.raises(Violation, match="bucket 1's pulls answered by servers"):
        for _ in range(SHORT + 1):
            world.apply(("tick",))
            world.settle()


def test_seeded_schedules_with_mixed_ttls_keep_every_invariant():
    """Seeds of servers whose lease TTLs differ (3, 10 and 20 ticks), every fault drawn."""
    config = Config(ttls=(3, 10, 20))
    for seed in range(MIXED_SEEDS):
        run_seed(seed, 120, config)
    heal_and_check(run_seed(MIXED_SEEDS, 120, config))
