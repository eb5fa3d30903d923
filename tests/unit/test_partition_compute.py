"""A partitioned replica computes what the whole model computes, checked against PyTorch.

With one example in flight, K = 1, 2 and 3 partitions (conv and fc layers split by output maps or
units, sizes that K does not divide) give the same class probabilities and the same gradient of
every parameter as the unpartitioned engine and as PyTorch autograd on the same weights; each
partition's gradient touches only the parameter rows it owns.
"""

from __future__ import annotations

import numpy as np
import pytest

from hogwild.config import config_from_dict, load_config
from hogwild.model.context import TrainingContext
from hogwild.model.loops import LABEL_DTYPE
from hogwild.model.network import COL_OUT, build_network
from hogwild.model.passes import backward, forward
from hogwild.model.update import apply_update
from hogwild.optim.rules import RULE_CODES
from hogwild.partition.compute import SequentialReplica
from hogwild.partition.plan import plan_partitions
from tests.unit.test_kernels_torch import ATOL, RTOL, init_params, torch_logits, torch_params

# it calls kernels tests.warm_kernels compiles: it runs once they are in numba's cache
pytestmark = pytest.mark.warmed_kernels

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _model(layers):
    return config_from_dict({"model": {"input": [1, 28, 28], "layers": layers}}).model


ODD = _model(
    [
        {"type": "conv", "maps": 5, "kernel": 3, "stride": 2, "padding": "same"},
        {"type": "relu"},
        {"type": "maxpool", "size": 3, "stride": 2},
        {"type": "conv", "maps": 7, "kernel": 3, "stride": 1, "padding": "valid"},
        {"type": "tanh"},
        {"type": "fc", "units": 11},
        {"type": "sigmoid"},
        {"type": "fc", "units": 10},
        {"type": "softmax"},
    ]
)
FC_ONLY = _model(
    [
        {"type": "fc", "units": 13},
        {"type": "relu"},
        {"type": "fc", "units": 10},
        {"type": "softmax"},
    ]
)
MODELS = {"adam_mnist": load_config().model.without_dropout(), "odd": ODD, "fc_only": FC_ONLY}


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_partitioned_step_equals_whole_model_and_autograd(name, k):
    network = build_network(MODELS[name])
    plan = plan_partitions(network, k)
    params = init_params(network, seed=7)
    rng = np.random.default_rng(8)
    x = rng.normal(0.0, 1.0, network.input_size).astype(np.float32)
    label = 4

    grads = [np.zeros(network.n_params, dtype=np.float32) for _ in range(k)]
    act = SequentialReplica(plan).step(params, x, label, grads).copy()

    ctx = TrainingContext.allocate(network, 1)
    ctx.act[0, : network.input_size] = x
    forward(network.ops, params, ctx.act[0], ctx.aux[0], ctx.scratch, False)
    backward(
        network.ops,
        params,
        ctx.act[0],
        ctx.dact[0],
        ctx.aux[0],
        ctx.scratch,
        ctx.grad,
        LABEL_DTYPE(label),  # the jobs' label type: one compiled backward for every test
    )

    out = int(network.ops[-1, COL_OUT])
    probs = act[out : out + network.n_classes]
    np.testing.assert_allclose(
        probs, ctx.act[0, out : out + network.n_classes], rtol=RTOL, atol=ATOL
    )
    tp = torch_params(network, params)
    logits = torch_logits(network, tp, torch.tensor(x).reshape(1, *network.input_shape))
    F.cross_entropy(logits, torch.tensor([label])).backward()
    np.testing.assert_allclose(
        probs, torch.softmax(logits, 1)[0].detach().numpy(), rtol=RTOL, atol=ATOL
    )

    total = np.sum(grads, axis=0)
    whole = network.views(ctx.grad)
    for spec in network.params:
        got = network.views(total)[spec.name]
        np.testing.assert_allclose(
            got, whole[spec.name], rtol=RTOL, atol=ATOL, err_msg=f"{spec.name} vs the whole model"
        )
        np.testing.assert_allclose(
            got,
            tp[spec.name].grad.numpy(),
            rtol=RTOL,
            atol=ATOL,
            err_msg=f"{spec.name} vs autograd",
        )
    for p in range(k):  # a partition's gradient lies in its own rows, and it has some
        owned = np.zeros(network.n_params, dtype=bool)
        for lo, hi in plan.param_rows(p):
            owned[lo:hi] = True
        assert not grads[p][~owned].any(), f"partition {p} wrote outside its rows"
        assert grads[p][owned].any(), f"partition {p} computed no gradient"


