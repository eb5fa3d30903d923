"""Seeded random sequences of stimuli for three servers' roles in one bucket
(plugins/ps/replication/bucket_role.py), with no socket: servers read the map (under valid or lapsed
leases), die, come back as new processes, are fenced, lose copies and snapshots, while etcd's
transactions decide (``SyncKeys``). After every stimulus each role's ``validate_state`` runs
(:func:`~tests.unit.bucket_role_support.step`), and the bucket's safety is checked: never two
serving primaries in one epoch, and the record's epoch never goes back.
"""

from __future__ import annotations

import itertools
import random

from hogwild_plugins.ps.replication.bucket_role import BucketRole
from hogwild_plugins.ps.replication.bucket_role_events import CopyUnreachable, Fenced, MapRead

from tests.unit.bucket_role_support import BUCKET, COPIES, TTL, SyncKeys, carry_out, step

SERVERS = 3
SEEDS = 300
STEPS = 60


def run_random_sequence(seed: int) -> None:
    rng = random.Random(seed)
    keys = SyncKeys(SERVERS)
    new_leases = itertools.count(0xA000)
    lease = {s: next(new_leases) for s in range(SERVERS)}
    alive = set(range(SERVERS))
    roles = {s: BucketRole(BUCKET, s, COPIES, lease_ttl=TTL) for s in range(SERVERS)}
    last_epoch = 0

    def reachable(server: int) -> bool:
        return server in alive and rng.random() < 0.8

    for _ in range(STEPS):
        s, r = rng.randrange(SERVERS), rng.random()
        role = roles[s]
        if r < 0.6:
            if s not in alive:
                continue
            members = {m: lease[m] for m in alive}
            valid, settled = rng.random() < 0.9, rng.random() < 0.8
            actions = step(role, MapRead, keys.read(), members, lease[s], valid, settled)
            carry_out(role, actions, keys, roles, reachable)
        elif r < 0.7:
            alive.discard(s)  # killed: its member key lapses
        elif r < 0.8 and s not in alive:
            lease[s] = next(new_leases)  # a new process, a new lease, no state
            roles[s] = BucketRole(BUCKET, s, COPIES, lease_ttl=TTL)
            alive.add(s)
        elif r < 0.85:
            carry_out(role, step(role, Fenced), keys, roles, reachable)
        else:
            # a copy (never the primary itself: it sends no prepare to itself) failed it
            lost = rng.choice([c for c in range(SERVERS) if c != s])
            carry_out(role, step(role, CopyUnreachable, lost), keys, roles, reachable)
        for each in roles.values():
            each.validate_state()
        serving = [x.epoch for x in roles.values() if x.serving]
        assert len(serving) == len(set(serving)), f"two serving primaries in one epoch: {roles}"
        record = keys.read()
        epoch = record.epoch if record else 0
        assert epoch >= last_epoch, f"the record's epoch went from {last_epoch} to {epoch}"
        last_epoch = epoch


def test_random_sequences_keep_one_serving_primary_per_epoch():
    """Each seed replays one sequence (a failing seed names itself)."""
    for seed in range(SEEDS):
        try:
            run_random_sequence(seed)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}: {exc}") from exc
