"""The fault benches' view of a bucket's in-sync copies (bench/support/ps_watch.py), read from a
real etcd on loopback: a copy whose member key is newer than the bucket's record (it registered
again since the record was written) counts only where the primary's last STATUS, in the record's
epoch, says it caught that copy up under the lease it holds now.

That is the case a primary keeps a copy through a new lease without writing the record (its
removal would leave fewer than ``min_copies``, as when ``in_sync`` holds exactly that many while
the third server is not back: tests/unit/test_bucket_role_in_sync.py); counted from etcd alone,
the bucket looked short of a copy until some later write, so a fault run waiting for two copies
per bucket could stop as stuck while the servers served (found by reading the code; one CI run
stopped so, and its cause is not known). The statuses here are the fields a server's STATUS
carries (``replication.roles``), given to the watch as a poll would.
"""

from __future__ import annotations

import uuid

import pytest
from hogwild_plugins.ps.etcd import Etcd
from hogwild_plugins.ps.failover import BucketRecord, MemberRecord
from hogwild_plugins.ps.routes import etcd_prefix

from bench.support.ps_watch import ServerWatch

pytestmark = pytest.mark.kernel_free

BUCKET, EPOCH = 0, 4
LEASE = {0: 0x7000, 1: 0x7001}
NEW_LEASE = 0x9001  # server 1's, once it registered again


def status(role: str, epoch: int, confirmed: dict[str, int]) -> dict:
    """A STATUS as a server sends it, with the fields the watch reads (one bucket, one shard)."""
    roles = {str(BUCKET): {"role": role, "epoch": epoch, "in_sync": [0, 1], "confirmed": confirmed}}
    return {"n_buckets": 1, "n_shards": 1, "shards": [{"shard": 0, "version": 3}],
            "replication": {"roles": roles}}  # fmt: skip


def put_member(etcd: Etcd, server: int, lease: int) -> None:
    record = MemberRecord(f"127.0.0.1:{7100 + server}", lease, 2, frozenset({BUCKET}))
    etcd.put(f"members/{server}", record.value())


def test_a_copy_registered_again_counts_once_its_primary_says_it_caught_it_up(etcd_server):
    job = f"watch-{uuid.uuid4().hex[:8]}"
    etcd = Etcd(etcd_server.address, prefix=etcd_prefix(job))
    watch = ServerWatch(["127.0.0.1:7100", "127.0.0.1:7101"], etcd_server.address, job)
    try:
        for server, lease in LEASE.items():
            put_member(etcd, server, lease)
        etcd.put(f"sync/{BUCKET}", BucketRecord(EPOCH, 0, LEASE[0], (0, 1)).value())
        watch._take(0, status("primary", EPOCH, {"1": LEASE[1]}))
        assert watch.buckets()[BUCKET]["in_sync"] == [0, 1]  # registered before the record

        put_member(etcd, 1, NEW_LEASE)  # paused past its lease: registered again, newer key
        assert watch.buckets()[BUCKET]["in_sync"] == [0]  # caught up under the old lease only
        watch._take(0, status("primary", EPOCH - 1, {"1": NEW_LEASE}))
        assert watch.buckets()[BUCKET]["in_sync"] == [0]  # another epoch's word
        watch._take(0, status("follower", EPOCH, {"1": NEW_LEASE}))
        assert watch.buckets()[BUCKET]["in_sync"] == [0]  # not the primary's
        watch._take(0, status("primary", EPOCH, {"1": NEW_LEASE}))
        assert watch.buckets()[BUCKET] == {"primary": 0, "epoch": EPOCH, "in_sync": [0, 1]}

        # a key that names no lease matches no confirmed copy (not even an absent one)
        etcd.put("members/1", {"address": "127.0.0.1:7101", "seen": [BUCKET]})
        watch._take(0, status("primary", EPOCH, {}))
        assert watch.buckets()[BUCKET]["in_sync"] == [0]
    finally:
        watch.stop()
        etcd.close()
