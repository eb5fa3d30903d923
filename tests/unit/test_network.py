"""The network plan of :func:`hogwild.model.network.build_network`.

Proves that the bundled Adam MNIST model has Adam's 756,000 connections and exactly as many
parameters as the equivalent PyTorch module, under the same names and shapes as that module's
``state_dict()`` (so checkpoints load into it); that parameter tensors start on 64-byte
boundaries and do not overlap; that ``views`` are named views, not copies; that the op table and
the activation layout agree with the inferred shapes (valid / same padding, strides, pools); and
that stacks whose shapes do not fit raise :class:`ConfigError` naming the layer and the shapes.
"""

from __future__ import annotations

import numpy as np
import pytest

from hogwild.config import config_from_dict, load_config
from hogwild.errors import ConfigError
from hogwild.model.gemm import packed_size
from hogwild.model.network import (
    ALIGN_FLOATS,
    COL_B,
    COL_C,
    COL_FUSED_RELU,
    COL_H,
    COL_HO,
    COL_IN,
    COL_K,
    COL_NEED_DIN,
    COL_O,
    COL_OP,
    COL_OUT,
    COL_PACKED,
    COL_PAD,
    COL_PERMILLE,
    COL_STRIDE,
    COL_W,
    COL_W_IN,
    COL_WO,
    COL_WORK,
    N_COLS,
    OP_CODES,
    build_network,
)

ADAM_NAMES_SHAPES = [
    ("conv1.weight", (10, 1, 5, 5)),
    ("conv1.bias", (10,)),
    ("conv2.weight", (20, 10, 5, 5)),
    ("conv2.bias", (20,)),
    ("fc1.weight", (400, 320)),
    ("fc1.bias", (400,)),
    ("fc2.weight", (400, 400)),
    ("fc2.bias", (400,)),
    ("fc3.weight", (10, 400)),
    ("fc3.bias", (10,)),
]


def model(input_shape, layers):
    return config_from_dict({"model": {"input": list(input_shape), "layers": layers}}).model


@pytest.fixture(scope="module")
def adam():
    return build_network(load_config().model.without_dropout())  # Adam's model


def test_adam_model_has_756000_connections(adam):
    assert adam.connections == 756_000
    per_layer = {layer.name: layer.connections for layer in adam.layers if layer.connections}
    assert per_layer == {
        "conv1": 24 * 24 * 10 * 1 * 25,
        "conv2": 8 * 8 * 20 * 10 * 25,
        "fc1": 320 * 400,
        "fc2": 400 * 400,
        "fc3": 400 * 10,
    }
    assert "756,000" in adam.summary()


def test_adam_model_shapes(adam):
    shapes = [layer.out_shape for layer in adam.layers]
    assert shapes == [
        (10, 24, 24),
        (10, 24, 24),
        (10, 12, 12),
        (20, 8, 8),
        (20, 8, 8),
        (20, 4, 4),
        (400,),
        (400,),
        (400,),
        (400,),
        (10,),
        (10,),
    ]
    assert adam.input_shape == (1, 28, 28) and adam.input_size == 784 and adam.n_classes == 10


def test_adam_params_names_shapes_and_count(adam):
    assert [(spec.name, spec.shape) for spec in adam.params] == ADAM_NAMES_SHAPES
    assert sum(spec.size for spec in adam.params) == 298_090
    assert adam.n_params >= 298_090
    assert adam.n_params % ALIGN_FLOATS == 0
    assert [spec.is_bias for spec in adam.params] == [False, True] * 5
    assert adam.param("fc2.weight").fan_in == 400 and adam.param("conv2.weight").fan_in == 250
    with pytest.raises(KeyError):
        adam.param("fc4.weight")


def _torch_adam_module():
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class AdamMnist(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 10, 5)
            self.conv2 = nn.Conv2d(10, 20, 5)
            self.fc1 = nn.Linear(320, 400)
            self.fc2 = nn.Linear(400, 400)
            self.fc3 = nn.Linear(400, 10)

    return torch, AdamMnist()


def test_params_match_torch_state_dict_and_load_strictly(adam):
    torch, module = _torch_adam_module()
    state = module.state_dict()
    assert [(name, tuple(t.shape)) for name, t in state.items()] == [
        (spec.name, spec.shape) for spec in adam.params
    ]
    assert sum(spec.size for spec in adam.params) == sum(p.numel() for p in module.parameters())
    flat = np.random.default_rng(0).normal(size=adam.n_params).astype(np.float32)
    module.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in adam.views(flat).items()})
    assert torch.equal(module.fc2.weight, torch.from_numpy(adam.views(flat)["fc2.weight"]))


