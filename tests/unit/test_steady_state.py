"""The training step allocates nothing per example (Adam section 3.2.1: preallocated contexts).

numba's runtime counts every allocation it makes when ``NUMBA_NRT_STATS=1`` is set before numba
loads, so the check runs in a fresh interpreter: training 256 examples must allocate exactly as
often as training 32 (the few allocations there are belong to the call, not to the examples).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = """
import json, numpy as np
from numba.core.runtime import rtsys
rtsys.memsys_enable_stats()
from hogwild.config import load_config
from hogwild.model.network import build_network
from hogwild.model.init import initialise
from hogwild.model.engine import train_chunk
from hogwild.optim.rules import RULE_CODES
from hogwild.train.context import TrainingContext

network = build_network(load_config().model)
rng = np.random.default_rng(0)
images = rng.integers(0, 256, (256, network.input_size), dtype=np.uint8)
labels = (np.arange(256) % 10).astype(np.uint8)
order = np.arange(256, dtype=np.int64)
counts = {}
for batch, rule, wd in ((1, "sgd", 0.0), (1, "sgd", 5e-4), (32, "momentum", 5e-4)):
    params = np.zeros(network.n_params, dtype=np.float32)
    initialise(network, params, "he", 1.0, 1)
    velocity = np.zeros_like(params)
    ctx = TrainingContext.allocate(network, batch)

    def allocations(n):
        before = rtsys.get_allocation_stats().alloc
        train_chunk(network.ops, params, velocity, ctx.grad, ctx.act, ctx.dact, ctx.aux,
                    ctx.scratch, ctx.targets, images, labels, order, 0, n, batch, 0.001, 0.9,
                    wd, RULE_CODES[rule], 0.1307, 0.3081)
        return rtsys.get_allocation_stats().alloc - before

    allocations(batch)  # compile or load from the cache
    counts[f"{batch}-{rule}-{wd}"] = [allocations(32), allocations(256)]
print(json.dumps(counts))
"""


def test_training_allocates_nothing_per_example():
    env = dict(os.environ, NUMBA_NRT_STATS="1")
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    for case, (short, long) in counts.items():
        assert short == long, f"{case}: {short} allocations for 32 examples, {long} for 256"
