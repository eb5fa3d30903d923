"""The numba engine against PyTorch autograd, in float32.

Proves that the engine computes what the equivalent PyTorch model computes, with the weights
copied by name from :meth:`Network.views` (conv ``[out, in, kh, kw]``, fc ``[out, in]``):

* one example's class probabilities, every parameter gradient and the input gradient, for the
  bundled Adam MNIST model, a same-padding / stride-2 / max-pool 3/2 variant, a
  tanh / sigmoid / dropout variant (dropout with the engine's own mask), and a variant with
  integer convolution padding (an even kernel) and average pooling (windows apart and
  overlapping);
* ``predict_batch`` and ``evaluate_range`` (normalisation ``(x / 255 - mean) / std`` of uint8
  images, summed cross-entropy, number correct) in evaluation mode;
* ``train_chunk`` with batch 4 and plain SGD equals one ``torch.optim.SGD`` step on the mean
  cross-entropy of those 4 examples;
* two ``train_chunk`` minibatches with momentum 0.9 and weight decay 0.01 equal
  ``torch.optim.SGD(momentum=0.9, weight_decay=0.01)`` with decay on weights only (biases in a
  group without decay), velocities included;
* three minibatches with Adam and with AdamW equal ``torch.optim.Adam`` / ``AdamW`` step for
  step, both moments included.
"""

from __future__ import annotations

import numpy as np
import pytest

from hogwild.config import config_from_dict, load_config
from hogwild.model.context import TrainingContext
from hogwild.model.init import initialise
from hogwild.model.loops import LABEL_DTYPE, NO_PROBABILITIES, evaluate_range, predict_batch
from hogwild.model.network import COL_NEED_DIN, COL_OUT, Network, build_network, conv_padding
from hogwild.model.passes import backward, forward
from hogwild.model.random import seed_kernels
from hogwild.optim.rules import RULE_ADAM, RULE_ADAMW, RULE_MOMENTUM, RULE_SGD

# it calls kernels tests.warm_kernels compiles: it runs once they are in numba's cache
pytestmark = pytest.mark.warmed_kernels

torch = pytest.importorskip("torch")
F = torch.nn.functional

RTOL = 1e-4
ATOL = 1e-5
MEAN = 0.1307
STD = 0.3081


def _model(layers: list[dict], input_shape=(1, 28, 28)):
    data = {"model": {"input": list(input_shape), "layers": layers}}
    return config_from_dict(data).model


SAME_STRIDE2 = _model(
    [
        {"type": "conv", "maps": 6, "kernel": 5, "stride": 2, "padding": "same"},
        {"type": "relu"},
        {"type": "maxpool", "size": 3, "stride": 2},
        {"type": "conv", "maps": 8, "kernel": 3, "stride": 1, "padding": "same"},
        {"type": "relu"},
        {"type": "conv", "maps": 12, "kernel": 3, "stride": 2, "padding": "same"},
        {"type": "relu"},
        {"type": "fc", "units": 32},
        {"type": "relu"},
        {"type": "fc", "units": 10},
        {"type": "softmax"},
    ]
)

SMOOTH_DROPOUT = _model(
    [
        {"type": "conv", "maps": 4, "kernel": 3, "stride": 2, "padding": "valid"},
        {"type": "tanh"},
        {"type": "maxpool", "size": 2, "stride": 2},
        {"type": "conv", "maps": 6, "kernel": 3, "stride": 1, "padding": "valid"},
        {"type": "sigmoid"},
        {"type": "dropout", "p": 0.4},
        {"type": "fc", "units": 24},
        {"type": "tanh"},
        {"type": "dropout", "p": 0.2},
        {"type": "fc", "units": 10},
        {"type": "softmax"},
    ]
)

# Integer padding as PyTorch's Conv2d(padding=n) (an even kernel too), and average pooling with
# windows that do not overlap and windows that do.
AVGPOOL_INT_PADDING = _model(
    [
        {"type": "conv", "maps": 5, "kernel": 4, "stride": 2, "padding": 1},
        {"type": "relu"},
        {"type": "avgpool", "size": 2},
        {"type": "conv", "maps": 7, "kernel": 3, "stride": 1, "padding": 2},
        {"type": "tanh"},
        {"type": "avgpool", "size": 3, "stride": 2},
        {"type": "fc", "units": 10},
        {"type": "softmax"},
    ]
)

