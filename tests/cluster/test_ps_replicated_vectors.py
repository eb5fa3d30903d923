"""Named vectors on three parameter servers keeping three copies of every bucket, with a real
etcd (issue 13): pushes into named vectors and the vector operations give numpy's results; a
stream of them survives a SIGKILL of a primary exactly (what was acknowledged is what the new
primary holds, nothing applied twice); and a server that returns catches up by snapshot with the
named vectors and serves them once its buckets come back to it."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.etcd import Etcd
from hogwild_plugins.ps.failover import desired_copies
from hogwild_plugins.ps.routes import Routes, etcd_prefix
from hogwild_plugins.ps.sandblaster.vectors import ShardVectors

from tests.cluster.ps_stream import Stream, placed
from tests.cluster.test_ps_failover import (
    JOB,
    N_PARAMS,
    role_of,
    wait_in_sync,
    wait_member,
)

pytestmark = pytest.mark.ps_kernels


def read_vector(client: PSClient, name: str) -> np.ndarray:
    """A named vector's values (copied into the parameters, then pulled)."""
    ShardVectors(client).copy(name, "params")
    out = np.empty(N_PARAMS, np.float32)
    client.pull(out)
    return out


def test_named_pushes_and_vector_operations_on_replicated_servers_match_numpy(trio, etcd_server):
    client = PSClient(trio.addresses, JOB, client_id=21, etcd=etcd_server.address)
    vectors = ShardVectors(client)
    etcd = Etcd(etcd_server.address, prefix=etcd_prefix(JOB))
    routes = Routes(etcd_server.address, JOB, 3, client.layout.n_buckets)
    rng = np.random.default_rng(7)
    try:
        p = rng.integers(-4, 5, N_PARAMS).astype(np.float32)
        client.assign(p)
        wait_in_sync(routes, etcd, 3)
        d1, d2 = (rng.integers(-3, 4, N_PARAMS).astype(np.float32) for _ in range(2))
        v0 = client.versions.copy()
        client.push_deltas(d1, into="g")
        client.push_deltas(d2, into="g")
        assert (client.versions == v0 + 2).all()  # replicated writes: a version each
        g = d1 + d2
        vectors.axpy(2.0, "g", "h")  # h = 2 g
        vectors.scale(0.5, "h")  # h = g
        vectors.copy("params", "m")  # m = p
        vectors.fill("f", 3.0)  # f = 3
        vectors.mul("g", "f", "z")  # z = 3 g
        np.testing.assert_allclose(
            vectors.dot("g", "m"), float(np.dot(g.astype(np.float64), p)), rtol=1e-6
        )
        assert vectors.asum("g") == float(np.abs(g).sum())
        assert vectors.amax("z") == float(np.abs(3 * g).max())
        assert vectors.dot("f", "f") == 9.0 * N_PARAMS
        for name, expected in (
            ("g", g),
            ("h", g),
            ("m", p),
            ("f", np.full_like(p, 3)),
            ("z", 3 * g),
        ):
            np.testing.assert_array_equal(read_vector(client, name), expected, err_msg=name)
        statuses = client.status()
        assert all(st["replication"]["failure"] is None for st in statuses)
        versions = [sorted((s["shard"], s["version"]) for s in st["shards"]) for st in statuses]
        assert versions[0] == versions[1] == versions[2]  # every copy committed every write
    finally:
        client.close()
        routes.close()
        etcd.close()


def test_named_vectors_survive_a_sigkill_and_a_returning_copy_catches_up_with_them(
    trio, etcd_server
):
    client = PSClient(trio.addresses, JOB, client_id=22, etcd=etcd_server.address)
    vectors = ShardVectors(client)
    watcher = PSClient(trio.addresses, JOB, client_id=23, etcd=etcd_server.address)
    etcd = Etcd(etcd_server.address, prefix=etcd_prefix(JOB))
    n_buckets = client.layout.n_buckets
    routes = Routes(etcd_server.address, JOB, 3, n_buckets)
    preferred = [desired_copies(b, range(3), 3)[0] for b in range(n_buckets)]
    g = np.zeros(N_PARAMS, np.float64)  # every acknowledged push into "g"
    h = np.zeros(N_PARAMS, np.float64)  # every acknowledged axpy of "one" into "h"
    try:
        client.assign(np.zeros(N_PARAMS, np.float32))
        vectors.fill("one", 1.0)
        wait_in_sync(routes, etcd, 3)
        placed(routes, preferred, "the first primaries are not the preferred ones")
        victim = preferred[0]
        held = [b for b in range(n_buckets) if preferred[b] == victim]

        def step(rng) -> None:
            delta = rng.integers(-3, 4, N_PARAMS).astype(np.float32)
            client.push_deltas(delta, into="g")  # acknowledged once every copy has it
            np.add(g, delta, out=g)
            vectors.axpy(1.0, "one", "h")  # not idempotent: a second application shows
            np.add(h, 1.0, out=h)

        with Stream(step, seed=5) as stream:
            stream.progress(10, "no progress before the kill")
            trio.processes[victim].kill()  # SIGKILL mid-stream
            stream.progress(10, "no progress after the kill")
        assert not stream.problems, stream.problems
        routes.read()
        assert all(routes.primaries[b] not in (victim, None) for b in held)
        # read through the new primaries: exactly what was acknowledged
        np.testing.assert_array_equal(read_vector(client, "g"), g.astype(np.float32))
        np.testing.assert_array_equal(read_vector(client, "h"), h.astype(np.float32))
        assert vectors.asum("one") == N_PARAMS

        trio.start(victim)  # back with nothing: it catches up by snapshot
        wait_member(etcd, victim)
        placed(routes, preferred, "the primaries did not come back")
        deadline = time.monotonic() + 30
        while any(role_of(watcher, victim, b) != "primary" for b in held):
            assert time.monotonic() < deadline, "the returning server does not serve"
            time.sleep(0.02)
        received = [st for st in watcher.status() if st["server"] == victim]
        assert received[0]["replication"]["snapshots_received"] > 0
        # the buckets in ``held`` are answered by the returned server, from its snapshot
        np.testing.assert_array_equal(read_vector(client, "g"), g.astype(np.float32))
        np.testing.assert_array_equal(read_vector(client, "h"), h.astype(np.float32))
        assert vectors.asum("one") == N_PARAMS
    finally:
        client.close()
        watcher.close()
        routes.close()
        etcd.close()
