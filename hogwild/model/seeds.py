"""Which seed the kernels of each worker get: one per job seed, epoch and worker.

Distinct and reproducible, so a run's dropout masks can be drawn again and a resumed job
continues with the masks it would have drawn. Plain numpy, apart from the kernel that applies a
seed (:func:`hogwild.model.random.seed_kernels`): the parents that only hand seeds to their
workers (a trainer, a replica) load no numba for them.
"""

from __future__ import annotations

import numpy as np


def worker_seed(job_seed: int, epoch: int, worker: int) -> int:
    """A distinct, reproducible kernel seed per job, epoch and worker."""
    return int(np.random.SeedSequence([job_seed, epoch, worker]).generate_state(1)[0])
