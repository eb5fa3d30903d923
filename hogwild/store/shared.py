"""Adam's one shared copy (``train.parameters = "shared"``): every worker writes it without locks.

Adam section 3.2.2: the workers of a machine update one set of weights in place, racing, and the
races add only a little noise because the updates are commutative sums. The copy (parameters and
momentum velocity) lives in the arena with its pages interleaved over the NUMA nodes the workers
run on, so no node's memory controller carries all the traffic. Nothing is exchanged, so there is
nothing to merge at an epoch end, and a snapshot is the copy itself.

Measured (README, ``bench/results/parameters.md``): on two cores of one processor, two workers
writing the same 1.15 MB of fully connected weights move cache lines between the cores all the
time; a copy per worker (``"replicate"``, the default) scaled better on every machine we tried,
and this store stays for reproducing Adam and for models too large to copy per worker.
"""

from __future__ import annotations

import mmap

import numpy as np

from hogwild.numa.pinning import first_touch, interleave_memory
from hogwild.store.protocol import ParameterStore, WorkerSpec, WorkerStore

PAGE = mmap.PAGESIZE


def add_home_regions(layout, n_params: int) -> None:
    """The home copy of the parameters and the velocity, each on pages of its own."""
    layout.add("params", np.float32, (n_params,), align=PAGE)
    layout.add("velocity", np.float32, (n_params,), align=PAGE)


def worker_nodes(placements) -> tuple[int, ...]:
    """The distinct NUMA nodes the workers run on, ascending."""
    return tuple(sorted({p.node for p in placements}))


class SharedStore(ParameterStore):
    """One copy in the arena, written by every worker."""

    name = "shared"

    def add_regions(self, layout) -> None:
        add_home_regions(layout, self.network.n_params)

    def attach(self, arena) -> None:
        self.params, self.velocity = arena.array("params"), arena.array("velocity")
        self.placed = True
        for array in (self.params, self.velocity):
            first_touch(array)  # map the reserved pages here so mbind can move them
            self.placed &= interleave_memory(array, worker_nodes(self.placements))

    def load(self, params: np.ndarray, velocity: np.ndarray) -> None:
        self.params[:] = params
        self.velocity[:] = velocity

    def end_epoch(self) -> None:
        pass

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        return self.params, self.velocity

    def worker_spec(self, worker: int) -> WorkerSpec:
        return WorkerSpec(self.name, worker)

    @classmethod
    def open_worker(cls, spec, arena, network, job) -> WorkerStore:
        return WorkerStore(arena.array("params"), arena.array("velocity"))

    def describe(self) -> dict:
        return {
            "store": self.name,
            "per": "job",
            "copies": 1,
            "nodes": list(worker_nodes(self.placements)),
            "placed_by_libnuma": self.placed,
        }

    def summary(self) -> str:
        return "parameters: one copy written by every worker (Adam's shared weights); pages " + (
            "interleaved by libnuma" if self.placed else "placed by first touch"
        )
