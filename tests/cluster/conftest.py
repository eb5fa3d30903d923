"""Fixtures of the cluster tier: a real etcd on loopback, a client for one test's keys,
three parameter servers keeping three copies of every bucket under it, and a ledger client of
those three (every acknowledged update summed beside the servers).

Each test gets its own etcd (about half a second to start): the resource-leak check fails a
test that leaves a child process behind, so a server cannot outlive the test that started it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.etcd import Etcd, EtcdProcess
from hogwild_plugins.ps.routes import Routes, etcd_prefix


@pytest.fixture
def etcd_server() -> Iterator[EtcdProcess]:
    """A started :class:`EtcdProcess` (leases of 1 s honoured), stopped after the test."""
    with EtcdProcess() as server:
        yield server


@pytest.fixture
def etcd(etcd_server: EtcdProcess) -> Iterator[Etcd]:
    """A client of ``etcd_server`` for keys below a prefix of this test's own."""
    client = Etcd(etcd_server.address, prefix=f"/hogwild/test-{uuid.uuid4().hex[:8]}/")
    yield client
    client.close()


@pytest.fixture
def trio(etcd_server: EtcdProcess):
    """Three started replicated servers (:class:`tests.cluster.test_ps_failover.Trio`), killed
    after the test."""
    from tests.cluster.test_ps_failover import Trio

    servers = Trio(etcd_server.address)
    try:
        servers.start_all()
        yield servers
    finally:
        servers.close()


@dataclass
class TrioLedger:
    """A client of the trio's job, its bucket map and etcd keys, and the sum of every update the
    servers acknowledged to it (:meth:`check` compares the servers' model with it)."""

    client: PSClient
    etcd: Etcd
    routes: Routes
    ledger: np.ndarray  # float64 [n_params]

    def check(self) -> None:
        final = np.empty(len(self.ledger), np.float32)
        self.client.pull(final)
        np.testing.assert_array_equal(final, self.ledger.astype(np.float32))


@pytest.fixture
def trio_ledger(trio, etcd_server: EtcdProcess) -> Iterator[TrioLedger]:
    """A :class:`TrioLedger` of ``trio``: the model assigned zeros, every bucket in sync on its
    three copies; its client, map and etcd client closed after the test."""
    from tests.cluster.test_ps_failover import JOB, N_PARAMS, wait_in_sync

    client = PSClient(trio.addresses, JOB, client_id=4, etcd=etcd_server.address)
    etcd = Etcd(etcd_server.address, prefix=etcd_prefix(JOB))
    routes = Routes(etcd_server.address, JOB, 3, client.layout.n_buckets)
    try:
        client.assign(np.zeros(N_PARAMS, np.float32))
        wait_in_sync(routes, etcd, 3)
        yield TrioLedger(client, etcd, routes, np.zeros(N_PARAMS, np.float64))
    finally:
        client.close()
        routes.close()
        etcd.close()
