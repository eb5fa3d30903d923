"""``ps.min_copies`` with real processes: both copies of every bucket of one primary stalled
(SIGSTOP) while a client streams updates, then that primary SIGKILLed: nothing acknowledged is
lost (the primary refused to acknowledge with fewer than two copies) and a copy succeeds it.
While the primary refuses, the client backs off instead of re-sending (and reading the bucket
map) every ~10 ms."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest

from tests.cluster.ps_stream import Stream
from tests.cluster.test_ps_failover import N_PARAMS

pytestmark = pytest.mark.ps_kernels

STALL_S = 3.0  # past the peer timeouts (0.3 s and a retry each) and the copies' 1 s leases
REFUSING_FROM_S = 1.2  # into the stall: the copies dropped (two peer timeouts), writes refused
# map reads a second while refused: the back-off's pauses reach 0.2 s (one read each); at a
# steady 10 ms, two reads a round, it was ~50-100 (88 rounds in 1.8 s once)
MAX_READS_PER_S = 15


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
            time.sleep(REFUSING_FROM_S)  # the primary drops what it may, acknowledges nothing
            reads, since = client.connection.routes.reads, time.monotonic()
            time.sleep(STALL_S - REFUSING_FROM_S)
            reads = client.connection.routes.reads - reads
            refusing_s = time.monotonic() - since
            trio.processes[primary].kill()
        finally:
            for s in copies:
                trio.processes[s].send_signal(signal.SIGCONT)
        stream.progress(5, "no progress after the primary's death", time.monotonic() + 60)
    assert not stream.problems, stream.problems
    # refused and sent again all along (a client stuck on an unanswered request reads nothing)
    assert 3 <= reads <= MAX_READS_PER_S * refusing_s, f"{reads} map reads in {refusing_s:.2f} s"
    trio_ledger.check()