MODELS = {
    "adam_mnist": load_config().model.without_dropout(),
    "avgpool_int_padding": AVGPOOL_INT_PADDING,
    "same_stride2": SAME_STRIDE2,
    "tanh_sigmoid_dropout": SMOOTH_DROPOUT,
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def network(request) -> Network:
    return build_network(MODELS[request.param])


def init_params(network: Network, seed: int) -> np.ndarray:
    params = np.zeros(network.n_params, dtype=np.float32)
    initialise(network, params, "torch", 1.0, seed)
    return params


def torch_params(network: Network, params: np.ndarray) -> dict:
    return {
        name: torch.tensor(view.copy(), requires_grad=True)
        for name, view in network.views(params).items()
    }


def torch_logits(network: Network, tp: dict, x, masks: dict | None = None):
    """The equivalent PyTorch model, layer by layer; ``x`` is [n, c, h, w], returns logits.

    ``masks`` holds, per dropout layer index, the engine's keep mask [n, units] (training mode);
    without it dropout is the identity (evaluation mode).
    """
    for layer in network.layers:
        cfg, kind = layer.config, layer.config.type
        if kind == "conv":
            pad = conv_padding(cfg)
            w, b = tp[f"{layer.name}.weight"], tp[f"{layer.name}.bias"]
            x = F.conv2d(x, w, b, stride=cfg.stride, padding=pad)
        elif kind == "maxpool":
            x = F.max_pool2d(x, cfg.size, cfg.stride)
        elif kind == "avgpool":
            x = F.avg_pool2d(x, cfg.size, cfg.stride)
        elif kind == "fc":
            x = F.linear(x.flatten(1), tp[f"{layer.name}.weight"], tp[f"{layer.name}.bias"])
        elif kind == "relu":
            x = torch.relu(x)
        elif kind == "tanh":
            x = torch.tanh(x)
        elif kind == "sigmoid":
            x = torch.sigmoid(x)
        elif kind == "dropout":
            if masks is not None:
                mask = torch.tensor(masks[layer.index], dtype=x.dtype).reshape(x.shape)
                x = x * mask / (1.0 - cfg.p)
        elif kind == "softmax":
            return x
        assert tuple(x.shape[1:]) == layer.out_shape, layer
    raise AssertionError("no softmax layer")


def dropout_masks(network: Network, aux: np.ndarray) -> dict:
    """The engine's dropout masks (kept in ``aux`` at each dropout layer's output offset)."""
    masks = {}
    for layer in network.layers:
        if layer.config.type == "dropout":
            start = network.act_offsets[layer.index + 1]
            masks[layer.index] = aux[..., start : start + int(np.prod(layer.out_shape))].copy()
    return masks


def random_images(network: Network, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, network.input_size), dtype=np.uint8)
    labels = rng.integers(0, network.n_classes, size=n).astype(LABEL_DTYPE)
    return images, labels


def normalised(network: Network, images: np.ndarray):
    x = torch.tensor(images.astype(np.float32)).reshape(-1, *network.input_shape)
    return (x / 255.0 - MEAN) / STD


def assert_grads_equal(network: Network, grad: np.ndarray, tp: dict) -> None:
    views = network.views(grad)
    for spec in network.params:
        expected = tp[spec.name].grad.numpy()
        np.testing.assert_allclose(
            views[spec.name], expected, rtol=RTOL, atol=ATOL, err_msg=f"gradient of {spec.name}"
        )
        assert np.abs(expected).max() > 0, spec.name  # every tensor's check means something


def assert_params_equal(network: Network, params: np.ndarray, tp: dict, share=1.0) -> None:
    """Every parameter equals torch's, or (``share`` < 1) at least that share of each tensor."""
    views = network.views(params)
    for spec in network.params:
        ours, theirs = views[spec.name], tp[spec.name].detach().numpy()
        if share < 1.0:
            close = np.isclose(ours, theirs, rtol=RTOL, atol=ATOL)
            assert close.mean() >= share, (spec.name, close.mean())
            continue
        np.testing.assert_allclose(
            ours, theirs, rtol=RTOL, atol=ATOL, err_msg=f"parameter {spec.name}"
        )


