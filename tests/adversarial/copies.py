"""Two parameter servers keeping two copies of every bucket, for the tests that turn on a copy.

:func:`two_copies` starts a real etcd, two servers of ``copies = 2`` on loopback (two shards of
1024 floats, one update thread each, a one-second lease) and a client of both, and stops them all
on the way out; :func:`primary_and_copy` waits until a server serves a shard as its primary;
:func:`held_everywhere` until every server holds given values (every COMMIT applied).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import numpy as np
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.etcd import EtcdProcess
from hogwild_plugins.ps.layout import ModelGeometry
from hogwild_plugins.ps.serving.launch import local_server

from hogwild.net.ports import free_ports

N, SHARD = 2048, 1024  # shard_kib=4: two shards of 1024 floats
GEOMETRY = ModelGeometry(N)
SERVING_WITHIN_S = 30.0  # a bucket's first primary elected (etcd, a one-second lease)


@contextmanager
def two_copies(
    job: str, keys: str | None = None, client_id: int = 3, timeout_s: float = 5.0
) -> Iterator[tuple[list, PSClient]]:
    """The two servers (in index order) and a client of them, under the job's CURVE ``keys``
    where given."""
    with EtcdProcess() as etcd, ExitStack() as stack:
        addresses = [f"127.0.0.1:{port}" for port in free_ports(2)]
        servers = [
            stack.enter_context(
                local_server(
                    GEOMETRY,
                    job=job,
                    servers=addresses,
                    index=i,
                    shard_kib=4,
                    threads=1,
                    copies=2,
                    etcd=etcd.address,
                    lease_s=1,
                    keys=keys,
                )
            )  # fmt: skip
            for i in range(2)
        ]
        client = stack.enter_context(
            PSClient(
                addresses,
                job,
                client_id=client_id,
                etcd=etcd.address,
                keys=keys,
                timeout_s=timeout_s,
            )  # fmt: skip
        )
        yield servers, client


def primary_and_copy(servers: list, shard: int) -> tuple:
    """The server serving ``shard`` as its primary, and the other one (its copy), once one serves
    with the other in sync and its snapshots applied (a copy still being caught up is not in step
    yet)."""
    deadline = time.monotonic() + SERVING_WITHIN_S
    while True:
        serving = [s for s in servers if s.replication.serving(shard)]
        if serving:
            [primary] = serving
            [copy] = [s for s in servers if s is not primary]
            role = primary.replication.roles[primary.layout.bucket_of(shard)]
            if (
                copy.options.index in role.record.in_sync
                and not copy.replication.copy_adapter.restoring
            ):
                return primary, copy
        assert time.monotonic() < deadline, "no server serves the shard with its copy in sync"
        time.sleep(0.05)


def held_everywhere(servers: list, values) -> None:
    """Wait until every server holds ``values`` in each of its shards. A client's push is
    acknowledged once every in-sync copy took its PREPARE; the COMMIT that applies it on a copy
    (and a primary's own apply of another bucket) may still be under way, holding a slot of
    that server's update queues. A test that reads a copy's state, or fills its queues, after a
    push waits for this first."""
    deadline = time.monotonic() + SERVING_WITHIN_S
    while not all(
        np.array_equal(shard.values, values[shard.lo : shard.lo + shard.values.size])
        for server in servers
        for shard in server.shards
    ):
        assert time.monotonic() < deadline, "a server does not hold what was acknowledged"
        time.sleep(0.02)
