"""The training step allocates nothing per example (Adam section 3.2.1: preallocated contexts).

numba's runtime counts every allocation it makes once its statistics are switched on: training
256 examples must allocate exactly as often as training 32 (the few allocations there are belong
to the call, not to the examples), at batch 1 (with and without weight decay, per example and with
the fully connected updates grouped) and at batch 32; and the exchange of a copy with its home
allocates nothing per element or range either.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba.core.runtime import _nrt_python, rtsys

from hogwild.config import load_config
from hogwild.model.context import TrainingContext
from hogwild.model.init import initialise
from hogwild.model.loops import LABEL_DTYPE
from hogwild.model.network import build_network
from hogwild.optim.rules import RULE_CODES

# it calls kernels tests.warm_kernels compiles: it runs once they are in numba's cache
pytestmark = pytest.mark.warmed_kernels


@pytest.fixture
def allocation_counter():
    was_enabled = _nrt_python.memsys_stats_enabled()
    _nrt_python.memsys_enable_stats()
    yield lambda: rtsys.get_allocation_stats().alloc
    if not was_enabled:
        _nrt_python.memsys_disable_stats()


@pytest.mark.parametrize(
    "batch, rule, wd, update_every",
    [
        (1, "sgd", 0.0, 1),
        (1, "sgd", 5e-4, 1),
        (1, "sgd", 5e-4, 8),  # fully connected updates grouped: the default with two workers
        (1, "momentum", 5e-4, 8),
        (32, "momentum", 5e-4, 1),
    ],
)
def test_training_allocates_nothing_per_example(allocation_counter, batch, rule, wd, update_every):
    network = build_network(load_config().model)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (256, network.input_size), dtype=np.uint8)
    labels = (np.arange(256) % 10).astype(LABEL_DTYPE)
    order = np.arange(256, dtype=np.int64)
    params = np.zeros(network.n_params, dtype=np.float32)
    initialise(network, params, "he", 1.0, 1)
    velocity = np.zeros_like(params)
    ctx = TrainingContext.allocate(network, batch, update_every)

    def allocations(n: int) -> int:
        before = allocation_counter()
        ctx.train_chunk(
            network.ops,
            params,
            velocity,
            images,
            labels,
            order,
            0,
            n,
            batch=batch,
            lr=0.001,
            mu=0.9,
            wd=wd,
            rule=RULE_CODES[rule],
            mean=0.1307,
            std=0.3081,
            update_every=update_every,
        )
        return allocation_counter() - before

    allocations(batch)  # compile, or load from the cache
    assert allocations(32) == allocations(256)


def test_exchanging_a_copy_allocates_nothing_per_element_or_range(allocation_counter):
    from hogwild.store.kernels import exchange_ranges, pull_ranges, push_ranges

    home, copy, base = (np.zeros(100_000, dtype=np.float32) for _ in range(3))
    few = np.array([[0, 10]], dtype=np.int64)
    many = np.array([[i * 1000, i * 1000 + 900] for i in range(100)], dtype=np.int64)
    for kernel in (push_ranges, pull_ranges, exchange_ranges):
        kernel(home, copy, base, few)  # compile, or load from the cache

        def allocations(ranges, kernel=kernel):
            before = allocation_counter()
            kernel(home, copy, base, ranges)
            return allocation_counter() - before

        assert allocations(few) == allocations(many), kernel  # the call's, not the work's
