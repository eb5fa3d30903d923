"""Where a job's shared parameters live: one copy interleaved over nodes, or one copy per node.

``train.parameters`` chooses (Adam sections 3.2.1 and 3.3.1 keep each shard on a chosen node):

- ``"interleave"`` (the default): one copy of the parameters and the momentum velocity, its
  pages spread round-robin over the NUMA nodes the workers run on, so every node sees the same
  average bandwidth and no node's memory controller carries all the traffic.
- ``"replicate"``: besides the *home* copy (interleaved as above), one copy per node, each bound
  to its node (or, with ``train.replicas = "worker"``, one copy per worker, on its worker's node);
  the node's workers train on it without locks, and the node's first worker (its leader)
  exchanges progress with the home copy every ``train.exchange_every`` examples
  (:func:`hogwild.optim.exchange.exchange_deltas`). At each epoch end the parent folds every
  copy into the home copy and hands the result back to all of them, so evaluation and
  checkpoints see one model. The velocity is not exchanged during an epoch (it is optimizer
  state, not model); at the epoch end every copy and the home copy get the copies' mean, which
  is what the checkpoint records.

On a one-node machine, one copy per node is the single copy; one per worker still gives every
worker its own, which is what spares a small machine the cache-line traffic of two cores writing
the same weights (``bench/results/parameters.md``). The parent places the pages with
libnuma (``mbind``, moving pages the segment reserved) when it is there; without it they stay
where the parent first touched them.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass

import numpy as np

from hogwild.model.network import Network
from hogwild.numa.pinning import bind_memory, first_touch, interleave_memory
from hogwild.numa.placement import ParameterPlacement
from hogwild.shm.arena import Arena, ArenaLayout

PAGE = mmap.PAGESIZE
COPY_REGIONS = ("copy_params", "copy_velocity", "copy_base")


def add_parameter_regions(
    layout: ArenaLayout, network: Network, placement: ParameterPlacement
) -> None:
    """Add the parameter regions to a job's layout, each starting on a page of its own.

    Every per-node copy is a row whose length is rounded up to whole pages, so binding one
    node's row never moves a page of another's.
    """
    n = network.n_params
    layout.add("params", np.float32, (n,), align=PAGE)
    layout.add("velocity", np.float32, (n,), align=PAGE)
    if placement.n_copies > 1:
        row = -(-n * 4 // PAGE) * PAGE // 4
        for name in COPY_REGIONS:
            layout.add(name, np.float32, (placement.n_copies, row), align=PAGE)


@dataclass
class SharedParameters:
    """A job's parameter arrays in an attached arena, and the operations on them.

    Attributes:
        placement: Where they live (from :func:`hogwild.numa.placement.plan_parameters`).
        params: The home copy of the parameters.
        velocity: The home copy of the momentum velocity.
    """

    placement: ParameterPlacement
    params: np.ndarray
    velocity: np.ndarray
    _copies: tuple[np.ndarray, np.ndarray, np.ndarray] | None

    @classmethod
    def attach(cls, arena: Arena, placement: ParameterPlacement) -> SharedParameters:
        """The views of ``arena``'s parameter regions."""
        params, velocity = arena.array("params"), arena.array("velocity")
        copies = None
        if placement.n_copies > 1:
            n = params.shape[0]
            copies = tuple(arena.array(name)[:, :n] for name in COPY_REGIONS)
        return cls(placement, params, velocity, copies)

    @property
    def replicated(self) -> bool:
        """Whether there is more than one copy."""
        return self._copies is not None

    def place(self) -> bool:
        """Put the pages where the placement says (the parent, before the workers attach).

        Returns:
            True if libnuma placed every copy; False when the pages stay where first touch put
            them (no libnuma, or a node the kernel does not know).
        """
        nodes = self.placement.nodes
        placed = True
        for array in (self.params, self.velocity):
            first_touch(array)  # map the reserved pages here so mbind can move them
            placed &= interleave_memory(array, nodes)
        if self._copies is not None:
            for array in self._copies:
                for row, node in enumerate(nodes):
                    first_touch(array[row])
                    placed &= bind_memory(array[row], node)
        return placed

    def for_worker(self, worker: int) -> tuple[np.ndarray, np.ndarray]:
        """The parameters and velocity ``worker`` trains on: its node's copy, or the home one."""
        if self._copies is None:
            return self.params, self.velocity
        row = self.placement.replica_of_worker[worker]
        return self._copies[0][row], self._copies[1][row]

    def is_leader(self, worker: int) -> bool:
        """Whether ``worker`` exchanges its copy (its node's, or its own) with the home copy."""
        if self._copies is None:
            return False
        row = self.placement.replica_of_worker[worker]
        return self.placement.replica_of_worker.index(row) == worker

    def exchange(self, worker: int) -> None:
        """Swap progress between ``worker``'s copy and the home copy (the copy's leader does)."""
        from hogwild.optim.exchange import exchange_deltas

        row = self.placement.replica_of_worker[worker]
        params, _, base = self._copies
        exchange_deltas(self.params, params[row], base[row])

    def merge(self) -> None:
        """Fold every node's progress into the home copy and give it back to every node.

        Called by the parent while no worker trains (between epochs). The velocity becomes the
        mean of the copies' velocities, in the home copy (what a checkpoint records) and in every
        copy, so a job resumed from the checkpoint continues from the same state.
        """
        if self._copies is None:
            return
        from hogwild.optim.exchange import exchange_deltas

        params, velocity, base = self._copies
        for row in range(params.shape[0]):
            exchange_deltas(self.params, params[row], base[row])
        params[:] = self.params
        base[:] = self.params
        np.mean(velocity, axis=0, out=self.velocity)
        velocity[:] = self.velocity

    def spread(self) -> None:
        """Copy the home parameters and velocity to every node (after initialising or restoring)."""
        if self._copies is None:
            return
        params, velocity, base = self._copies
        params[:] = self.params
        base[:] = self.params
        velocity[:] = self.velocity

    @property
    def copy_nodes(self) -> tuple[int, ...]:
        """The distinct nodes that hold a copy (or the home copy's pages), ascending."""
        return tuple(sorted(set(self.placement.nodes)))

    def describe(self) -> dict:
        """Where the parameters are, for the job's start record."""
        return {
            "mode": self.placement.mode,
            "per": self.placement.per,
            "copies": self.placement.n_copies,
            "nodes": list(self.placement.nodes),
        }


class ExchangeClock:
    """Counts a worker's examples and runs its copy's exchange every ``every`` of them.

    Only a copy's leader exchanges; for any other worker, and when there is one copy, it does
    nothing. Exchanges fall between whole units of training (``unit``: a minibatch, or at batch 1
    a group of examples whose fully connected updates are applied together), at the first unit
    boundary once ``every`` examples have accumulated, so an exchange never cuts a minibatch
    short.
    """

    def __init__(self, shared: SharedParameters, worker: int, every: int, unit: int = 1) -> None:
        self.shared, self.worker, self.every = shared, worker, every
        self.unit = max(1, unit)
        self.active = shared.is_leader(worker)
        self.pending = 0

    def span(self, examples: int) -> int:
        """How many of ``examples`` to train before the next look at the clock."""
        if not self.active:
            return examples
        due = max(1, self.every - self.pending)
        return min(examples, -(-due // self.unit) * self.unit)

    def trained(self, examples: int) -> None:
        """Count ``examples`` more; exchange once ``every`` have accumulated."""
        if not self.active:
            return
        self.pending += examples
        if self.pending >= self.every:
            self.shared.exchange(self.worker)
            self.pending = 0
