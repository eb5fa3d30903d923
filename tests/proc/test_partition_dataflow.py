"""The partition processes compute exactly what the partitioned step computes in one process.

Each partition reads only its own rows of the weights (its slice of every layer, over whole
inputs), so with one example in flight (the default) two partition processes are
deterministic: after an epoch their weights equal, to float rounding, per-example SGD through
:class:`hogwild.partition.compute.SequentialReplica` in this process. With four examples in
flight and a learning rate too small to move the weights, the loss the processes count over the
epoch equals the initial model's loss on those examples: no slot ever read another example's
activations or errors.
"""

from __future__ import annotations

import numpy as np
import pytest

from bench.support.paper_job import PAPER_OVERRIDES
from hogwild.config import load_config
from hogwild.data.mnist import load_mnist
from hogwild.model.context import TrainingContext
from hogwild.model.network import build_network
from hogwild.model.passes import load_example
from hogwild.model.update import apply_update
from hogwild.optim.rules import RULE_CODES
from hogwild.optim.schedule import epoch_rates, rate_within
from hogwild.partition.compute import SequentialReplica
from hogwild.partition.plan import plan_partitions
from hogwild.partition.runtime import train_partitioned
from hogwild.training.api import load_checkpoint
from hogwild.training.checkpoint import latest_checkpoint
from hogwild.training.job import epoch_permutation, subset_indices
from hogwild.training.resume import starting_point

SUBSET = 300


@pytest.fixture(scope="module")
def mnist(mnist_dir):
    return load_mnist(mnist_dir)


def _examples(config, mnist, subset=SUBSET):
    images = mnist.train_images.reshape(len(mnist.train_images), -1)
    chosen = subset_indices(config.train.seed, len(images), subset)
    images, labels = images[chosen], mnist.train_labels[chosen]
    order = epoch_permutation(config.train.seed, 0, len(images))
    return images, labels, order


def sequential_sgd(overrides: dict, mnist, subset: int = SUBSET) -> np.ndarray:
    """The weights after one epoch of per-example SGD through
    :class:`~hogwild.partition.compute.SequentialReplica` (``model.partitions`` of
    ``overrides``) in this process, each example at its rate (``optim.smooth``: on the line
    from the epoch's rate to the next epoch's)."""
    config = load_config(None, {**overrides, "train.subset": subset, "train.epochs": 1})
    network = build_network(config.model)
    k = config.model.partitions
    plan = plan_partitions(network, k)
    params, velocity, _, _ = starting_point(config, network, 10, False, print)
    images, labels, order = _examples(config, mnist, subset)
    replica = SequentialReplica(plan)
    grads = [np.zeros_like(params) for _ in range(k)]
    start, end = epoch_rates(config.optim, 0, 1)
    optim = config.optim
    mu = optim.momentum if optim.rule == "momentum" else 0.0
    in_place = optim.rule == "sgd"
    x = np.zeros(network.act_size, dtype=np.float32)
    for fed, index in enumerate(order):
        lr = rate_within(start, end, fed, len(order))
        load_example(images[index], x, config.data.mean, config.data.std)
        sgd = (lr, optim.weight_decay) if in_place else None  # as the partitions update
        replica.step(
            params, x[: network.input_size], int(labels[index]), grads, training=True, sgd=sgd
        )
        for p in range(k):
            apply_update(
                plan.ops[p],
                params,
                velocity,
                grads[p],
                lr,
                1.0,
                mu,
                optim.weight_decay,
                RULE_CODES[optim.rule],
                not in_place,
            )
    return params


def test_by_default_one_in_flight_equals_sequential_sgd_through_the_partitioned_step(
    tmp_path, mnist
):
    """The default ``train.in_flight`` is 1: a partitioned job trains exactly as the whole model
    would (more in flight train on stale weights, which diverges at large sizes)."""
    overrides = {**PAPER_OVERRIDES, "model.partitions": 2}
    result = train_partitioned(
        data=mnist,
        epochs=1,
        subset=SUBSET,
        progress=False,
        checkpoint_dir=tmp_path / "ck",
        overrides=overrides,
    )
    saved = load_checkpoint(latest_checkpoint(tmp_path / "ck"))
    np.testing.assert_allclose(saved.params, sequential_sgd(overrides, mnist), rtol=1e-5, atol=1e-6)
    assert result.metrics["examples"] == SUBSET
    assert result.metrics["in_flight"] == 1


def test_four_in_flight_count_every_example_loss_once(mnist):
    overrides = {**PAPER_OVERRIDES, "model.partitions": 2, "train.in_flight": 4, "optim.lr": 1e-12}
    result = train_partitioned(
        data=mnist, epochs=1, subset=SUBSET, progress=False, overrides=overrides
    )
    config = load_config(None, {**overrides, "train.subset": SUBSET})
    network = build_network(config.model)
    params, _, _, _ = starting_point(config, network, 10, False, print)
    images, labels, _ = _examples(config, mnist)
    context = TrainingContext.allocate(network, 1)
    loss, correct = context.evaluate_range(
        network.ops,
        params,
        images,
        labels.astype(np.int32),
        0,
        len(images),
        config.data.mean,
        config.data.std,
    )
    assert result.history[0]["train_loss"] == pytest.approx(loss / SUBSET, rel=1e-5)
    assert result.history[0]["train_accuracy"] == pytest.approx(correct / SUBSET)
