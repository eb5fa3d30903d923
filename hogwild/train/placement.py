"""How many workers a job runs and where each one runs.

The policy lives in :mod:`hogwild.numa.placement` (fill a NUMA node's physical cores first, or
spread across nodes; hyperthread siblings only once every core has a worker); this module turns
the machine's topology and the job's settings into that plan for the trainer.
"""

from __future__ import annotations

from hogwild.numa.placement import WorkerPlacement, default_worker_count, plan_workers
from hogwild.numa.topology import read_topology


def worker_count(requested: int) -> int:
    """``requested`` workers, or one per physical core when it is 0."""
    return requested if requested > 0 else default_worker_count(read_topology())


def worker_placements(n_workers: int, policy: str = "fill") -> list[WorkerPlacement]:
    """The CPU and NUMA node of each worker (CPUs are reused when there are more workers)."""
    return plan_workers(read_topology(), n_workers, policy=policy)
