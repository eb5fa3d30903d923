"""Compile every kernel once, in the parent, before any worker trains.

The kernels are ``njit(cache=True)``: the first call compiles them and writes the machine code to
numba's on-disk cache (``NUMBA_CACHE_DIR``, set by :mod:`hogwild.runtime`). Running one tiny
training step and one evaluation here, with exactly the argument types the workers use, means the
workers load the cached code instead of each compiling it again. The workers start beside it; once
the trainer says its compile step is done (a flag in the arena's control block), each calls this
function itself, which then loads, before it says it is ready. :func:`~hogwild.locks.compile_lock`
makes jobs, or replicas, starting together compile one after the other, so the second loads what the
first compiled instead of compiling it again on the same cores. A start whose kernels the cache
already holds skips the parent's step (:func:`hogwild.compile_records.compile_once`).

Workers call the kernels with one set of argument types whether examples come from the arena or
from a data feed (an LMDB image cache, or augmentation: images from the feed's ring): uint8 image
rows and :data:`~hogwild.model.loops.LABEL_DTYPE` labels. ``feed=True`` also compiles the data
kernels the feed runs.
"""

import numpy as np

from hogwild.locks import compile_lock
from hogwild.model import loops
from hogwild.model.context import TrainingContext
from hogwild.model.network import Network
from hogwild.model.random import seed_kernels
from hogwild.optim.rules import RULE_CODES

__all__ = ["compile_kernels", "compile_lock"]


def compile_kernels(
    network: Network,
    batch: int,
    update_every: int = 1,
    *,
    feed: bool = False,
    evaluate: bool = True,
    images_dtype=np.uint8,
) -> None:
    """Run one minibatch of training and one evaluation on zeros, compiling what they call.

    Args:
        network: The model.
        batch: Examples per update (the training context's size).
        update_every: Examples per fully connected update at batch 1 (see ``train_chunk``).
        feed: Also compile the data kernels (reading, augmenting) a worker reading through a
            data feed calls.
        evaluate: Also compile the evaluation (a worker that never evaluates need not load it).
        images_dtype: The stored examples' type: uint8 pixels, or float32 values given as
            numpy arrays (:mod:`hogwild.data.arrays`).
    """
    # A context of its own: a worker's would keep this call's pending fully connected updates.
    context = TrainingContext.allocate(network, batch, update_every)
    params = np.zeros(network.n_params, dtype=np.float32)
    velocity = np.zeros_like(params)
    order = np.zeros(1, dtype=np.int64)
    # Images are C-contiguous uint8 rows, in the arena and in a feed's ring alike.
    images = np.zeros((1, network.input_size), dtype=images_dtype)
    labels = np.zeros(1, dtype=loops.LABEL_DTYPE)
    seed_kernels(0)
    for rule in sorted(set(RULE_CODES.values())):
        context.train_chunk(
            network.ops,
            params,
            velocity,
            images,
            labels,
            order,
            0,
            1,
            batch=batch,
            lr=0.0,
            mu=0.0,
            wd=0.0,
            rule=rule,
            mean=0.0,
            std=1.0,
            update_every=update_every,
        )
    if evaluate:
        context.evaluate_range(network.ops, params, images, labels, 0, 1, 0.0, 1.0)
    if feed:
        from hogwild.data.feed import compile_data_kernels

        compile_data_kernels()
