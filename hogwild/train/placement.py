"""How many workers a job runs and which CPUs each is pinned to.

The policy lives in :mod:`hogwild.numa.placement` (fill a NUMA node's physical cores first, or
spread across nodes); this module turns its plan into what the trainer needs: a worker count
(default: one per physical core) and, per worker, the set of CPUs to pin it to.
"""

from __future__ import annotations

import os

import psutil


def worker_count(requested: int) -> int:
    """``requested`` workers, or one per physical core when it is 0."""
    if requested > 0:
        return requested
    return max(1, psutil.cpu_count(logical=False) or os.cpu_count() or 1)


def worker_cpu_sets(n_workers: int, policy: str = "fill") -> list[list[int]]:
    """The CPUs each worker is pinned to: one core each while there are cores to give."""
    try:
        from hogwild.numa.placement import plan_workers
        from hogwild.numa.topology import read_topology
    except ImportError:
        plan_workers = None
    if plan_workers is not None:
        plan = plan_workers(read_topology(), n_workers, policy=policy)
        return [[placement.cpu] for placement in plan]
    cpus = sorted(os.sched_getaffinity(0))
    return [[cpus[worker % len(cpus)]] for worker in range(n_workers)]
