"""A copy's gate (plugins/ps/replication/copy_side.py): which primary's messages may change a
copy."""

from __future__ import annotations

import pytest
from hogwild_plugins.ps.failover import BucketRecord
from hogwild_plugins.ps.replication.bucket_role import BucketRole
from hogwild_plugins.ps.replication.bucket_role_events import MapRead
from hogwild_plugins.ps.replication.copy_side import Gate, gate

from tests.unit.bucket_role_support import (
    BUCKET,
    COPIES,
    LEASE,
    NEW_LEASE,
    TTL,
    established,
    live,
    step,
)

# --------------------------------------------------------------------------- a copy's gate


RECORD = BucketRecord(epoch=3, primary=1, lease=LEASE[1], in_sync=(1, 2), revision=9)


def follower_of(record: BucketRecord, me: int = 2) -> BucketRole:
    role = BucketRole(BUCKET, me, COPIES, lease_ttl=TTL)
    step(role, MapRead, record, live(range(3)), LEASE[me], True)
    return role


@pytest.mark.parametrize(
    ("epoch", "lease", "sender", "verdict"),
    [
        (3, LEASE[1], 1, Gate.ACCEPT),
        (2, LEASE[1], 1, Gate.FENCED),  # an older epoch
        (3, NEW_LEASE[1], 1, Gate.FENCED),  # another lease
        (3, LEASE[1], 0, Gate.FENCED),  # another sender
        (4, LEASE[0], 0, Gate.REFRESH),  # a newer epoch than this copy knows
    ],
)
def test_a_copy_accepts_only_the_current_primary_of_the_current_epoch(
    epoch, lease, sender, verdict
):
    assert gate(follower_of(RECORD), epoch, lease, sender) is verdict


def test_a_copy_that_never_read_the_record_asks_to_refresh():
    assert gate(BucketRole(BUCKET, 2, COPIES, lease_ttl=TTL), 1, LEASE[1], 1) is Gate.REFRESH


def test_a_primary_refuses_another_servers_messages_for_its_bucket():
    roles, keys, primary = established()
    record = keys.read()
    other = next(s for s in roles if s != primary)
    assert gate(roles[primary], record.epoch, record.lease, other) is Gate.FENCED