def test_one_example_forward_and_backward_match_autograd(network):
    params = init_params(network, seed=5)
    rng = np.random.default_rng(6)
    x = rng.normal(0.0, 1.0, network.input_size).astype(np.float32)
    label = LABEL_DTYPE(3)  # the jobs' label type: one compiled backward for every test
    ops = network.ops.copy()
    ops[0, COL_NEED_DIN] = 1
    ctx = TrainingContext.allocate(network, 1)
    a, da, aux = ctx.act[0], ctx.dact[0], ctx.aux[0]
    a[: network.input_size] = x
    seed_kernels(11)
    forward(ops, params, a, aux, ctx.scratch, True)
    backward(ops, params, a, da, aux, ctx.scratch, ctx.grad, label)

    tp = torch_params(network, params)
    tx = torch.tensor(x).reshape(1, *network.input_shape).requires_grad_(True)
    logits = torch_logits(network, tp, tx, dropout_masks(network, aux[None, :]))
    F.cross_entropy(logits, torch.tensor([int(label)])).backward()

    out = int(network.ops[-1, COL_OUT])
    probs = torch.softmax(logits, dim=1)[0].detach().numpy()
    np.testing.assert_allclose(a[out : out + network.n_classes], probs, rtol=RTOL, atol=ATOL)
    assert_grads_equal(network, ctx.grad, tp)
    np.testing.assert_allclose(
        da[: network.input_size], tx.grad.numpy().ravel(), rtol=RTOL, atol=ATOL
    )


def test_predict_batch_matches_torch_in_evaluation_mode(network):
    params = init_params(network, seed=7)
    images, _ = random_images(network, 5, seed=8)
    x = normalised(network, images)
    ctx = TrainingContext.allocate(network, 1)
    probs = np.zeros((len(images), network.n_classes), dtype=np.float32)
    predict_batch(
        network.ops,
        params,
        ctx.act,
        ctx.aux,
        ctx.scratch,
        np.ascontiguousarray(x.reshape(len(images), -1).numpy()),
        probs,
    )
    with torch.no_grad():
        expected = torch.softmax(torch_logits(network, torch_params(network, params), x), 1)
    np.testing.assert_allclose(probs, expected.numpy(), rtol=RTOL, atol=ATOL)


def test_evaluate_range_matches_torch_loss_and_accuracy():
    network = build_network(MODELS["adam_mnist"])
    params = init_params(network, seed=9)
    images, labels = random_images(network, 12, seed=10)
    ctx = TrainingContext.allocate(network, 1)
    loss, correct = evaluate_range(
        network.ops,
        params,
        ctx.act,
        ctx.aux,
        ctx.scratch,
        images,
        False,
        labels,
        2,
        11,
        MEAN,
        STD,
        NO_PROBABILITIES,
    )
    with torch.no_grad():
        logits = torch_logits(network, torch_params(network, params), normalised(network, images))
    target = torch.tensor(labels.astype(np.int64))
    expected = F.cross_entropy(logits[2:11], target[2:11], reduction="sum").item()
    assert loss == pytest.approx(expected, rel=RTOL)
    assert correct == int((logits[2:11].argmax(1) == target[2:11]).sum())


def _train(network, params, velocity, ctx, images, labels, batch, lr, mu, wd, rule):
    order = np.arange(len(images), dtype=np.int64)
    return ctx.train_chunk(
        network.ops,
        params,
        velocity,
        images,
        labels,
        order,
        0,
        len(images),
        batch=batch,
        lr=lr,
        mu=mu,
        wd=wd,
        rule=rule,
        mean=MEAN,
        std=STD,
        update_every=1,
    )