def test_param_offsets_are_aligned_and_disjoint(adam):
    ends = 0
    for spec in adam.params:
        assert spec.offset % ALIGN_FLOATS == 0, spec
        assert spec.offset >= ends, f"{spec.name} overlaps the tensor before it"
        ends = spec.offset + spec.size
    assert ends <= adam.n_params


def test_views_are_views_in_pytorch_layout(adam):
    flat = np.arange(adam.n_params, dtype=np.float32)
    views = adam.views(flat)
    spec = adam.param("conv2.weight")
    w = views["conv2.weight"]
    assert w.shape == (20, 10, 5, 5)
    assert np.shares_memory(w, flat)
    # [out, in, kh, kw], row-major from the tensor's offset.
    assert w[3, 7, 2, 4] == spec.offset + ((3 * 10 + 7) * 5 + 2) * 5 + 4
    fc = views["fc1.weight"]
    assert fc[5, 9] == adam.param("fc1.weight").offset + 5 * 320 + 9
    views["fc3.bias"][:] = -1.0
    start = adam.param("fc3.bias").offset
    assert (flat[start : start + 10] == -1.0).all()


def test_op_table_of_adam_model(adam):
    ops = adam.ops
    assert ops.shape == (12, N_COLS) and ops.dtype == np.int64
    kinds = [layer.config.type for layer in adam.layers]
    assert list(ops[:, COL_OP]) == [OP_CODES[k] for k in kinds]
    assert list(ops[:, COL_NEED_DIN]) == [0] + [1] * 11
    conv2 = ops[3]
    assert list(
        conv2[[COL_C, COL_H, COL_W_IN, COL_O, COL_HO, COL_WO, COL_K, COL_STRIDE, COL_PAD]]
    ) == [10, 12, 12, 20, 8, 8, 5, 1, 0]
    assert conv2[COL_W] == adam.param("conv2.weight").offset
    assert conv2[COL_B] == adam.param("conv2.bias").offset
    pool = ops[2]
    assert list(pool[[COL_C, COL_H, COL_W_IN, COL_HO, COL_WO, COL_K, COL_STRIDE]]) == [
        10,
        24,
        24,
        12,
        12,
        2,
        2,
    ]
    fc1 = ops[6]
    assert fc1[COL_C] == 320 and fc1[COL_O] == 400
    unweighted = [i for i, k in enumerate(kinds) if k not in ("conv", "fc")]
    assert (ops[unweighted, COL_W] == -1).all() and (ops[unweighted, COL_B] == -1).all()
    assert ops[-1, COL_O] == 10


def test_each_relu_before_a_pool_is_fused_into_it(adam):
    """conv, relu, pool twice in Adam's model: each pool reads the convolution's output and
    does the relu; the relus after the fully connected layers stay layers of their own."""
    ops, kinds = adam.ops, [layer.config.type for layer in adam.layers]
    fused = [i for i in range(len(kinds)) if ops[i, COL_FUSED_RELU]]
    assert fused == [1, 2, 4, 5]
    assert [kinds[i] for i in fused] == ["relu", "maxpool"] * 2
    assert ops[2, COL_IN] == ops[0, COL_OUT] and ops[5, COL_IN] == ops[3, COL_OUT]
    assert kinds.count("relu") == 4
    expected = build_network(load_config().model.without_dropout(), fuse=False).ops.copy()
    assert not expected[:, COL_FUSED_RELU].any()
    expected[fused, COL_FUSED_RELU] = 1
    expected[[2, 5], COL_IN] = expected[[1, 4], COL_IN]
    np.testing.assert_array_equal(ops, expected)  # nothing else differs


def test_a_relu_as_the_first_layer_is_not_fused():
    """The first row alone says whether the input's gradient is computed."""
    layers = [{"type": "relu"}, {"type": "maxpool", "size": 2}, {"type": "fc", "units": 10}]
    net = build_network(model((2, 6, 6), [*layers, {"type": "softmax"}]))
    assert not net.ops[:, COL_FUSED_RELU].any()
    assert net.ops[1, COL_IN] == net.ops[0, COL_OUT]


