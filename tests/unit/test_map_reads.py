"""What a bucket role is told of one read of the job's map (plugins/ps/replication/map_reads.py):
its record, the live members, whether any of them saw a record of it, and the longest TTL of the
``revoked/<i>`` markers of the same read. (The reads from a real etcd: tests/cluster/test_ps_*.)
"""

from __future__ import annotations

from hogwild_plugins.ps.failover import BucketRecord
from hogwild_plugins.ps.replication.bucket_role_events import MapRead
from hogwild_plugins.ps.replication.map_reads import MapView, map_read


def test_a_map_read_tells_each_bucket_its_record_whether_it_was_seen_and_the_markers_ttl():
    record = BucketRecord(3, 1, 0x71, (1, 0), revision=9)
    view = MapView({0: record, 1: None}, {0: 0x70, 1: 0x71}, frozenset({0}), 7.0)
    told = map_read(view, 0, 0x70, True, False, 12.5, "m-1")
    assert told == MapRead(
        record, {0: 0x70, 1: 0x71}, 0x70, True, False, False, 7.0, 12.5, stimulus_id="m-1"
    )
    fresh = map_read(view, 1, 0x70, False, True, 13.0, "m-2")
    assert fresh.record is None and fresh.blank and not fresh.lease_valid
    assert fresh.revoked_ttl == 7.0 and fresh.settled and fresh.stimulus_id == "m-2"
    assert (
        map_read(MapView({0: None}, {}, frozenset()), 0, 1, True, True, 0.0, "m").revoked_ttl == 0
    )