@pytest.mark.parametrize("name", ["adam_mnist", "same_stride2", "avgpool_int_padding"])
def test_minibatch_sgd_step_matches_torch(name):
    network = build_network(MODELS[name])
    params = init_params(network, seed=12)
    before = params.copy()
    tp = torch_params(network, params)
    images, labels = random_images(network, 4, seed=13)
    ctx = TrainingContext.allocate(network, 4)
    velocity = np.zeros_like(params)
    loss, correct = _train(
        network, params, velocity, ctx, images, labels, 4, 0.1, 0.0, 0.0, RULE_SGD
    )

    optimizer = torch.optim.SGD(list(tp.values()), lr=0.1)
    logits = torch_logits(network, tp, normalised(network, images))
    target = torch.tensor(labels.astype(np.int64))
    mean_loss = F.cross_entropy(logits, target)
    mean_loss.backward()
    optimizer.step()

    assert loss == pytest.approx(4 * mean_loss.item(), rel=RTOL)
    assert correct == int((logits.argmax(1) == target).sum())
    assert_params_equal(network, params, tp)
    # The step itself (not only the parameters, which barely move) matches torch's step.
    for spec in network.params:
        step = (
            before[spec.offset : spec.offset + spec.size]
            - params[spec.offset : spec.offset + spec.size]
        )
        expected = 0.1 * tp[spec.name].grad.numpy().ravel()
        np.testing.assert_allclose(step, expected, rtol=1e-3, atol=1e-6, err_msg=spec.name)
    assert not ctx.grad.any()  # the private gradient is cleared by the update
    assert not velocity.any()  # plain SGD keeps no velocity


def test_two_momentum_steps_with_weight_decay_match_torch():
    network = build_network(MODELS["adam_mnist"])
    params = init_params(network, seed=14)
    tp = torch_params(network, params)
    images, labels = random_images(network, 8, seed=15)
    ctx = TrainingContext.allocate(network, 4)
    velocity = np.zeros_like(params)
    _train(
        network, params, velocity, ctx, images[:4], labels[:4], 4, 0.05, 0.9, 0.01, RULE_MOMENTUM
    )
    _train(
        network, params, velocity, ctx, images[4:], labels[4:], 4, 0.05, 0.9, 0.01, RULE_MOMENTUM
    )

    weights = [t for name, t in tp.items() if name.endswith(".weight")]
    biases = [t for name, t in tp.items() if name.endswith(".bias")]
    optimizer = torch.optim.SGD(
        [{"params": weights, "weight_decay": 0.01}, {"params": biases, "weight_decay": 0.0}],
        lr=0.05,
        momentum=0.9,
    )
    target = torch.tensor(labels.astype(np.int64))
    x = normalised(network, images)
    for step in range(2):
        optimizer.zero_grad()
        logits = torch_logits(network, tp, x[4 * step : 4 * step + 4])
        F.cross_entropy(logits, target[4 * step : 4 * step + 4]).backward()
        optimizer.step()

    assert_params_equal(network, params, tp)
    buffers = network.views(velocity)
    for spec in network.params:
        buffer = optimizer.state[tp[spec.name]]["momentum_buffer"].numpy()
        np.testing.assert_allclose(
            buffers[spec.name], buffer, rtol=1e-3, atol=1e-5, err_msg=f"velocity of {spec.name}"
        )


def test_per_example_sgd_with_weight_decay_matches_torch():
    """Batch 1 fuses the fully connected SGD step into the backward pass; it must equal torch."""
    network = build_network(MODELS["adam_mnist"])
    params = init_params(network, seed=16)
    tp = torch_params(network, params)
    images, labels = random_images(network, 3, seed=17)
    ctx = TrainingContext.allocate(network, 1)
    velocity = np.zeros_like(params)
    _train(network, params, velocity, ctx, images, labels, 1, 0.05, 0.0, 0.01, RULE_SGD)

    weights = [t for name, t in tp.items() if name.endswith(".weight")]
    biases = [t for name, t in tp.items() if name.endswith(".bias")]
    optimizer = torch.optim.SGD(
        [{"params": weights, "weight_decay": 0.01}, {"params": biases, "weight_decay": 0.0}],
        lr=0.05,
    )
    target = torch.tensor(labels.astype(np.int64))
    x = normalised(network, images)
    for step in range(3):
        optimizer.zero_grad()
        logits = torch_logits(network, tp, x[step : step + 1])
        F.cross_entropy(logits, target[step : step + 1]).backward()
        optimizer.step()
    assert_params_equal(network, params, tp)


