"""A primary's snapshot to a copy that does not answer holds up no other bucket's writes: three
real servers keeping two copies of every bucket, a real etcd. Copy C of bucket A is frozen
(SIGSTOP) with its lease kept alive, so its primary P drops it from A at A's next write and
keeps trying to catch it up (a snapshot under way, waiting on C); meanwhile writes to bucket B,
whose copies are P and D, are acknowledged, each while one and the same snapshot of A stays
under way (P's status names it). Then C resumes, everything converges and the ledger is exact
(plugins/ps/replication/snapshot_sender.py)."""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.etcd import Etcd
from hogwild_plugins.ps.replication.bucket_role_events import Sync
from hogwild_plugins.ps.replication.snapshot_sender import Parcel
from hogwild_plugins.ps.routes import Routes, etcd_prefix
from hogwild_plugins.ps.serving.launch import ServeProcess

from hogwild.net.channel import Request
from hogwild.net.wire import MsgType
from tests.adversarial.copies import SHARD, primary_and_copy, two_copies
from tests.adversarial.copies import N as TWO_N
from tests.cluster.ps_stream import Stream
from tests.cluster.test_ps_failover import JOB, N_PARAMS, Trio, wait_in_sync
from tests.unit.test_snapshot_sender_failure import BadHeaderPeer

pytestmark = pytest.mark.ps_kernels

WAIT_S = 30.0  # for three of B's writes acknowledged under one snapshot of A's each


class PairTrio(Trio):
    """The trio, with two copies of every bucket, and smaller shards: one in every bucket."""

    def _launch(self, index: int) -> None:
        args = ["--threads", "1", "--ps.shard_kib=64", "--copies", "2", "--lease-s", "1"]
        args += ["--servers", ",".join(self.addresses), "--index", str(index)]
        self.processes[index] = ServeProcess([*args, "--etcd", self.etcd])
        self.processes[index].launch()


def pick(records: dict[int, dict], holding: set[int]) -> tuple[int, int, int, int]:
    """``(P, A, C, B)``: buckets A and B (of those ``holding`` shards) whose primary is P, C a
    copy of A and not of B."""
    records = {b: r for b, r in records.items() if b in holding}
    for a, ra in records.items():
        p = ra["primary"]
        for c in ra["in_sync"]:
            for b, rb in records.items():
                if b != a and rb["primary"] == p and c != p and c not in rb["in_sync"]:
                    return p, a, c, b
    raise AssertionError(f"no two buckets of one primary with different copies: {records}")


def keep_alive(etcd: Etcd, lease: int, stop: threading.Event) -> None:
    while not stop.wait(0.2):
        etcd.keepalive(lease)


