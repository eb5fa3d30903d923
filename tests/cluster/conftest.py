"""Fixtures of the cluster tier: a real etcd on loopback, a client for one test's keys, and
three parameter servers keeping three copies of every bucket under it.

Each test gets its own etcd (about half a second to start): the resource-leak check fails a
test that leaves a child process behind, so a server cannot outlive the test that started it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from hogwild_plugins.ps.etcd import Etcd, EtcdProcess


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