@pytest.mark.parametrize("rule", [RULE_ADAM, RULE_ADAMW])
@pytest.mark.parametrize("name", ["adam_mnist", "avgpool_int_padding"])
def test_adam_and_adamw_steps_match_torch_optim(name, rule):
    """Three minibatches of 4 with Adam or AdamW (weight decay on weights only) equal
    ``torch.optim.Adam`` / ``AdamW`` step for step: parameters and both moments."""
    network = build_network(MODELS[name])
    params = init_params(network, seed=18)
    tp = torch_params(network, params)
    images, labels = random_images(network, 12, seed=19)
    ctx = TrainingContext.allocate(network, 4)
    velocity = np.zeros_like(params)
    lr, wd, betas, eps = 0.01, 0.05, (0.8, 0.99), 1e-6
    weights = [t for n, t in tp.items() if n.endswith(".weight")]
    biases = [t for n, t in tp.items() if n.endswith(".bias")]
    groups = [{"params": weights, "weight_decay": wd}, {"params": biases, "weight_decay": 0.0}]
    kind = torch.optim.Adam if rule == RULE_ADAM else torch.optim.AdamW
    optimizer = kind(groups, lr=lr, betas=betas, eps=eps)
    target = torch.tensor(labels.astype(np.int64))
    x = normalised(network, images)
    n = network.n_params
    for step in range(3):
        part = slice(4 * step, 4 * step + 4)
        ctx.train_chunk(
            network.ops,
            params,
            velocity,
            images[part],
            labels[part],
            np.arange(4, dtype=np.int64),
            0,
            4,
            batch=4,
            lr=lr,
            mu=betas[0],
            wd=wd,
            rule=rule,
            mean=MEAN,
            std=STD,
            update_every=1,
            beta2=betas[1],
            eps=eps,
        )
        optimizer.zero_grad()
        F.cross_entropy(torch_logits(network, tp, x[part]), target[part]).backward()
        optimizer.step()
        # Adam's step is about lr whatever the gradient's size, so a gradient that is float32
        # rounding noise in both engines (a few fc1 weights behind a barely active relu) moves
        # its weight by a different fraction of lr: within 1 % of one step, not of the weight.
        views = network.views(params)
        for spec in network.params:
            np.testing.assert_allclose(
                views[spec.name],
                tp[spec.name].detach().numpy(),
                rtol=RTOL,
                atol=lr / 100,
                err_msg=f"parameter {spec.name} after step {step + 1}",
            )
    assert_params_equal(network, params, tp, share=0.999)
    assert ctx.moments[2 * n] == 3  # the step count
    first, second = network.views(ctx.moments[:n]), network.views(ctx.moments[n : 2 * n])
    for spec in network.params:
        state = optimizer.state[tp[spec.name]]
        for ours, theirs in ((first, "exp_avg"), (second, "exp_avg_sq")):
            np.testing.assert_allclose(
                ours[spec.name],
                state[theirs].numpy(),
                rtol=1e-3,
                atol=1e-7,
                err_msg=f"{theirs} of {spec.name}",
            )
    assert not velocity.any()  # Adam's state is the worker's own, not the shared velocity
    assert not ctx.grad.any()


# Regression: the last fc layer's values against targets, PyTorch's MSELoss (mean over values).
REGRESSION = _model(
    [
        {"type": "conv", "maps": 4, "kernel": 3, "stride": 2, "padding": 1},
        {"type": "relu"},
        {"type": "avgpool", "size": 2},
        {"type": "fc", "units": 16},
        {"type": "tanh"},
        {"type": "fc", "units": 3},
        {"type": "mse"},
    ],
    input_shape=(2, 12, 12),
)


