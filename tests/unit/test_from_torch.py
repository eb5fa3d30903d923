"""PyTorch modules read by ``hogwild.from_torch``, checked against the modules themselves.

For four architectures (the bundled job's as an ``nn.Sequential``, pytorch/examples' MNIST CNN
as a module with its own ``forward``, an MLP, a CNN with stride-2 padded convolutions and
average pooling) the engine, given the module's weights as ``from_torch`` read them, computes
the module's class probabilities, and the gradients of the cross-entropy with respect to every
parameter (under the module's own names) and to the input, as torch autograd does (dropout off
in both). The names round-trip: the engine's weights load back with
``load_state_dict(strict=True)``. Unsupported layers and chains are refused naming the layer,
its position and what is supported.
"""

from __future__ import annotations

import numpy as np
import pytest

import hogwild
from bench.peers.examples_mnist import net as examples_mnist_net  # the one definition
from hogwild.config import load_config
from hogwild.errors import ConfigError
from hogwild.model.context import TrainingContext
from hogwild.model.loops import LABEL_DTYPE, deterministic_ops
from hogwild.model.network import COL_NEED_DIN, COL_OUT, build_network
from hogwild.model.passes import backward, forward
from hogwild.training.torch_bridge import state_dict_of

# it calls kernels tests.warm_kernels compiles: it runs once they are in numba's cache
pytestmark = pytest.mark.warmed_kernels

torch = pytest.importorskip("torch")
nn = torch.nn
F = nn.functional

RTOL = 1e-4
ATOL = 1e-5


def bundled_job_net() -> nn.Module:
    """The bundled job's model (hogwild/configs/adam_mnist.toml) written in PyTorch."""
    layers = []
    channels, features = 1, None
    for layer in load_config().model.layers:
        if layer.type == "conv":
            layers.append(nn.Conv2d(channels, layer.maps, layer.kernel, layer.stride))
            channels = layer.maps
        elif layer.type == "maxpool":
            layers.append(nn.MaxPool2d(layer.size, layer.stride))
        elif layer.type == "relu":
            layers.append(nn.ReLU())
        elif layer.type == "dropout":
            layers.append(nn.Dropout(layer.p))
        elif layer.type == "fc":
            if features is None:
                layers.append(nn.Flatten())
                features = channels * 4 * 4  # 28 -> 24 -> 12 -> 8 -> 4
            layers.append(nn.Linear(features, layer.units))
            features = layer.units
    return nn.Sequential(*layers)


def mlp() -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(64, 32),
        nn.Tanh(),
        nn.Linear(32, 16),
        nn.Sigmoid(),
        nn.Dropout(0.1),
        nn.Linear(16, 5),
    )


def stride2_avgpool_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 12, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AvgPool2d(2),
        nn.Flatten(),
        nn.Linear(12 * 4 * 4, 7),
    )


ARCHITECTURES = {
    "bundled_job": (bundled_job_net, (1, 28, 28)),
    "examples_mnist": (examples_mnist_net, (1, 28, 28)),
    "mlp": (mlp, (64,)),
    "stride2_avgpool": (stride2_avgpool_cnn, (3, 32, 32)),
}


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_engine_computes_what_the_module_computes(name):
    build, shape = ARCHITECTURES[name]
    torch.manual_seed(3)
    module = build().eval()  # dropout off, as in the engine's deterministic table below
    model = hogwild.from_torch(module, shape)
    network = build_network(model.model, model.n_classes)
    params = np.zeros(network.n_params, dtype=np.float32)
    for engine_name, view in network.views(params).items():
        view[...] = model.weights[engine_name]
    ops = deterministic_ops(network.ops)
    ops[0, COL_NEED_DIN] = 1
    ctx = TrainingContext.allocate(network, 1)
    a, da, aux = ctx.act[0], ctx.dact[0], ctx.aux[0]
    x = np.random.default_rng(4).normal(0.0, 1.0, network.input_size).astype(np.float32)
    a[: network.input_size] = x
    label = LABEL_DTYPE(model.n_classes - 1)  # the jobs' label type: one compiled backward
    forward(ops, params, a, aux, ctx.scratch, False)
    backward(ops, params, a, da, aux, ctx.scratch, ctx.grad, label)

    tx = torch.tensor(x).reshape(1, *shape).requires_grad_(True)
    # examples_mnist ends in log_softmax: cross-entropy and softmax of it are those of the
    # logits (log_softmax of a log_softmax is itself)
    logits = module(tx)
    F.cross_entropy(logits, torch.tensor([int(label)])).backward()
    at = int(network.ops[-1, COL_OUT])
    np.testing.assert_allclose(
        a[at : at + model.n_classes],
        torch.softmax(logits, 1)[0].detach().numpy(),
        rtol=RTOL,
        atol=ATOL,
    )
    grads = state_dict_of(network.views(ctx.grad), model.names)
    torch_params = dict(module.named_parameters())
    assert set(grads) == set(torch_params)
    for torch_name, parameter in torch_params.items():
        expected = parameter.grad.numpy()
        assert np.abs(expected).max() > 0, torch_name  # every check means something
        np.testing.assert_allclose(
            grads[torch_name], expected, rtol=RTOL, atol=ATOL, err_msg=torch_name
        )
    np.testing.assert_allclose(
        da[: network.input_size], tx.grad.numpy().ravel(), rtol=RTOL, atol=ATOL
    )


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_weights_round_trip_through_load_state_dict_strict(name):
    build, shape = ARCHITECTURES[name]
    torch.manual_seed(5)
    source = build()
    model = hogwild.from_torch(source, shape)
    torch.manual_seed(6)
    target = build()  # other weights, same names
    state = state_dict_of(model.weights, model.names)
    target.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value), key


