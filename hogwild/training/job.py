"""What a training job shares between the parent and its workers, and how it is laid out.

One arena (a POSIX shared-memory segment, :mod:`hogwild.shm.arena`) holds everything the workers
share: the parameter store's regions (the parameters and the momentum velocity, updated in place
without locks; one copy, or copies per worker or per NUMA node: :mod:`hogwild.store`), the examples
(one copy for all workers), this epoch's permutation, a small control block the parent writes and
workers poll, and one 64-byte row of statistics per worker (padded so that two workers' counters
never share a cache line).

A job trains either on examples in the arena (MNIST idx files, copied in once) or on examples
the workers read themselves (an LMDB image cache, data servers): then the arena holds none. What
the workers are told about the data is :class:`hogwild.data.plan.DataPlan`.

Control block (int64): ``CONTROL_EPOCH`` is the epoch workers may train; the parent sets it to
``EPOCH_CLOSED`` to end an epoch early (Adam section 3.2.5), and workers still inside their shard
stop at their next look (every chunk: ``train.chunk`` examples, fewer for a large model).
``CONTROL_COMPILED`` is set once the parent's compile step is done; a starting worker waits for it
before it loads its kernels.
Statistics (float64, per worker): examples trained in total, summed training loss, number correct,
and a heartbeat (the system's monotonic clock when the worker last showed life), which the parent
watches to name a worker that is alive but stuck.
"""

from __future__ import annotations

import numpy as np

from hogwild.data.labels import LABEL_DTYPE
from hogwild.model.network import Network
from hogwild.shm.arena import ArenaLayout

CONTROL_EPOCH = 0
EPOCH_CLOSED = -1
CONTROL_COMPILED = 1  # set by the trainer once its compile step is done: workers load then
CONTROL_SLOTS = 8  # one cache line of int64

STAT_EXAMPLES, STAT_LOSS, STAT_CORRECT, STAT_BEAT = 0, 1, 2, 3
STAT_SLOTS = 8  # one cache line of float64 per worker


def job_layout(
    network: Network,
    n_workers: int,
    n_train: int,
    n_test: int,
    image_bytes: int | None = None,
    store=None,
    image_dtype=np.uint8,
) -> ArenaLayout:
    """The arena layout of a job: the parameter store's regions, data, control, statistics.

    Args:
        network: The model.
        n_workers: Worker processes (one statistics row each).
        n_train: Training examples of an epoch (the permutation's length).
        n_test: Test examples held in the arena.
        image_bytes: Bytes of one stored example (default: the model's input size); 0 leaves
            the examples out (a job that reads an image cache).
        store: The job's :class:`~hogwild.store.protocol.ParameterStore`, which adds its
            regions (None: none, for a layout without parameters).
        image_dtype: The stored examples' type (uint8 pixels; float32 values from arrays, then
            ``image_bytes`` counts values).
    """
    image_bytes = network.input_size if image_bytes is None else image_bytes
    layout = ArenaLayout()
    if store is not None:
        store.add_regions(layout)
    layout.add("control", np.int64, (CONTROL_SLOTS,))
    layout.add("stats", np.float64, (n_workers, STAT_SLOTS))
    layout.add("order", np.int64, (n_train,))
    if image_bytes:
        layout.add("train_images", image_dtype, (n_train, image_bytes))
        layout.add("train_labels", LABEL_DTYPE, (n_train,))  # the kernels' one label type
        layout.add("test_images", image_dtype, (n_test, image_bytes))
        layout.add("test_labels", LABEL_DTYPE, (n_test,))
    return layout


def subset_indices(seed: int, n_total: int, subset: int) -> np.ndarray | None:
    """The training examples of ``train.subset``: a seeded random choice, in ascending order.

    None when every example is used. A random choice rather than the first records, which in a
    cache made from class folders are the first classes.
    """
    if not subset or subset >= n_total:
        return None
    chosen = np.random.default_rng([seed, 0x5B5E7]).choice(n_total, subset, replace=False)
    return np.sort(chosen).astype(np.int64)


def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """The example order of ``epoch``: a fresh shuffle per epoch, reproducible from the seed."""
    return np.random.default_rng([seed, epoch]).permutation(n).astype(np.int64)


def shard_bounds(n: int, n_workers: int) -> list[tuple[int, int]]:
    """Split ``range(n)`` into ``n_workers`` contiguous, nearly equal shards."""
    edges = np.linspace(0, n, n_workers + 1).round().astype(int)
    return [(int(edges[i]), int(edges[i + 1])) for i in range(n_workers)]
