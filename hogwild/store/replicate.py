"""Copies exchanged with a home copy in shared memory (``train.parameters = "replicate"``).

A parameter server on one machine: each worker (or each NUMA node) trains on a copy of its own in
the arena, and the copy's communication thread pushes its progress into the *home* copy and pulls
the others' from it on the job's cadences (:mod:`hogwild.store.copies`,
:mod:`hogwild.store.exchange`). A copy per worker keeps two cores from writing the same weights,
which costs most of a second core where two workers share one copy (the default, measured in
the README); a copy per node keeps each node's writes in its own memory.

The home copy is written by several leaders at once without locks, with the same per-element
races as every other Hogwild write. Fully connected layers can arrive as activation and error
vectors (Adam section 3.2.6): this home computes their update itself, one sgemm per layer and
buffer, and applies it: ``W = (1 - decay) * W - lr * E^T A``.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np

from hogwild.compile_records import compile_once
from hogwild.store.copies import CopiesStore, fc_layers
from hogwild.store.exchange import FcLayer, Home, VectorBuffer


class ArenaHome(Home):
    """The home copy in the arena, reached directly from the leader's thread."""

    def __init__(self, home: np.ndarray, layers: tuple[FcLayer, ...] = ()) -> None:
        # The kernels load with the first home, in the leader that runs them: a process that only
        # plans the store (``hogwild info``, a parent) loads no numba.
        from hogwild.store import kernels

        self.kernels = kernels
        self.home = home
        largest = max((layer.n_in * layer.n_out for layer in layers), default=0)
        self._gradient = np.zeros(largest, dtype=np.float32)  # one layer's outer products

    def push(self, copy, base, ranges) -> None:
        self.kernels.push_ranges(self.home, copy, base, ranges)

    def fetch(self) -> np.ndarray:
        return self.home

    def merge(self, values, copy, base, ranges) -> None:
        if values is self.home:
            self.kernels.pull_ranges(self.home, copy, base, ranges)  # reads each home value once
        else:
            self.kernels.merge_pulled(values, copy, base, ranges)

    def exchange(self, copy, base, ranges) -> np.ndarray:
        self.kernels.exchange_ranges(self.home, copy, base, ranges)
        return self.home

    def push_vectors(self, layers: tuple[FcLayer, ...], buffer: VectorBuffer) -> None:
        for i, layer in enumerate(layers):
            start, stop = layer.weights
            weights = self.home[start:stop].reshape(layer.n_out, layer.n_in)
            gradient = self._gradient[: stop - start].reshape(layer.n_out, layer.n_in)
            self.kernels.apply_vectors(
                weights,
                buffer.acts[i],
                buffer.errs[i],
                buffer.rows,
                buffer.lr,
                buffer.decay,
                gradient,
            )


class ReplicateStore(CopiesStore):
    """Copies per worker or per node, exchanged with the home copy in the arena."""

    # every example at first; two copies reach 64 after 8,064 examples each, four or more after
    # 16,128 (RAMP_CAP; bench/results/copies_at_start.md: 16 per copy left 1 run of 13 dead at
    # four copies, 64 none of 19)
    cadence_ramp = 64

    name = "replicate"

    def gather_home(self) -> None:
        from hogwild.store.kernels import exchange_ranges  # see ArenaHome

        params, _, base = self.copies
        everything = np.array([[0, self.network.n_params]], dtype=np.int64)
        for row in range(params.shape[0]):
            exchange_ranges(self.params, params[row], base[row], everything)

    def compile_kernels(self) -> None:
        what = {"kernels": "replicate-store", "vectors": self.vectors}
        if not compile_once(what, self._compile):
            # found compiled: the first epoch end's merge (gather_home) would load numba and the
            # kernel on the barrier, every worker idle; load them now, beside the training
            # (not a daemon: an interpreter ending under a thread inside LLVM can crash; the
            # load takes a second, so an exit waits at most that long)
            loading = threading.Thread(target=self._load_merge, name="hogwild-store-load")
            loading.start()

    @staticmethod
    def _load_merge() -> None:
        from hogwild.store.kernels import exchange_ranges

        one = np.zeros(4, dtype=np.float32)
        with contextlib.suppress(Exception):  # the epoch end loads (or compiles) it after all
            exchange_ranges(one, one.copy(), one.copy(), np.array([[0, 4]], dtype=np.int64))

    def _compile(self) -> None:
        from hogwild.store.kernels import (
            apply_vectors,
            capture_vectors,
            copy_ranges,
            exchange_ranges,
            merge_pulled,
            pull_ranges,
            push_ranges,
        )

        one = np.zeros(4, dtype=np.float32)
        ranges = np.array([[0, 4]], dtype=np.int64)
        for kernel in (push_ranges, pull_ranges, exchange_ranges, merge_pulled):
            kernel(one, one.copy(), one.copy(), ranges)
        if self.vectors:
            copy_ranges(one, one.copy(), ranges)
            rows = np.zeros((2, 4), dtype=np.float32)
            block = np.zeros((2, 2), dtype=np.float32)
            capture_vectors(rows, rows.copy(), 1, 0, 0, 2, 2, 1.0, block, block.copy(), 0)
            apply_vectors(block, block.copy(), block.copy(), 1, 0.0, 0.0, block.copy())

    @classmethod
    def open_home(cls, spec, arena, network, job) -> Home:
        layers = fc_layers(network) if spec.values["vectors"] else ()
        return ArenaHome(arena.array("params"), layers)
