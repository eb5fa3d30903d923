"""What a training job shares between the parent and its workers, and how it is laid out.

One arena (a POSIX shared-memory segment, :mod:`hogwild.shm.arena`) holds everything the workers
share: the parameters and the momentum velocity (updated in place without locks), the examples
(one copy for all workers), this epoch's permutation, a small control block the parent writes and
workers poll, and one 64-byte row of statistics per worker (padded so that two workers' counters
never share a cache line).

Control block (int64): ``CONTROL_EPOCH`` is the epoch workers may train; the parent sets it to
``EPOCH_CLOSED`` to end an epoch early (Adam section 3.2.5), and workers still inside their shard
stop at their next look (every ``train.chunk`` examples).
Statistics (float64, per worker): examples trained in total, summed training loss, number correct.
"""

from __future__ import annotations

import numpy as np

from hogwild.model.network import Network
from hogwild.shm.arena import ArenaLayout

CONTROL_EPOCH = 0
EPOCH_CLOSED = -1
CONTROL_SLOTS = 8  # one cache line of int64

STAT_EXAMPLES, STAT_LOSS, STAT_CORRECT = 0, 1, 2
STAT_SLOTS = 8  # one cache line of float64 per worker


def job_layout(network: Network, n_workers: int, n_train: int, n_test: int) -> ArenaLayout:
    """The arena layout of a job: shared parameters, optimizer state, data, control, statistics."""
    layout = ArenaLayout()
    layout.add("params", np.float32, (network.n_params,))
    layout.add("velocity", np.float32, (network.n_params,))
    layout.add("control", np.int64, (CONTROL_SLOTS,))
    layout.add("stats", np.float64, (n_workers, STAT_SLOTS))
    layout.add("order", np.int64, (n_train,))
    layout.add("train_images", np.uint8, (n_train, network.input_size))
    layout.add("train_labels", np.uint8, (n_train,))
    layout.add("test_images", np.uint8, (n_test, network.input_size))
    layout.add("test_labels", np.uint8, (n_test,))
    return layout


def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """The example order of ``epoch``: a fresh shuffle per epoch, reproducible from the seed."""
    return np.random.default_rng([seed, epoch]).permutation(n).astype(np.int64)


def shard_bounds(n: int, n_workers: int) -> list[tuple[int, int]]:
    """Split ``range(n)`` into ``n_workers`` contiguous, nearly equal shards."""
    edges = np.linspace(0, n, n_workers + 1).round().astype(int)
    return [(int(edges[i]), int(edges[i + 1])) for i in range(n_workers)]
