"""Seeding of the random numbers drawn inside numba kernels (dropout masks).

numba keeps its own generator state per thread, separate from numpy's, so it must be seeded
from compiled code. The trainer seeds every worker from (job seed, epoch, worker), which makes a
run's dropout masks reproducible and a resumed job continue with the masks it would have drawn
(the seed's value: :func:`hogwild.model.seeds.worker_seed`).
"""

import numpy as np

from hogwild.jit import kernel
from hogwild.model.seeds import worker_seed

__all__ = ["seed_kernels", "worker_seed"]


@kernel(cache=True)
def _seed(value):
    np.random.seed(value)


def seed_kernels(seed: int) -> None:
    """Seed the generator that numba kernels draw from in this process."""
    _seed(seed % (2**32))
