"""etcd loses the job's keys and every replicated server is restarted on its store: no bucket is
started afresh (a server's store remembers each bucket's epoch: plugins/ps/replication/marks.py),
and the stores still hold every acknowledged update. Three real servers with ``--store``, a
real etcd."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.etcd import Etcd
from hogwild_plugins.ps.routes import Routes, etcd_prefix
from hogwild_plugins.ps.serving.launch import ServeProcess

from tests.cluster.test_ps_failover import JOB, N_PARAMS, Trio, wait_in_sync
from tests.cluster.test_ps_persistence import flushed_state

pytestmark = pytest.mark.ps_kernels


class StoredTrio(Trio):
    """The trio, each server on a store of its own under ``root``."""

    def __init__(self, etcd: str, root) -> None:
        super().__init__(etcd)
        self.stores = [root / f"ps-{i}" for i in range(3)]

    def _launch(self, index: int) -> None:
        args = ["--threads", "1", "--ps.shard_kib=256", "--copies", "3", "--lease-s", "1"]
        args += ["--servers", ",".join(self.addresses), "--index", str(index)]
        args += ["--etcd", self.etcd, "--store", str(self.stores[index])]
        self.processes[index] = ServeProcess(args)
        self.processes[index].launch()

    def stop_all(self) -> None:
        """SIGTERM each, side by side: a final flush, the lease given back."""
        for process in self.processes.values():
            process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            process.stop()
            assert "final flush written" in process.lines[-1], list(process.lines)[-5:]


def roles(client: PSClient) -> dict[int, dict]:
    """Each answering server's buckets as its status shows them."""
    return {st["server"]: st["replication"]["roles"] for st in client.status()}


def test_a_wiped_etcd_and_every_server_restarted_on_its_store_start_no_bucket_afresh(
    etcd_server, tmp_path
):
    trio = StoredTrio(etcd_server.address, tmp_path)
    etcd = Etcd(etcd_server.address, prefix=etcd_prefix(JOB))
    client = routes = None
    try:
        trio.start_all()
        client = PSClient(trio.addresses, JOB, client_id=1, etcd=etcd_server.address)
        n_buckets = client.layout.n_buckets
        routes = Routes(etcd_server.address, JOB, 3, n_buckets)
        client.assign(np.zeros(N_PARAMS, np.float32))
        wait_in_sync(routes, etcd, 3)
        for k in (1, 2, 3):  # each acknowledged once all three copies committed it
            client.push_deltas(np.full(N_PARAMS, k, np.float32))
        total = 6.0
        client.close()
        client = None
        for key in etcd.get_prefix("")[0]:  # what a second driver's clearing of the job does
            etcd.delete(key)
        # the live servers' leases outlive the delete: each finds its key gone at its next read
        # of the map and writes it again, listing every bucket (else a server that knew nothing
        # would see no member that had seen them, and start them afresh)
        deadline = time.monotonic() + 30
        while True:
            members, _ = etcd.get_prefix("members/")
            if len(members) == 3 and all(
                v["seen"] == list(range(n_buckets)) for v, _ in members.values()
            ):
                break
            assert time.monotonic() < deadline, f"the servers did not register again: {members}"
            time.sleep(0.05)
        trio.stop_all()
        for store in trio.stores:  # the final flushes: every acknowledged update on every store
            assert all((values == total).all() for _, values, _ in flushed_state(store).values())

        trio.start_all()  # every server again, on its store; etcd has nothing of the job
        client = PSClient(trio.addresses, JOB, client_id=2)  # status only: no primary to wait for
        deadline = time.monotonic() + 30
        while True:
            members, _ = etcd.get_prefix("members/")
            seen = roles(client)
            lost = [b["record_lost"] for r in seen.values() for b in r.values()]
            if len(members) == 3 and len(seen) == 3 and all(lost):
                break
            assert time.monotonic() < deadline, f"the servers did not see the loss: {seen}"
            time.sleep(0.05)
        # every server listed every bucket in seen: none is a new bucket to anyone
        assert all(v["seen"] == list(range(n_buckets)) for v, _ in members.values())
        time.sleep(0.6)  # past a poll of the map (0.5 s) after everyone registered: no campaign
        assert etcd.get_prefix("sync/")[0] == {}
        assert all(not b["role"] == "primary" for r in roles(client).values() for b in r.values())
        client.close()
        client = None
        trio.stop_all()
        for store in trio.stores:  # nothing overwrote what they held
            assert all((values == total).all() for _, values, _ in flushed_state(store).values())
    finally:
        if client is not None:
            client.close()
        if routes is not None:
            routes.close()
        trio.close()
        etcd.close()
