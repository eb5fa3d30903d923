"""A record write decided from a read of etcd, which then restarted from an empty data directory
(its revisions counted again from 1), reaches the new etcd where the record's key stands at the
very mod revision the write expects: the job's nonce fails it (plugins/ps/job_nonce.py), the
record read back beside it reads as absent, and the bucket's role answers as after a wipe of the
job's keys: it steps down and never takes the new history's record, nor starts the bucket
afresh. A real etcd, restarted on an emptied data directory; the role is the real state machine,
the writes and reads those the replication thread makes (plugins/ps/routes.py)."""

from __future__ import annotations

import shutil

from hogwild_plugins.ps.etcd import Etcd, EtcdProcess, _b64
from hogwild_plugins.ps.failover import BucketRecord, desired_copies
from hogwild_plugins.ps.job_nonce import NONCE_KEY, adopt
from hogwild_plugins.ps.replication.bucket_role import BucketRole, Role
from hogwild_plugins.ps.replication.bucket_role_events import (
    CampaignAnswered,
    InSyncWritten,
    MapRead,
    SnapshotDelivered,
    WriteInSync,
)
from hogwild_plugins.ps.routes import etcd_prefix, parse_map, read_record, write_record

from tests.unit.bucket_role_support import LEASE, TTL, live, step

PREFIX = etcd_prefix("nonce-test")
BUCKET, COPIES, SERVERS = 0, 2, 2


def test_a_write_decided_before_etcd_restarted_empty_fails_on_the_new_history(tmp_path):
    data = tmp_path / "etcd"
    members = live(range(SERVERS))
    me = desired_copies(BUCKET, members, COPIES)[0]
    other = 1 - me
    role = BucketRole(BUCKET, me, COPIES, min_copies=1, lease_ttl=TTL)
    with EtcdProcess(data_dir=data) as old, Etcd(old.address, prefix=PREFIX) as etcd:
        nonce = adopt(etcd, etcd.get(NONCE_KEY)[0])  # the job's first server writes it
        assert adopt(etcd, etcd.get(NONCE_KEY)[0]).token == nonce.token  # the others read it
        [campaign] = step(role, MapRead, None, members, LEASE[me], True)
        won = write_record(etcd, BUCKET, campaign.record, campaign.expected, nonce)
        record = read_record(etcd, BUCKET, SERVERS, nonce)
        assert won and record is not None
        step(role, CampaignAnswered, True, record)
        # the copy's snapshot arrived: the role decides an in_sync write against this read
        [write] = step(role, SnapshotDelivered, other)
        assert isinstance(write, WriteInSync) and write.expected == record.revision
    shutil.rmtree(data)  # etcd comes back from an empty data directory, at revision 1

    with EtcdProcess(data_dir=data) as new, Etcd(new.address, prefix=PREFIX) as etcd:
        theirs = adopt(etcd, etcd.get(NONCE_KEY)[0])  # a server of the new history's
        assert theirs.token != nonce.token
        # the bucket's key of the new history, brought to the mod revision the write expects
        revision = etcd.get(NONCE_KEY)[1]
        while revision < write.expected - 1:
            revision = etcd.put("filler", {"revision": revision})
        lone = BucketRecord(1, other, LEASE[other], (other,))
        assert write_record(etcd, BUCKET, lone, 0, theirs)
        assert read_record(etcd, BUCKET, SERVERS, theirs).revision == write.expected

        done = write_record(etcd, BUCKET, write.record, write.expected, nonce)
        assert not done
        assert read_record(etcd, BUCKET, SERVERS, nonce) is None  # not this history's
        assert step(role, InSyncWritten, done, None) == []
        assert role.role is Role.DEPOSED and not role.serving
        assert etcd.get(f"sync/{BUCKET}")[0] == lone.value()  # the new history's, untouched

        # the next read of the map takes the new history's nonce, and its record is foreign:
        # the bucket is lost here (serves nothing), never followed nor campaigned for
        entries, _ = etcd.get_prefix("")
        assert adopt(etcd, entries[NONCE_KEY][0]).token == theirs.token
        _, records = parse_map(entries, SERVERS, BUCKET + 1)
        assert step(role, MapRead, records[BUCKET], members, LEASE[me], True) == []
        assert role.record_lost and role.role is Role.DEPOSED
        assert step(role, MapRead, None, members, LEASE[me], True) == []  # nor afresh

        # the control: the very same write, without the nonce, lands on the new history
        key = f"sync/{BUCKET}"
        assert etcd.replace(key, write.record.value(), write.expected)


def test_a_nonce_written_by_hand_in_other_bytes_is_rewritten_as_every_guard_compares_it():
    """``{"nonce": "..."}`` with a space parses as a nonce, but the guard compares bytes: left
    so, every record write would fail forever. Its adoption rewrites it canonically."""
    token = "0123456789abcdef" * 2
    with EtcdProcess() as server, Etcd(server.address, prefix=PREFIX) as etcd:
        raw = b'{"nonce": "' + token.encode() + b'"}'  # a space after the colon
        etcd._post("/kv/put", {"key": _b64((PREFIX + NONCE_KEY).encode()), "value": _b64(raw)})
        value, revision = etcd.get(NONCE_KEY)
        assert value == {"nonce": token} and not etcd.holds(NONCE_KEY, value)
        nonce = adopt(etcd, value, revision)
        assert nonce.token == token and etcd.holds(NONCE_KEY, nonce.value())
        record = BucketRecord(1, 0, LEASE[0], (0,))
        assert write_record(etcd, BUCKET, record, 0, nonce)  # the guard holds now
        # adopted again at the key's revision: the nonce already checked, no request made
        entries, _ = etcd.get_prefix("")
        assert adopt(None, *entries[NONCE_KEY], known=nonce) is nonce
