"""The simulator's revoked marker (``SimEtcd.mark`` and ``revoke_marked``) does what the
driver's ``controller.revoke_marked`` does to etcd: the real function, run on the simulator's
etcd through the few calls it makes, leaves the same marker, naming the same TTL and living as
long, as the simulator's own two halves, whatever the order of TTLs of two incarnations."""

from __future__ import annotations

import pytest
from hogwild_plugins.ps.controller import revoke_marked
from hogwild_plugins.ps.failover import REVOKED_PREFIX, marker_life
from hogwild_plugins.ps.simulation.etcd import MARKER_REQUEST_TICKS, SimEtcd

from hogwild.config.checks import MAX_LEASE_S
from hogwild.errors import HogwildError


class DriverView:
    """The calls ``revoke_marked`` makes of :class:`~hogwild_plugins.ps.etcd.Etcd`, carried
    out on a :class:`SimEtcd` at a fixed tick (etcd's own semantics: a keepalive renews a lease
    for the TTL it was granted, a transaction compares the key's mod revision)."""

    timeout_s = MARKER_REQUEST_TICKS / 2  # the simulator's request time, as marker_life takes it

    def __init__(self, etcd: SimEtcd, now: int) -> None:
        self.etcd, self.now = etcd, now

    def get(self, key: str):
        return self.etcd.get(key)

    def grant(self, ttl_s: int) -> int:
        return self.etcd.grant(ttl_s, self.now)

    def replace(self, key: str, value, expected: int, lease: int = 0) -> bool:
        if self.etcd.get(key)[1] != expected:
            return False
        self.etcd.put(key, value, lease=lease)
        return True

    def revoke(self, lease: int) -> None:
        self.etcd.revoke(lease)

    def keepalive(self, lease: int) -> int:
        return self.etcd.keepalive(lease, self.etcd.granted.get(lease, 0), self.now)


def marker(etcd: SimEtcd) -> tuple[int, int]:
    """Server 0's marker: the TTL it names and the tick its lease ends."""
    value, _, lease = etcd.keys[f"{REVOKED_PREFIX}0"]
    return value["lease_s"], etcd.leases[lease]


@pytest.mark.parametrize(("first", "second"), [(20, 4), (4, 20), (6, 6)])
def test_a_second_revoke_of_an_index_keeps_the_longer_ttl_as_the_drivers_transaction(first, second):
    """Review: the simulator overwrote an earlier incarnation's marker with the later TTL,
    where the driver keeps the longer (that incarnation may still answer reads on its own
    TTL). Incarnation one (TTL ``first``) revoked at tick 0, incarnation two (``second``) at
    tick 3, while the first marker lives."""
    real, sim = SimEtcd(1, 1), SimEtcd(1, 1)
    for tick, ttl in ((0, first), (3, second)):
        revoke_marked(DriverView(real, tick), 0, real.grant(ttl, tick), ttl)
        held = sim.grant(ttl, tick)
        sim.revoke_marked(held, sim.mark(0, held, ttl, tick), tick)
        assert marker(sim) == marker(real)
    # both incarnations' leases named, as the driver's: each holder stops when it reads it
    leases = [v["leases"] for v, _, _ in (e.keys[f"{REVOKED_PREFIX}0"] for e in (sim, real))]
    assert leases[0] == leases[1] and len(leases[0]) == 2
    longer = max(first, second)
    assert marker(sim) == (longer, 3 + marker_life(longer, MARKER_REQUEST_TICKS / 2))
    assert sim.revoked() == real.revoked() == longer


def test_a_revoke_over_a_marker_naming_a_ttl_past_the_bound_is_refused_naming_its_key():
    """A live ``revoked/0`` naming a TTL past ``MAX_LEASE_S`` (no driver's: ``ps.lease_s`` is
    bounded) is not taken as the cover to keep (a marker lease that long): the driver refuses,
    naming the key, revokes nothing (the lease lapses by itself) and leaves the marker as it
    was; a holder's own TTL past the bound is refused the same way."""
    etcd = SimEtcd(1, 1)
    key = f"{REVOKED_PREFIX}0"
    odd = {"lease": 3, "leases": [3], "lease_s": MAX_LEASE_S + 1}
    etcd.put(key, odd)
    held = etcd.grant(4, 0)
    with pytest.raises(HogwildError, match=f"etcd key {key} holds a revoked marker naming no"):
        revoke_marked(DriverView(etcd, 1), 0, held, 4)
    assert etcd.get(key)[0] == odd and held in etcd.leases  # nothing written, nothing revoked
    with pytest.raises(HogwildError, match=f"expected whole seconds from 1 to {MAX_LEASE_S}"):
        revoke_marked(DriverView(SimEtcd(1, 1), 1), 0, held, MAX_LEASE_S + 1)
