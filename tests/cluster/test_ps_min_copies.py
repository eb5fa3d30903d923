"""``ps.min_copies`` with real processes: both copies of every bucket of one primary stalled
(SIGSTOP) while a client streams updates, then that primary SIGKILLed: nothing acknowledged is
lost (the primary refused to acknowledge with fewer than two copies) and a copy succeeds it."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest

from tests.cluster.ps_stream import Stream
from tests.cluster.test_ps_failover import N_PARAMS

pytestmark = pytest.mark.ps_kernels

STALL_S = 3.0  # past the peer timeouts (0.3 s and a retry each) and the copies' 1 s leases


def test_both_copies_stalled_then_the_primary_killed_loses_nothing(trio, trio_ledger):
    client, routes, ledger = trio_ledger.client, trio_ledger.routes, trio_ledger.ledger
    routes.read()
    primary = routes.primaries[0]
    copies = [s for s in range(3) if s != primary]
    layout = client.layout
    # only the shards of that primary's buckets: each push is acknowledged by it alone
    ranges = [
        layout.shard_range(s)
        for s in range(layout.n_shards)
        if routes.primaries[layout.bucket_of(s)] == primary
    ]
    mask = np.zeros(N_PARAMS, bool)
    for start, stop in ranges:
        mask[start:stop] = True

    def push(rng) -> None:
        delta = rng.integers(-3, 4, N_PARAMS).astype(np.float32) * mask
        client.push_deltas(delta, ranges=ranges)  # once min_copies copies committed it
        np.add(ledger, delta, out=ledger)

    with Stream(push, seed=3) as stream:
        stream.progress(5, "no progress before the stall")
        for s in copies:
            trio.processes[s].send_signal(signal.SIGSTOP)
        try:
            time.sleep(STALL_S)  # the primary drops what it may, and acknowledges nothing
            trio.processes[primary].kill()
        finally:
            for s in copies:
                trio.processes[s].send_signal(signal.SIGCONT)
        stream.progress(5, "no progress after the primary's death", time.monotonic() + 60)
    assert not stream.problems, stream.problems
    trio_ledger.check()