def regression_logits(network: Network, tp: dict, x):
    """The regression model in torch: its outputs (the engine's mse layer is the identity)."""
    x = torch.relu(F.conv2d(x, tp["conv1.weight"], tp["conv1.bias"], stride=2, padding=1))
    x = F.avg_pool2d(x, 2).flatten(1)
    x = torch.tanh(F.linear(x, tp["fc1.weight"], tp["fc1.bias"]))
    return F.linear(x, tp["fc2.weight"], tp["fc2.bias"])


def test_mse_regression_forward_and_backward_match_autograd():
    network = build_network(REGRESSION, 3)
    assert network.regression
    params = init_params(network, seed=20)
    rng = np.random.default_rng(21)
    x = rng.normal(0.0, 1.0, network.input_size).astype(np.float32)
    target = rng.normal(0.0, 1.0, 3).astype(np.float32)
    ops = network.ops.copy()
    ops[0, COL_NEED_DIN] = 1
    ctx = TrainingContext.allocate(network, 1)
    a, da, aux = ctx.act[0], ctx.dact[0], ctx.aux[0]
    a[: network.input_size] = x
    a[network.input_size : network.input_size + 3] = target  # the targets ride after the input
    forward(ops, params, a, aux, ctx.scratch, True)
    backward(ops, params, a, da, aux, ctx.scratch, ctx.grad, LABEL_DTYPE(0))  # mse: no class

    tp = torch_params(network, params)
    tx = torch.tensor(x).reshape(1, *network.input_shape).requires_grad_(True)
    out = regression_logits(network, tp, tx)
    F.mse_loss(out, torch.tensor(target)[None]).backward()
    at = int(network.ops[-1, COL_OUT])
    np.testing.assert_allclose(a[at : at + 3], out[0].detach().numpy(), rtol=RTOL, atol=ATOL)
    assert_grads_equal(network, ctx.grad, tp)
    np.testing.assert_allclose(
        da[: network.input_size], tx.grad.numpy().ravel(), rtol=RTOL, atol=ATOL
    )


@pytest.mark.parametrize("rule", [RULE_SGD, RULE_ADAM])
def test_mse_minibatches_match_torch(rule):
    """Two minibatches of 4 float rows (input, then targets, used as given) trained with SGD or
    Adam equal torch's steps on MSELoss; the summed loss is what torch's mean says."""
    network = build_network(REGRESSION, 3)
    params = init_params(network, seed=22)
    tp = torch_params(network, params)
    rng = np.random.default_rng(23)
    x = rng.normal(0.0, 1.0, (8, network.input_size)).astype(np.float32)
    y = rng.normal(0.0, 1.0, (8, 3)).astype(np.float32)
    rows = np.ascontiguousarray(np.concatenate([x, y], axis=1))
    labels = np.zeros(8, dtype=np.int32)
    ctx = TrainingContext.allocate(network, 4)
    velocity = np.zeros_like(params)
    kind = torch.optim.SGD if rule == RULE_SGD else torch.optim.Adam
    optimizer = kind(list(tp.values()), lr=0.01)
    xs = torch.tensor(x).reshape(-1, *network.input_shape)
    for step in range(2):
        part = slice(4 * step, 4 * step + 4)
        loss, correct = ctx.train_chunk(
            network.ops, params, velocity, rows[part], labels[part],
            np.arange(4, dtype=np.int64), 0, 4, batch=4, lr=0.01, mu=0.9, wd=0.0, rule=rule,
            mean=0.0, std=1.0 / 255.0, update_every=1,
        )  # fmt: skip
        optimizer.zero_grad()
        expected = F.mse_loss(regression_logits(network, tp, xs[part]), torch.tensor(y[part]))
        expected.backward()
        optimizer.step()
        assert loss == pytest.approx(4 * expected.item(), rel=1e-4) and correct == 0
    if rule == RULE_SGD:
        assert_params_equal(network, params, tp)
    else:  # Adam's step is about lr whatever the gradient: 1 % of a step (see above)
        for spec in network.params:
            np.testing.assert_allclose(
                network.views(params)[spec.name], tp[spec.name].detach().numpy(),
                rtol=RTOL, atol=1e-4, err_msg=spec.name,
            )  # fmt: skip
