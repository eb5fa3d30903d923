"""``hogwild.model.loops``: the loss and gradient of a range of examples, against PyTorch.

A batch method's replica (Sandblaster) needs the summed loss and gradient over many examples at
fixed parameters: :func:`gradient_range` with minibatches of 4 over a range of a shuffled order
must equal autograd's gradient of the summed cross-entropy, for a convolutional network and for
one with dropout (turned off by :func:`deterministic_ops`: inference-mode forward, backward
without the ``1 / (1 - p)`` scale), leave the parameters alone, and add into ``grad``.
"""

from __future__ import annotations

import numpy as np
import pytest

from hogwild.model.context import TrainingContext
from hogwild.model.loops import deterministic_ops, gradient_range
from hogwild.model.network import build_network
from tests.unit.test_kernels_torch import (
    MEAN,
    MODELS,
    STD,
    assert_grads_equal,
    init_params,
    normalised,
    random_images,
    torch_logits,
    torch_params,
)

# it calls kernels tests.warm_kernels compiles: it runs once they are in numba's cache
pytestmark = pytest.mark.warmed_kernels

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("name", ["same_stride2", "tanh_sigmoid_dropout"])
def test_summed_loss_and_gradient_of_a_range_match_autograd(name):
    network = build_network(MODELS[name])
    params = init_params(network, seed=3)
    before = params.copy()
    # the jobs' types (uint8 rows, LABEL_DTYPE labels): the training loop (train_chunk) the
    # warm-up compiled for the jobs, not a variant of its own
    images, labels = random_images(network, 11, seed=4)
    order = np.random.default_rng(5).permutation(11).astype(np.int64)
    ctx = TrainingContext.allocate(network, 4)
    ops = deterministic_ops(network.ops)
    grad = np.zeros(network.n_params, np.float32)
    args = (ctx.act, ctx.dact, ctx.aux, ctx.scratch, ctx.targets, images, labels, order)
    loss = gradient_range(ops, params, grad, *args, 1, 10, MEAN, STD)  # 9 examples: 4 + 4 + 1

    picked = order[1:10]
    tp = torch_params(network, params)
    logits = torch_logits(network, tp, normalised(network, images[picked]))  # dropout: identity
    expected = torch.nn.functional.cross_entropy(
        logits, torch.tensor(labels[picked].astype(np.int64)), reduction="sum"
    )
    expected.backward()
    assert loss == pytest.approx(expected.item(), rel=1e-5)
    assert_grads_equal(network, grad, tp)
    assert np.array_equal(params, before)

    again = gradient_range(ops, params, grad, *args, 1, 10, MEAN, STD)
    assert again == loss
    np.testing.assert_allclose(grad, 2 * network_grad(network, tp), rtol=1e-4, atol=1e-5)


def network_grad(network, tp) -> np.ndarray:
    flat = np.zeros(network.n_params, np.float32)
    for spec in network.params:
        flat[spec.offset : spec.offset + spec.size] = tp[spec.name].grad.numpy().ravel()
    return flat


def test_deterministic_ops_turn_dropout_off_only():
    network = build_network(MODELS["tanh_sigmoid_dropout"])
    ops = deterministic_ops(network.ops)
    changed = np.nonzero((ops != network.ops).any(axis=1))[0]
    assert [network.layers[i].config.type for i in changed] == ["dropout", "dropout"]
    assert network.ops[changed].any()  # the original table is left as it was
