"""How many workers a job runs, where each one runs, and where the shared parameters live.

The policy lives in :mod:`hogwild.numa.placement` (fill a NUMA node's physical cores first, or
spread across nodes; hyperthread siblings only once every core has a worker; parameters
interleaved or replicated per node); this module turns the machine's topology and the job's
settings into that plan for the trainer.

``$HOGWILD_SYSFS`` names another sysfs tree to read the topology from instead of ``/sys``: a
tree that splits this machine's CPUs into several nodes runs a multi-node plan on a one-node
machine (the tests do), and a container with a masked ``/sys`` can be given the host's layout.
Its CPUs must exist here, since the workers are pinned to them.
"""

from __future__ import annotations

import os
from collections.abc import Collection

from hogwild.numa.placement import WorkerPlacement, default_worker_count, plan_workers
from hogwild.numa.topology import REAL_SYSFS, MachineTopology, read_topology

SYSFS_ENV = "HOGWILD_SYSFS"


def machine_topology() -> MachineTopology:
    """The topology of this machine, or of the tree ``$HOGWILD_SYSFS`` names."""
    return read_topology(os.environ.get(SYSFS_ENV) or REAL_SYSFS)


def worker_count(requested: int) -> int:
    """``requested`` workers, or one per physical core when it is 0."""
    return requested if requested > 0 else default_worker_count(machine_topology())


def worker_placements(
    n_workers: int, policy: str = "fill", avoid: Collection[int] = ()
) -> list[WorkerPlacement]:
    """The CPU and NUMA node of each worker (CPUs are reused when there are more workers).

    ``avoid``: CPUs other jobs' workers are pinned to, given out last.
    """
    return plan_workers(machine_topology(), n_workers, policy=policy, avoid=avoid)


def describe_cpus(placements: list[WorkerPlacement], taken: dict[int, int]) -> str:
    """The start-up line's account of where the workers run and what was avoided."""
    from hogwild.numa.topology import format_cpulist

    cpus = [p.cpu for p in placements]
    text = f"workers on CPUs {', '.join(map(str, cpus))}"
    if taken:
        shared = set(cpus) & set(taken)
        text += f" (CPUs {format_cpulist(set(taken))} are taken by another hogwild job's workers"
        text += f"; sharing {format_cpulist(shared)}: no free CPU left)" if shared else ")"
    return text
