"""Four client processes push thousands of integer-valued deltas to two servers: the final
parameters are exactly the sum of every delta (SGD; integers stay exact in float32).

Four clients pushing at once keep every shard's queue busy: a server batches requests (checked)
long before the 2,000th push; more pushes only repeat that (they ran 6,000 before)."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest
from hogwild_plugins.ps.layout import ModelGeometry
from hogwild_plugins.ps.serving.launch import local_server

from hogwild.net.ports import free_port

pytestmark = pytest.mark.ps_kernels

N = 12_000  # 3 shards of 4,096 floats over 2 servers
CLIENTS, PUSHES = 4, 500


def deltas(seed: int) -> np.ndarray:
    """Client ``seed``'s pushes: [PUSHES, N] small integers (their sum fits float32 exactly)."""
    return np.random.default_rng(seed).integers(-3, 4, (PUSHES, N)).astype(np.float32)


def push_all(servers: list[str], seed: int) -> None:
    from hogwild_plugins.ps.client import PSClient

    with PSClient(servers, "many", client_id=100 + seed, timeout_s=20.0) as client:
        for delta in deltas(seed):
            client.push_deltas(delta)


def test_four_clients_two_servers_sum_exactly():
    servers = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    with (
        local_server(ModelGeometry(N), job="many", servers=servers, index=0, shard_kib=16) as a,
        local_server(ModelGeometry(N), job="many", servers=servers, index=1, shard_kib=16) as b,
    ):
        assert [len(a.shards), len(b.shards)] == [2, 1]
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=push_all, args=(servers, s)) for s in range(CLIENTS)]
        for proc in procs:
            proc.start()
        try:
            for proc in procs:
                proc.join(240)
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
                    proc.join()
        assert [proc.exitcode for proc in procs] == [0] * CLIENTS

        from hogwild_plugins.ps.client import PSClient

        with PSClient(servers, "many", client_id=1) as client:
            out = np.empty(N, np.float32)
            versions = client.pull(out)
        want = sum(deltas(s).sum(axis=0, dtype=np.float64) for s in range(CLIENTS))
        np.testing.assert_array_equal(out, want.astype(np.float32))
        assert (versions == CLIENTS * PUSHES).all()
        assert a.status()["applied_requests"] == 2 * CLIENTS * PUSHES
        assert b.status()["batches"] < b.status()["applied_requests"]  # some were batched