def test_packed_convolution_weights_come_first_in_the_scratch_without_overlap(adam):
    ops = adam.ops
    convs = [i for i in range(len(ops)) if ops[i, COL_OP] == OP_CODES["conv"]]
    others = [i for i in range(len(ops)) if i not in convs]
    assert (ops[others, COL_PACKED] == -1).all()
    work = int(ops[0, COL_WORK])
    assert (ops[:, COL_WORK] == work).all()
    end = 0
    for i in convs:  # W, then W^T, each in panels of MR rows
        maps, taps = int(ops[i, COL_O]), int(ops[i, COL_C] * ops[i, COL_K] ** 2)
        assert ops[i, COL_PACKED] >= end
        end = int(ops[i, COL_PACKED]) + packed_size(maps, taps) + packed_size(taps, maps)
    assert end <= work
    assert adam.scratch_floats(32) >= work + 20 * 64 + 250 * 64  # conv2's rows and packed dY


def test_activation_layout_chains_blocks_without_overlap(adam):
    offsets = adam.act_offsets
    assert offsets[0] == 0 and len(offsets) == len(adam.layers) + 1
    sizes = [adam.input_size] + [int(np.prod(layer.out_shape)) for layer in adam.layers]
    for i in range(len(adam.layers)):
        fused_pool = adam.ops[i, COL_OP] == OP_CODES["maxpool"] and adam.ops[i, COL_FUSED_RELU]
        assert adam.ops[i, COL_IN] == offsets[i - 1 if fused_pool else i]  # the relu's input
        assert adam.ops[i, COL_OUT] == offsets[i + 1]
    for i in range(len(sizes)):
        assert offsets[i] % ALIGN_FLOATS == 0
        end = offsets[i] + sizes[i]
        assert end <= (offsets[i + 1] if i + 1 < len(offsets) else adam.act_size)
    assert adam.scratch_size >= 1


@pytest.mark.parametrize(
    ("hw", "kernel", "stride", "padding", "out_hw", "pad"),
    [
        (9, 3, 1, "valid", 7, 0),
        (9, 5, 1, "same", 9, 2),
        (9, 3, 2, "valid", 4, 0),
        (9, 5, 2, "same", 5, 2),
        (8, 3, 2, "same", 4, 1),
        (8, 5, 2, "valid", 2, 0),
    ],
)
def test_conv_output_shape_padding_and_connections(hw, kernel, stride, padding, out_hw, pad):
    layers = [
        {"type": "conv", "maps": 4, "kernel": kernel, "stride": stride, "padding": padding},
        {"type": "fc", "units": 10},
        {"type": "softmax"},
    ]
    net = build_network(model((3, hw, hw), layers))
    assert net.layers[0].out_shape == (4, out_hw, out_hw)
    assert net.ops[0, COL_PAD] == pad and net.ops[0, COL_STRIDE] == stride
    assert net.layers[0].connections == out_hw * out_hw * 4 * 3 * kernel * kernel
    assert net.param("conv1.weight").shape == (4, 3, kernel, kernel)
    assert net.param("fc1.weight").shape == (10, 4 * out_hw * out_hw)


def test_same_padding_keeps_the_spatial_size_at_stride_one():
    for kernel in (1, 3, 5, 7):
        layers = [
            {"type": "conv", "maps": 2, "kernel": kernel, "padding": "same"},
            {"type": "fc", "units": 10},
            {"type": "softmax"},
        ]
        net = build_network(model((1, 9, 9), layers))
        assert net.layers[0].out_shape == (2, 9, 9), kernel


def test_even_kernel_with_same_padding_keeps_the_size_or_is_rejected():
    """'same' must mean same: a 4x4 kernel may not silently shrink 8x8 to 7x7."""
    layers = [
        {"type": "conv", "maps": 2, "kernel": 4, "padding": "same"},
        {"type": "fc", "units": 10},
        {"type": "softmax"},
    ]
    try:
        net = build_network(model((1, 8, 8), layers))
    except ConfigError as exc:
        assert "model.layers[0] (conv)" in str(exc)
    else:
        assert net.layers[0].out_shape == (2, 8, 8)