@pytest.mark.parametrize(("name", "k"), [("adam_mnist", 2), ("adam_mnist", 3), ("odd", 3)])
def test_a_partition_reads_no_other_partitions_rows(name, k):
    """A spread replica's hosts hold only their partitions' rows of the model (the others' stay
    the leader's SETUP zeros): with every row that partition p does not own NaN in p's copy, its
    slices of the activations, the errors it sends back and its gradients are those it computes
    on the true model, bit for bit (conv and fc layers split, K = 2 and 3)."""
    network = build_network(MODELS[name])
    plan = plan_partitions(network, k)
    params = init_params(network, seed=11)
    x = np.random.default_rng(12).normal(0.0, 1.0, network.input_size).astype(np.float32)
    label = 3

    def run(copies):
        grads = [np.zeros(network.n_params, dtype=np.float32) for _ in range(k)]
        replica = SequentialReplica(plan)
        act = replica.step(copies, x, label, grads).copy()
        return act, replica.dact.copy(), grads

    act, dact, grads = run([params] * k)
    blind = []
    for p in range(k):
        copy = np.full(network.n_params, np.nan, dtype=np.float32)
        for lo, hi in plan.param_rows(p):
            copy[lo:hi] = params[lo:hi]
        blind.append(copy)
    act_blind, dact_blind, grads_blind = run(blind)

    assert np.isfinite(act).all() and all(np.isfinite(g).all() for g in grads)
    np.testing.assert_array_equal(act_blind, act)
    np.testing.assert_array_equal(dact_blind, dact)
    for p in range(k):
        np.testing.assert_array_equal(grads_blind[p], grads[p], err_msg=f"partition {p}")


@pytest.mark.parametrize(("name", "k"), [("adam_mnist", 2), ("odd", 3), ("fc_only", 2)])
def test_sgd_in_the_pass_is_the_gradient_step(name, k):
    """The partition processes' per-example SGD (``sgd=``: each partition's fully connected rows
    updated as its backward pass streams them, the rest from ``grads``) leaves the weights that
    the reference (every gradient into ``grads``, then one SGD step with weight decay) leaves,
    over several examples; no partition touches another's rows."""
    network = build_network(MODELS[name])
    plan = plan_partitions(network, k)
    start = init_params(network, seed=5)
    rng = np.random.default_rng(6)
    examples = rng.normal(0.0, 1.0, (5, network.input_size)).astype(np.float32)
    labels = rng.integers(0, network.n_classes, 5)
    lr, weight_decay = 0.01, 0.001

    def train(in_place: bool) -> np.ndarray:
        params, velocity = start.copy(), np.zeros_like(start)
        replica = SequentialReplica(plan)
        grads = [np.zeros_like(start) for _ in range(k)]
        for x, label in zip(examples, labels, strict=True):
            sgd = (lr, weight_decay) if in_place else None
            replica.step(params, x, int(label), grads, sgd=sgd)
            for p in range(k):
                apply_update(
                    plan.ops[p], params, velocity, grads[p], lr, 1.0, 0.0, weight_decay,
                    RULE_CODES["sgd"], not in_place,
                )  # fmt: skip
        return params

    reference, in_the_pass = train(False), train(True)
    assert not np.array_equal(reference, start)
    np.testing.assert_allclose(in_the_pass, reference, rtol=1e-5, atol=1e-6)


def test_only_per_example_sgd_updates_the_fully_connected_rows_in_the_pass():
    """The partition processes' choice: sgd in the pass (nothing after it); momentum from the
    gradient after it (its velocity needs the whole gradient)."""
    from hogwild.model.passes import FC_ACCUMULATE, FC_SGD_IN_PLACE
    from hogwild.partition.compute import fc_update_mode

    assert fc_update_mode("sgd") == (FC_SGD_IN_PLACE, False)
    assert fc_update_mode("momentum") == (FC_ACCUMULATE, True)