def test_examples_net_reads_as_its_layers():
    model = hogwild.from_torch(examples_mnist_net(), (1, 28, 28))
    assert [layer.type for layer in model.model.layers] == [
        "conv", "relu", "conv", "relu", "maxpool", "dropout", "fc", "relu", "dropout", "fc",
        "softmax",
    ]  # fmt: skip
    assert model.model.layers[5].p == 0.25 and model.model.layers[8].p == 0.5
    assert model.names["fc1.weight"] == "fc1.weight" and model.n_classes == 10


def test_integer_padding_and_strides_are_kept():
    model = hogwild.from_torch(stride2_avgpool_cnn(), (3, 32, 32))
    conv = model.model.layers[0]
    assert (conv.kernel, conv.stride, conv.padding) == (3, 2, 1)
    assert model.model.layers[4].type == "avgpool"
    assert model.names["conv2.weight"] == "2.weight"


def test_an_unsupported_layer_is_named_with_its_position_and_the_supported_list():
    module = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(2704, 10))
    with pytest.raises(ConfigError) as info:
        hogwild.from_torch(module, (1, 28, 28))
    message = str(info.value)
    assert "layer 1 (BatchNorm2d '1')" in message
    for supported in ("Conv2d", "MaxPool2d", "AvgPool2d", "Flatten", "Linear", "ReLU", "Dropout"):
        assert supported in message


@pytest.mark.parametrize(
    ("module", "words"),
    [
        (nn.Sequential(nn.Conv2d(1, 4, 3, dilation=2), nn.Flatten(), nn.Linear(2304, 10)),
         "dilation"),
        (nn.Sequential(nn.Conv2d(1, 4, 3, bias=False), nn.Flatten(), nn.Linear(2704, 10)),
         "bias=False"),
        (nn.Sequential(nn.MaxPool2d(2, padding=1), nn.Flatten(), nn.Linear(225, 10)), "padding"),
        (nn.Sequential(nn.Flatten(), nn.Linear(784, 10), nn.ReLU()), "must end in a Linear"),
        (nn.Sequential(nn.Flatten(), nn.Linear(784, 10), nn.LogSoftmax(1), nn.ReLU()),
         "only a final softmax"),
    ],
)  # fmt: skip
def test_settings_the_engine_cannot_compute_are_refused(module, words):
    with pytest.raises(ConfigError, match=words):
        hogwild.from_torch(module, (1, 28, 28))


class Branching(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x):
        x = torch.flatten(x, 1)
        return self.fc(x) + x[:, :10]  # a skip connection: not a chain


def test_a_forward_that_is_not_a_chain_is_refused():
    with pytest.raises(ConfigError, match="not a plain chain|not supported"):
        hogwild.from_torch(Branching(), (1, 28, 28))


def test_shapes_that_do_not_fit_name_the_tensor():
    module = nn.Sequential(nn.Flatten(), nn.Linear(100, 10))
    with pytest.raises(
        ConfigError, match=r"1\.weight has shape \(10, 100\), the layer needs \(10, 784\)"
    ):
        hogwild.from_torch(module, (1, 28, 28))


def test_bad_input_shape_is_refused():
    with pytest.raises(ConfigError, match="input_shape"):
        hogwild.from_torch(mlp(), (1, 1, 8, 8))


def regression_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 2))


def test_regression_mlp_forward_and_gradients_match_mse_autograd():
    torch.manual_seed(7)
    module = regression_mlp()
    model = hogwild.from_torch(module, (6,), loss="mse")
    assert model.model.layers[-1].type == "mse"
    network = build_network(model.model, model.n_classes)
    params = np.zeros(network.n_params, dtype=np.float32)
    for engine_name, view in network.views(params).items():
        view[...] = model.weights[engine_name]
    ops = network.ops.copy()
    ops[0, COL_NEED_DIN] = 1
    ctx = TrainingContext.allocate(network, 1)
    a, da, aux = ctx.act[0], ctx.dact[0], ctx.aux[0]
    rng = np.random.default_rng(8)
    x, target = rng.normal(size=6).astype(np.float32), rng.normal(size=2).astype(np.float32)
    a[:6], a[6:8] = x, target  # the targets ride after the input
    forward(ops, params, a, aux, ctx.scratch, False)
    backward(ops, params, a, da, aux, ctx.scratch, ctx.grad, LABEL_DTYPE(0))  # mse: no class
    tx = torch.tensor(x)[None].requires_grad_(True)
    out = module(tx)
    F.mse_loss(out, torch.tensor(target)[None]).backward()
    at = int(network.ops[-1, COL_OUT])
    np.testing.assert_allclose(a[at : at + 2], out[0].detach().numpy(), rtol=RTOL, atol=ATOL)
    grads = state_dict_of(network.views(ctx.grad), model.names)
    for torch_name, parameter in module.named_parameters():
        np.testing.assert_allclose(
            grads[torch_name], parameter.grad.numpy(), rtol=RTOL, atol=ATOL, err_msg=torch_name
        )
    np.testing.assert_allclose(da[:6], tx.grad.numpy().ravel(), rtol=RTOL, atol=ATOL)


def test_a_regression_may_not_end_in_softmax():
    module = nn.Sequential(nn.Linear(6, 2), nn.LogSoftmax(1))
    with pytest.raises(ConfigError, match="loss='mse'"):
        hogwild.from_torch(module, (6,), loss="mse")
    with pytest.raises(ConfigError, match="loss must be one of cross_entropy, mse"):
        hogwild.from_torch(module, (6,), loss="l1")
