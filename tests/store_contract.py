"""The contract every parameter store keeps, as one test body run against each store.

A worker's steps reach home, pulls bring the others' steps and keep the worker's own unpushed
progress, the epoch end makes one model that equals the start plus every step (numpy's float64
arithmetic, up to float32 rounding), the snapshot is that model and every worker trains on it
next, and a store loaded from a snapshot (a resume) starts from it. The steps are written while
the store's thread is idle: during training a pull and a worker's write to the same element race,
as every Hogwild write does, and may lose one of the two; exactness is checked without races.
``tests/unit/test_stores.py`` runs it against the stores in shared memory,
``tests/cluster/test_ps_store.py`` against the parameter servers.
"""

from __future__ import annotations

import numpy as np

from hogwild.numa.placement import WorkerPlacement
from hogwild.shm.arena import Arena
from hogwild.store.registry import store_class
from hogwild.training.job import job_layout


def placements(nodes: list[int]) -> tuple[WorkerPlacement, ...]:
    return tuple(WorkerPlacement(w, w, node, 0, w, 0) for w, node in enumerate(nodes))


class StoreUnderTest:
    """A store planned for fake placements, its arena, and every worker's side."""

    def __init__(self, config, network, nodes):
        self.store = store_class(config.train.parameters)(config, network, placements(nodes))
        self.arena = Arena.create(
            "test-store", job_layout(network, len(nodes), 4, 4, store=self.store)
        )
        self.store.attach(self.arena)
        self.config, self.network, self.n = config, network, len(nodes)

    def open_workers(self):
        return [
            self.store.open_worker(self.store.worker_spec(w), self.arena, self.network, self.config)
            for w in range(self.n)
        ]

    def close(self, workers=()):
        for side in workers:
            side.close()
        self.store.close()
        self.store = None
        self.arena.close()
        self.arena.unlink()


def run_contract(network, config, nodes: list[int]) -> None:
    """The store contract (see the module docstring), for ``config``'s store."""
    rng = np.random.default_rng(7)
    start = rng.standard_normal(network.n_params).astype(np.float32)
    velocity = rng.standard_normal(network.n_params).astype(np.float32)
    under = StoreUnderTest(config, network, nodes)
    workers = under.open_workers()
    try:
        under.store.load(start, velocity)
        for side in workers:
            side.start_epoch(0.01)
            np.testing.assert_array_equal(side.params, start)
        expected = start.astype(np.float64)
        for _round in range(5):  # every worker trains 40 examples per round, in spans
            for side in workers:
                left = 40
                while left:
                    n = side.span(left)
                    assert 1 <= n <= left
                    step = rng.standard_normal(network.n_params).astype(np.float32) * 1e-3
                    side.params += step  # what training would write into its copy
                    expected += step
                    side.trained(n, None)
                    side.finish()  # quiescent: the thread's pull and our next write never race
                    left -= n
            for side in workers:
                side.finish()
        under.store.end_epoch()
        params, merged_velocity = under.store.snapshot()
        np.testing.assert_allclose(params, expected, atol=2e-5)
        for side in workers:
            np.testing.assert_array_equal(side.params, params)  # one model for evaluation
        assert merged_velocity.shape == velocity.shape
        saved = params.copy(), merged_velocity.copy()
    finally:
        under.close(workers)
    resumed = StoreUnderTest(config, network, nodes)  # a resume loads the snapshot
    workers = resumed.open_workers()
    try:
        resumed.store.load(*saved)
        for side in workers:
            np.testing.assert_array_equal(side.params, saved[0])
            np.testing.assert_array_equal(side.velocity, saved[1])
        np.testing.assert_array_equal(resumed.store.snapshot()[0], saved[0])
    finally:
        resumed.close(workers)
