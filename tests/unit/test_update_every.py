"""Grouped fully connected updates (``update_every``) do exactly what they promise.

With ``update_every = k`` at batch 1, the convolution weights and all biases are updated after
every example, while each fully connected weight matrix receives the sum of its k per-example
updates at the end of the group, every example of the group having seen the matrix as it was at
the group's start. The oracle replays that schedule with the reference backward pass (checked
against finite differences and PyTorch elsewhere) in numpy.
"""

from __future__ import annotations

import numpy as np
import pytest

from hogwild.config import load_config
from hogwild.model.context import TrainingContext
from hogwild.model.init import initialise
from hogwild.model.loops import LABEL_DTYPE
from hogwild.model.network import build_network
from hogwild.model.passes import backward, forward, load_example
from hogwild.optim.rules import RULE_SGD

# it calls kernels tests.warm_kernels compiles: it runs once they are in numba's cache
pytestmark = pytest.mark.warmed_kernels

MEAN, STD = 0.1307, 0.3081


def _fc_weight_slices(network):
    return [
        slice(spec.offset, spec.offset + spec.size)
        for spec in network.params
        if spec.name.startswith("fc") and spec.name.endswith(".weight")
    ]


def _replay(network, params, images, labels, lr, wd, group):
    """The grouped schedule, one example at a time, with the reference gradients."""
    params = params.copy()
    fc = _fc_weight_slices(network)
    weights = [s for s in (slice(p.offset, p.offset + p.size) for p in network.params)]
    is_weight = {s.start for s, p in zip(weights, network.params, strict=True) if not p.is_bias}
    pending = np.zeros_like(params)
    row = np.zeros(network.act_size, dtype=np.float32)
    drow, aux = np.zeros_like(row), np.zeros(network.act_size, dtype=np.int32)
    scratch = np.zeros(network.scratch_size, dtype=np.float32)
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        # The fc weights in `params` are still those of the group's start: their updates wait
        # in `pending`.
        frozen = params.copy()
        grad = np.zeros_like(params)
        load_example(image, row, MEAN, STD)
        forward(network.ops, frozen, row, aux, scratch, True)
        backward(network.ops, frozen, row, drow, aux, scratch, grad, label)
        for s in weights:
            decay = wd * params[s] if s.start in is_weight else 0.0
            step = lr * (grad[s] + decay)
            if any(s == f for f in fc):
                pending[s] += step
            else:
                params[s] -= step
        if (i + 1) % group == 0 or i == len(images) - 1:
            for s in fc:
                params[s] -= pending[s]
                pending[s] = 0.0
    return params


@pytest.mark.parametrize("group, wd", [(4, 0.0), (3, 0.01)])
def test_grouped_updates_match_the_replayed_schedule(group, wd):
    network = build_network(load_config().model.without_dropout())  # deterministic
    params = np.zeros(network.n_params, dtype=np.float32)
    initialise(network, params, "he", 1.0, 5)
    rng = np.random.default_rng(6)
    images = rng.integers(0, 256, (7, network.input_size), dtype=np.uint8)
    labels = rng.integers(0, 10, 7).astype(LABEL_DTYPE)
    expected = _replay(network, params, images, labels, 0.05, wd, group)

    ctx = TrainingContext.allocate(network, 1, group)
    velocity = np.zeros_like(params)
    order = np.arange(len(images), dtype=np.int64)
    ctx.train_chunk(
        network.ops,
        params,
        velocity,
        images,
        labels,
        order,
        0,
        len(images),
        batch=1,
        lr=0.05,
        mu=0.0,
        wd=wd,
        rule=RULE_SGD,
        mean=MEAN,
        std=STD,
        update_every=group,
    )
    # float32 trajectories of 7 sequential updates, summed in different orders (sgemm here).
    for spec in network.params:
        part = slice(spec.offset, spec.offset + spec.size)
        np.testing.assert_allclose(
            params[part], expected[part], rtol=1e-3, atol=1e-5, err_msg=spec.name
        )


def test_the_trainer_chooses_the_interval_when_it_is_zero():
    from hogwild.optim.interval import AUTO_UPDATE_EVERY, update_every

    config = load_config()
    assert config.train.update_every == 0
    assert update_every(config, 1) == 1  # one worker: Adam's per-example updates
    assert update_every(config, 2) == AUTO_UPDATE_EVERY  # shared weights: grouped
    assert update_every(config.override({"train.batch": 32}), 2) == 1  # minibatches already are
    assert update_every(config.override({"train.update_every": 3}), 2) == 3  # as configured


def test_a_negative_interval_is_rejected():
    from hogwild.errors import ConfigError

    with pytest.raises(ConfigError, match="train.update_every"):
        load_config().override({"train.update_every": -1})


def test_a_chunk_of_a_large_model_is_short_enough_to_beat_and_never_cuts_a_minibatch():
    """A worker beats between chunks: a model of hundreds of millions of connections gets
    fewer examples a chunk (a 256-example chunk of Fig. 10's largest ran for minutes, taken
    for a stuck worker), the bundled model its ``train.chunk``, and a chunk is whole units."""
    from hogwild.optim.interval import CHUNK_CONNECTIONS, whole_units

    config = load_config()
    bundled = build_network(config.model).connections
    assert whole_units(config, bundled) == whole_units(config) == config.train.chunk == 256
    largest = 523_044_000  # Fig. 10's x40 model
    assert whole_units(config, largest) == CHUNK_CONNECTIONS // largest == 16
    batched = config.override({"train.batch": 32})
    assert whole_units(batched, largest) == 32  # one minibatch at least, never a part of one
    assert whole_units(batched, 86_436_000) == 96  # 99 examples: three whole minibatches
    grouped = config.override({"train.update_every": 8})
    assert whole_units(grouped, largest) == 16 and whole_units(grouped, 10**12) == 8
