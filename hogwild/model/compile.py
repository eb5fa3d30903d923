"""Compile every kernel once, in the parent, before any worker starts.

The kernels are ``njit(cache=True)``: the first call compiles them and writes the machine code to
numba's on-disk cache (``NUMBA_CACHE_DIR``, set by :mod:`hogwild.runtime`). Running one tiny
training step and one evaluation here, with exactly the argument types the workers use, means the
workers load the cached code instead of each compiling it again.
"""

import numpy as np

from hogwild.model import engine
from hogwild.model.network import Network
from hogwild.model.random import seed_kernels
from hogwild.optim.rules import RULE_CODES
from hogwild.train.context import TrainingContext


def compile_kernels(network: Network, batch: int) -> None:
    """Run one minibatch of training and one evaluation on zeros, compiling what they call."""
    context = TrainingContext.allocate(network, batch)
    params = np.zeros(network.n_params, dtype=np.float32)
    velocity = np.zeros_like(params)
    images = np.zeros((1, network.input_size), dtype=np.uint8)
    labels = np.zeros(1, dtype=np.uint8)
    order = np.zeros(1, dtype=np.int64)
    seed_kernels(0)
    for rule in sorted(set(RULE_CODES.values())):
        engine.train_chunk(
            network.ops,
            params,
            velocity,
            context.grad,
            context.act,
            context.dact,
            context.aux,
            context.scratch,
            context.targets,
            images,
            labels,
            order,
            0,
            1,
            batch,
            0.0,
            0.0,
            0.0,
            rule,
            0.0,
            1.0,
        )
    engine.evaluate_range(
        network.ops,
        params,
        context.act,
        context.aux,
        context.scratch,
        images,
        labels,
        0,
        1,
        0.0,
        1.0,
    )