@pytest.mark.parametrize(
    ("size", "stride", "out_hw"), [(2, 2, 4), (3, 2, 3), (3, 3, 2), (2, 1, 7), (8, 8, 1)]
)
def test_maxpool_output_shape(size, stride, out_hw):
    layers = [
        {"type": "maxpool", "size": size, "stride": stride},
        {"type": "fc", "units": 10},
        {"type": "softmax"},
    ]
    net = build_network(model((2, 8, 8), layers))
    assert net.layers[0].out_shape == (2, out_hw, out_hw)
    assert net.layers[0].connections == 0
    assert [spec.name for spec in net.params] == ["fc1.weight", "fc1.bias"]


def test_maxpool_stride_defaults_to_its_size():
    layers = [{"type": "maxpool", "size": 3}, {"type": "fc", "units": 10}, {"type": "softmax"}]
    net = build_network(model((1, 9, 9), layers))
    assert net.layers[0].out_shape == (1, 3, 3)


def test_dropout_probability_in_op_table_and_fc_flattens():
    layers = [
        {"type": "fc", "units": 12},
        {"type": "dropout", "p": 0.25},
        {"type": "fc", "units": 10},
        {"type": "softmax"},
    ]
    net = build_network(model((2, 3, 5), layers))
    assert net.ops[1, COL_PERMILLE] == 250_000
    assert net.param("fc1.weight").shape == (12, 30)
    assert net.connections == 30 * 12 + 12 * 10
    assert [layer.name for layer in net.layers] == ["fc1", "dropout", "fc2", "softmax"]


def test_n_classes_sets_the_softmax_width():
    layers = [{"type": "fc", "units": 4}, {"type": "softmax"}]
    net = build_network(model((1, 2, 2), layers), n_classes=4)
    assert net.n_classes == 4 and net.ops[-1, COL_O] == 4


def _error(input_shape, layers) -> str:
    with pytest.raises(ConfigError) as info:
        build_network(model(input_shape, layers))
    return str(info.value)


def test_kernel_larger_than_input_names_layer_and_shapes():
    msg = _error(
        (1, 3, 3),
        [
            {"type": "conv", "maps": 4, "kernel": 5},
            {"type": "fc", "units": 10},
            {"type": "softmax"},
        ],
    )
    assert "model.layers[0] (conv)" in msg
    assert "5x5" in msg and "1x3x3" in msg


def test_kernel_larger_than_input_after_other_layers():
    layers = [
        {"type": "conv", "maps": 3, "kernel": 3},
        {"type": "relu"},
        {"type": "maxpool", "size": 2},
        {"type": "conv", "maps": 4, "kernel": 5},
        {"type": "fc", "units": 10},
        {"type": "softmax"},
    ]
    msg = _error((1, 8, 8), layers)
    assert "model.layers[3] (conv)" in msg and "5x5" in msg and "3x3x3" in msg


def test_softmax_after_wrong_width_names_layer_and_shape():
    msg = _error((1, 4, 4), [{"type": "fc", "units": 7}, {"type": "softmax"}])
    assert "model.layers[1] (softmax)" in msg
    assert "10" in msg and "(7,)" in msg


def test_softmax_directly_on_a_map_is_rejected():
    msg = _error((10, 1, 1), [{"type": "softmax"}])
    assert "model.layers[0] (softmax)" in msg and "(10, 1, 1)" in msg


def test_maxpool_larger_than_input_names_layer_and_shapes():
    layers = [
        {"type": "conv", "maps": 4, "kernel": 3},
        {"type": "maxpool", "size": 3},
        {"type": "fc", "units": 10},
        {"type": "softmax"},
    ]
    msg = _error((1, 4, 4), layers)
    assert "model.layers[1] (maxpool)" in msg
    assert "3x3" in msg and "4x2x2" in msg


def test_conv_after_fc_names_layer_and_shape():
    layers = [
        {"type": "fc", "units": 8},
        {"type": "conv", "maps": 2, "kernel": 1},
        {"type": "fc", "units": 10},
        {"type": "softmax"},
    ]
    msg = _error((1, 4, 4), layers)
    assert "model.layers[1] (conv)" in msg and "(8,)" in msg


def test_maxpool_after_fc_names_layer_and_shape():
    layers = [
        {"type": "fc", "units": 8},
        {"type": "maxpool", "size": 2},
        {"type": "fc", "units": 10},
        {"type": "softmax"},
    ]
    msg = _error((1, 4, 4), layers)
    assert "model.layers[1] (maxpool)" in msg and "(8,)" in msg