def test_a_snapshot_to_a_frozen_copy_holds_up_no_other_buckets_writes(etcd_server):
    trio = PairTrio(etcd_server.address)
    client = pusher = None
    etcd = Etcd(etcd_server.address, prefix=etcd_prefix(JOB))
    keeper_etcd = Etcd(etcd_server.address, prefix=etcd_prefix(JOB))
    stop_keeping = threading.Event()
    frozen = None
    try:
        trio.start_all()
        client = PSClient(trio.addresses, JOB, client_id=7, etcd=etcd_server.address)
        pusher = PSClient(trio.addresses, JOB, client_id=8, etcd=etcd_server.address)
        layout = client.layout
        routes = Routes(etcd_server.address, JOB, 3, layout.n_buckets)
        client.assign(np.zeros(N_PARAMS, np.float32))
        wait_in_sync(routes, etcd, 2)
        routes.close()
        entries, _ = etcd.get_prefix("sync/")
        records = {int(k.split("/")[1]): v for k, (v, _) in entries.items()}
        p, a, c, b = pick(records, {layout.bucket_of(s) for s in range(layout.n_shards)})

        def ranges(bucket: int) -> list[tuple[int, int]]:
            shards = [s for s in range(layout.n_shards) if layout.bucket_of(s) == bucket]
            assert shards, f"bucket {bucket} holds no shard"
            return [layout.shard_range(s) for s in shards]

        ledger = np.zeros(N_PARAMS, np.float64)

        def push_a(rng) -> None:  # A's writes: each fails C's prepare, or waits for its sync
            delta = np.zeros(N_PARAMS, np.float32)
            for start, stop in ranges(a):
                delta[start:stop] = rng.integers(-3, 4, stop - start)
            pusher.push_deltas(delta, ranges=ranges(a))
            np.add(ledger, delta, out=ledger)

        def under_way() -> dict | None:
            return client.connection.json(p, MsgType.STATUS)["replication"]["snapshot_under_way"]

        lease = etcd.get(f"members/{c}")[0]["lease"]
        trio.processes[c].send_signal(signal.SIGSTOP)
        frozen = c
        keeper = threading.Thread(target=keep_alive, args=(keeper_etcd, lease, stop_keeping))
        keeper.start()

        seen = 0
        with Stream(push_a, seed=1) as stream:
            deadline = time.monotonic() + WAIT_S
            while seen < 3 and time.monotonic() < deadline:
                before = under_way()
                if not before or (before["bucket"], before["server"]) != (a, c):
                    time.sleep(0.02)
                    continue
                delta = np.zeros(N_PARAMS, np.float32)
                for start, stop in ranges(b):
                    delta[start:stop] = 1.0
                client.push_deltas(delta, ranges=ranges(b))  # acknowledged by P and D
                np.add(ledger, delta, out=ledger)
                if under_way() == before:  # the same snapshot, still waiting on C
                    seen += 1
            assert seen == 3, f"B's writes were not acknowledged under A's snapshot ({seen})"
            trio.processes[c].send_signal(signal.SIGCONT)
            frozen = None
            stop_keeping.set()
            keeper.join()
            stream.progress(5, "A's writes did not go on once C resumed")
        assert not stream.problems, stream.problems

        routes = Routes(etcd_server.address, JOB, 3, layout.n_buckets)
        wait_in_sync(routes, etcd, 2)  # C caught up again
        routes.close()
        final = np.empty(N_PARAMS, np.float32)
        client.pull(final)
        np.testing.assert_array_equal(final, ledger.astype(np.float32))
    finally:
        if frozen is not None:
            trio.processes[frozen].send_signal(signal.SIGCONT)
        stop_keeping.set()
        for each in (client, pusher):
            if each is not None:
                each.close()
        trio.close()
        etcd.close()
        keeper_etcd.close()


def test_a_copy_answering_a_bad_header_fails_the_primary_over():
    """The snapshot thread meets a copy breaking the protocol (a bad header): the primary's
    replication fails as on an error of its replication thread (not valid, its lease revoked)
    and its copy takes the bucket over, serving the writes acknowledged before."""
    with two_copies("snapshot-failure") as (servers, client):
        client.push_deltas(np.ones(TWO_N, np.float32))
        primary, copy = primary_and_copy(servers, 0)
        replication, other = primary.replication, copy.options.index
        bad = BadHeaderPeer()
        try:
            # the primary's snapshot link, opened again with the copy's address the bad peer's
            addresses = list(primary.options.servers)
            addresses[other] = bad.address
            replication.syncs.link.close()
            replication.syncs.link.open(addresses, replication.me, None)
            role = replication.roles[primary.layout.bucket_of(0)]
            header = replication.syncs.link.header(MsgType.SNAPSHOT, 0, 0, role, offset=0)
            sync = Sync(role.bucket, other, role.epoch, ticket=-1)  # no role waits for it
            replication.syncs.sender.send(Parcel(sync, [Request(other, header)], {}))
            deadline = time.monotonic() + WAIT_S
            while replication.failure is None:
                assert time.monotonic() < deadline, "the snapshot thread's failure went unseen"
                time.sleep(0.02)
            assert replication.failure.startswith("snapshot thread: ProtocolError")
            assert "bad header" in replication.failure
            assert not replication.valid() and not replication.serving(0)
            assert replication.status()["snapshot_thread_failure"] in replication.failure
            while not copy.replication.serving(0):  # the lease revoked: the copy takes over
                assert time.monotonic() < deadline, "the copy never took the bucket over"
                time.sleep(0.02)
            assert np.array_equal(copy.shards[copy.local[0]].values, np.ones(SHARD, np.float32))
        finally:
            bad.close()
