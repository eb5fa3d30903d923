"""Shared steps of the bucket role's tests (plugins/ps/replication/bucket_role.py), with no socket.

Where etcd decides (a campaign or an in-sync write is a compare-and-swap on ``sync/<b>``'s
revision), :class:`SyncKeys` stands in with etcd's transaction semantics and nothing else, and
:func:`carry_out` dispatches actions to it the way the replication's adapter does. The members
are what the adapter reads: ``{server: its lease}``. :func:`step` hands a role one stimulus and
checks its invariants after it, as every test here does.
"""

from __future__ import annotations

import itertools

from hogwild_plugins.ps.failover import BucketRecord, desired_copies
from hogwild_plugins.ps.replication.bucket_role import BucketRole
from hogwild_plugins.ps.replication.bucket_role_events import (
    Campaign,
    CampaignAnswered,
    CopyUnreachable,
    HandOver,
    HandOverAnswered,
    InSyncWritten,
    MapRead,
    Restored,
    SnapshotDelivered,
    Sync,
    WriteInSync,
)

BUCKET = 5
COPIES = 3
LEASE = {s: 0x7000 + s for s in range(8)}  # each server's etcd session lease
NEW_LEASE = {s: 0x9000 + s for s in range(8)}  # ... once it registered again (restart, lapse)
TTL = 10.0  # the lease TTL: a takeover's wait for reads, in the units of CampaignAnswered's at


_ids = itertools.count()


def step(role: BucketRole, stimulus, *args, **kwargs) -> list:
    """Hand ``role`` one stimulus (a new id) and check its invariants; its actions."""
    actions = role.handle(stimulus(*args, **kwargs, stimulus_id=f"test-{next(_ids)}"))
    role.validate_state()
    return actions


def live(servers) -> dict[int, int]:
    """The members ``{server: lease}``: every one of ``servers`` under its usual lease."""
    return {s: LEASE[s] for s in servers}


class SyncKeys:
    """The ``sync/<b>`` keys with etcd's transaction semantics: one revision counter that every
    write advances; a campaign for an absent key creates it only if still absent, every other
    write replaces the value only if the key's mod revision is still the one expected."""

    def __init__(self, n_servers: int = 3) -> None:
        self.n_servers = n_servers
        self.revision = 0
        self.values: dict[int, tuple[dict, int]] = {}

    def transact(self, action: Campaign | WriteInSync | HandOver) -> bool:
        current = self.values.get(action.bucket)
        if (current[1] if current else 0) != action.expected:
            return False
        self.revision += 1
        self.values[action.bucket] = (action.record.value(), self.revision)
        return True

    def read(self, bucket: int = BUCKET) -> BucketRecord | None:
        if bucket not in self.values:
            return None
        value, revision = self.values[bucket]
        return BucketRecord.parse(value, revision, self.n_servers, f"sync/{bucket}")


def carry_out(role, actions, keys, roles=None, reachable=lambda s: True) -> list:
    """Carry ``actions`` out as the replication thread does. A snapshot reaches the servers for
    which ``reachable`` is true, and their role in ``roles`` (if given) is restored. Returns
    every action carried out, in order."""
    done, todo = [], list(actions)
    while todo:
        action = todo.pop(0)
        done.append(action)
        if isinstance(action, Campaign):
            won = keys.transact(action)
            record = keys.read(action.bucket)
            todo += step(role, CampaignAnswered, won and record is not None, record)
        elif isinstance(action, WriteInSync):
            ok = keys.transact(action)
            todo += step(role, InSyncWritten, ok, keys.read(action.bucket))
        elif isinstance(action, HandOver):
            ok = keys.transact(action)
            todo += step(role, HandOverAnswered, ok, keys.read(action.bucket))
        elif isinstance(action, Sync):
            if not reachable(action.server):
                todo += step(role, CopyUnreachable, action.server)
                continue
            if roles is not None:
                step(roles[action.server], Restored, role.epoch)
            todo += step(role, SnapshotDelivered, action.server)
    return done


def cluster(servers=range(3)) -> dict[int, BucketRole]:
    return {s: BucketRole(BUCKET, s, COPIES, lease_ttl=TTL) for s in servers}


def observe_all(roles, keys, members) -> None:
    """Every live server reads the map and carries out what its role asks."""
    for s, role in roles.items():
        if members.get(s) == LEASE[s]:
            carry_out(role, step(role, MapRead, keys.read(), members, LEASE[s], True), keys, roles)


def established(servers=range(3)) -> tuple[dict[int, BucketRole], SyncKeys, int]:
    """A bucket whose first primary won and caught up every copy; everyone has read the map."""
    keys, roles = SyncKeys(len(servers)), cluster(servers)
    observe_all(roles, keys, live(servers))
    observe_all(roles, keys, live(servers))
    primary = keys.read().primary
    assert roles[primary].serving
    assert set(keys.read().in_sync) == set(desired_copies(BUCKET, live(servers), COPIES))
    return roles, keys, primary


def first_primary(members: dict[int, int], keys: SyncKeys) -> BucketRole:
    """The first desired copy of a new bucket, its campaign accepted by etcd (and not yet
    reported to it: the caller calls ``campaigned``)."""
    first = desired_copies(BUCKET, members, COPIES)[0]
    role = BucketRole(BUCKET, first, COPIES, lease_ttl=TTL)
    [campaign] = step(role, MapRead, None, members, LEASE[first], True)
    assert keys.transact(campaign)
    return role


def lapsed_primary(servers=range(3)):
    """An established bucket whose primary's member key just lapsed."""
    roles, keys, primary = established(servers)
    return roles, keys, primary, live(s for s in servers if s != primary)


def failed_over(servers=range(3)):
    """An established bucket whose preferred primary died; the survivors took it over and
    settled. Returns the roles, the keys, the dead server and the survivors' members."""
    roles, keys, preferred = established(servers)
    survivors = live(s for s in servers if s != preferred)
    settle(roles, keys, survivors)
    assert keys.read().primary != preferred
    return roles, keys, preferred, survivors


def settle(roles, keys, members, rounds: int = 8) -> int:
    """Every live server (``members``: ``{server: lease}``) reads the map and carries out what
    it asks, until a round in which none asks anything; returns how many rounds asked."""
    for n in range(rounds):
        acted = False
        for s, role in roles.items():
            if s in members:
                actions = step(role, MapRead, keys.read(), members, members[s], True)
                acted |= bool(actions)
                carry_out(role, actions, keys, roles)
        if not acted:
            return n
    raise AssertionError(f"the map did not settle in {rounds} rounds")
