"""The network plan: shapes, parameter layout and the op table the numba engine interprets.

:func:`build_network` walks the configured layer stack once, infers every layer's output shape,
rejects stacks whose shapes do not fit (naming the layer and the shapes), and lays out:

* the **parameters** of every layer in one flat float32 vector, each tensor starting on a 64-byte
  boundary, in PyTorch's layouts (convolution ``[out, in, kh, kw]``, fully connected
  ``[out, in]``) and under PyTorch's names (``conv1.weight``, ``fc2.bias``, ...), so checkpoints
  load into the equivalent ``torch.nn`` model as they are;
* the **activation blocks** of one example (block 0 is the input, block i+1 the output of layer i),
  which a training context allocates once per batch slot;
* the **op table**: one int64 row per layer that :mod:`hogwild.model.loops` dispatches on, so the
  loop over examples and layers runs inside numba rather than Python.

Adam's "connections" metric (section 4.1) is the multiply-accumulates of one forward pass through
the weighted layers: ``out_h * out_w * out_maps * in_maps * k * k`` for a convolution and
``in * out`` for a fully connected layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hogwild.config import LayerConfig, ModelConfig
from hogwild.errors import ConfigError
from hogwild.model.scratch_sizes import batch_scratch_size, packed_conv_weights_size

# Op codes of the engine.
OP_CONV, OP_MAXPOOL, OP_FC, OP_RELU, OP_TANH, OP_SIGMOID, OP_DROPOUT, OP_SOFTMAX = range(8)
OP_AVGPOOL = 8
OP_MSE = 9  # regression: identity forward, mean squared error against the row's targets
OP_CODES = {
    "mse": OP_MSE,
    "avgpool": OP_AVGPOOL,
    "conv": OP_CONV,
    "maxpool": OP_MAXPOOL,
    "fc": OP_FC,
    "relu": OP_RELU,
    "tanh": OP_TANH,
    "sigmoid": OP_SIGMOID,
    "dropout": OP_DROPOUT,
    "softmax": OP_SOFTMAX,
}

# Columns of an op-table row.
(
    COL_OP,
    COL_IN,  # offset of the input block (per example, in floats; a fused pool's: the relu's)
    COL_OUT,  # offset of the output block
    COL_W,  # offset of the weight tensor in the parameter vector (-1: none)
    COL_B,  # offset of the bias
    COL_C,  # input channels (fc: input size)
    COL_H,
    COL_W_IN,
    COL_O,  # output channels (fc: units)
    COL_HO,
    COL_WO,
    COL_K,  # kernel or pool size
    COL_STRIDE,
    COL_PAD,
    COL_NEED_DIN,  # 1 when the gradient with respect to the input is needed
    COL_PERMILLE,  # dropout probability in millionths
    COL_PACKED,  # conv: scratch offset of its packed weights (W, then W^T; W unused if direct)
    COL_WORK,  # offset in the scratch where the layers' working space begins (every row)
    COL_FUSED_RELU,  # relu: 1 when the max-pool after it does its work; max-pool: 1 when it does
) = range(19)
N_COLS = 19
ALIGN_FLOATS = 16  # 64 bytes of float32


@dataclass(frozen=True)
class ParamSpec:
    """One parameter tensor: PyTorch name, shape, offset in the flat vector, fan-in."""

    name: str
    shape: tuple[int, ...]
    offset: int
    fan_in: int
    fan_out: int
    is_bias: bool

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


@dataclass(frozen=True)
class LayerPlan:
    """One layer with its inferred shapes and its share of Adam's connection count."""

    index: int
    config: LayerConfig
    name: str
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    connections: int


@dataclass(frozen=True)
class Network:
    """A built network: layers, parameter layout, activation layout and the engine's op table."""

    layers: tuple[LayerPlan, ...]
    params: tuple[ParamSpec, ...]
    n_params: int  # length of the flat parameter vector (with alignment padding)
    # offset of each activation block within one example's slot (a fused relu's block, and its
    # gradient's, are never written: see fuse_relu_into_pools)
    act_offsets: tuple[int, ...]
    act_size: int  # floats of all activation blocks of one example
    weighted_dims: tuple  # per weighted layer: ("conv", C, O, Ho*Wo, K) or ("fc", n_in, n_out)
    ops: np.ndarray  # int64 [n_layers, N_COLS]
    input_shape: tuple[int, int, int]
    n_classes: int

    @property
    def connections(self) -> int:
        """Adam's connection count: multiply-accumulates of one forward pass."""
        return sum(layer.connections for layer in self.layers)

    def scratch_floats(self, batch: int) -> int:
        """Floats of per-worker scratch the kernels need for minibatches of ``batch``: the
        convolutions' packed weights, then the working space of one layer at a time."""
        work = int(self.ops[0, COL_WORK]) if len(self.ops) else 0
        return work + batch_scratch_size(self.weighted_dims, batch)

    @property
    def scratch_size(self) -> int:
        """Scratch for one example (what the single-example entry points need)."""
        return self.scratch_floats(1)

    @property
    def input_size(self) -> int:
        return int(np.prod(self.input_shape))

    @property
    def regression(self) -> bool:
        """Whether the model ends in mse: ``n_classes`` is then its number of target values,
        which a training row carries right after the input (``act[input_size:][:n_classes]``)."""
        return bool(len(self.ops)) and int(self.ops[-1, COL_OP]) == OP_MSE

    def param(self, name: str) -> ParamSpec:
        for spec in self.params:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def views(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Named views (no copies) of a flat parameter-shaped vector, in PyTorch layouts."""
        return {
            spec.name: flat[spec.offset : spec.offset + spec.size].reshape(spec.shape)
            for spec in self.params
        }

    def summary(self) -> str:
        """A table of the layers, their shapes and connections."""
        lines = [f"{'layer':<10} {'output':<14} {'connections':>12}"]
        for layer in self.layers:
            shape = "x".join(str(d) for d in layer.out_shape)
            lines.append(f"{layer.name:<10} {shape:<14} {layer.connections:>12,}")
        lines.append(f"{'total':<10} {'':<14} {self.connections:>12,}")
        return "\n".join(lines)


def conv_padding(layer: LayerConfig) -> int:
    """Zeros added on every side of a convolution's input: ``"valid"`` none, ``"same"``
    ``(kernel - 1) / 2`` (an odd kernel), an integer as PyTorch's ``Conv2d(padding=n)``."""
    if isinstance(layer.padding, int):
        return layer.padding
    return (layer.kernel - 1) // 2 if layer.padding == "same" else 0


def _align(n: int) -> int:
    return (n + ALIGN_FLOATS - 1) // ALIGN_FLOATS * ALIGN_FLOATS


def model_network(model: ModelConfig) -> Network:
    """The network of ``model`` alone, without data: as many classes as its last fully
    connected layer has units (10 if it has none, as ``build_network`` assumes)."""
    units = [layer.units for layer in model.layers if layer.type == "fc"]
    return build_network(model, units[-1] if units else 10)


def build_network(model: ModelConfig, n_classes: int = 10, fuse: bool = True) -> Network:
    """Infer shapes, lay out parameters and activations, and build the op table.

    ``fuse``: a relu directly followed by a max-pool is done by the pool
    (:func:`fuse_relu_into_pools`); ``False`` keeps every layer separate (the reference the
    fused table is tested against).

    Raises:
        ConfigError: a layer does not fit the shape it receives (the message names the layer,
            its settings and the shapes), or the last fully connected layer's units differ from
            the number of classes.
    """
    shape: tuple[int, ...] = tuple(model.input)
    layers: list[LayerPlan] = []
    params: list[ParamSpec] = []
    ops = np.zeros((len(model.layers), N_COLS), dtype=np.int64)
    act_offsets = [0]
    # A regression's targets ride in the input block, after the input (see target_offset).
    regression = bool(model.layers) and model.layers[-1].type == "mse"
    act_cursor = _align(int(np.prod(shape)) + (n_classes if regression else 0))
    weighted_dims: list[tuple] = []
    n_params = 0
    counts = {"conv": 0, "fc": 0}
    for index, layer in enumerate(model.layers):
        kind = layer.type
        where = f"model.layers[{index}] ({kind})"
        row = ops[index]
        row[COL_OP] = OP_CODES[kind]
        row[COL_W] = row[COL_B] = row[COL_PACKED] = -1
        row[COL_NEED_DIN] = 1 if index > 0 else 0
        connections = 0
        name = kind
        if kind == "conv":
            if len(shape) != 3:
                raise ConfigError(f"{where} needs a [maps, height, width] input, got {shape}")
            c, h, w = shape
            k, s = layer.kernel, layer.stride
            pad = conv_padding(layer)
            ho, wo = (h + 2 * pad - k) // s + 1, (w + 2 * pad - k) // s + 1
            if ho < 1 or wo < 1 or k > h + 2 * pad or k > w + 2 * pad:
                raise ConfigError(
                    f"{where}: a {k}x{k} kernel with padding {layer.padding!r} does not fit its "
                    f"input of shape {c}x{h}x{w}"
                )
            out: tuple[int, ...] = (layer.maps, ho, wo)
            counts["conv"] += 1
            name = f"conv{counts['conv']}"
            n_params = _add_params(params, name, (layer.maps, c, k, k), c * k * k, n_params, row)
            row[COL_C], row[COL_H], row[COL_W_IN] = c, h, w
            row[COL_O], row[COL_HO], row[COL_WO] = layer.maps, ho, wo
            row[COL_K], row[COL_STRIDE], row[COL_PAD] = k, s, pad
            connections = ho * wo * layer.maps * c * k * k
            weighted_dims.append(("conv", c, layer.maps, ho * wo, k))
        elif kind in ("maxpool", "avgpool"):
            if len(shape) != 3:
                raise ConfigError(f"{where} needs a [maps, height, width] input, got {shape}")
            c, h, w = shape
            size, s = layer.size, layer.stride
            if size > h or size > w:
                raise ConfigError(
                    f"{where}: a {size}x{size} pool does not fit its input of shape {c}x{h}x{w}"
                )
            ho, wo = (h - size) // s + 1, (w - size) // s + 1
            out = (c, ho, wo)
            row[COL_C], row[COL_H], row[COL_W_IN] = c, h, w
            row[COL_O], row[COL_HO], row[COL_WO] = c, ho, wo
            row[COL_K], row[COL_STRIDE] = size, s
        elif kind == "fc":
            n_in = int(np.prod(shape))
            out = (layer.units,)
            counts["fc"] += 1
            name = f"fc{counts['fc']}"
            n_params = _add_params(params, name, (layer.units, n_in), n_in, n_params, row)
            row[COL_C], row[COL_O] = n_in, layer.units
            connections = n_in * layer.units
            weighted_dims.append(("fc", n_in, layer.units))
        else:
            out = shape
            row[COL_C] = row[COL_O] = int(np.prod(shape))
            if kind == "dropout":
                row[COL_PERMILLE] = int(round(layer.p * 1_000_000))
            if kind == "mse":
                row[COL_K] = int(np.prod(model.input))  # where the targets are in the row
                if len(shape) != 1 or shape[0] != n_classes:
                    raise ConfigError(
                        f"{where}: mse needs a vector of {n_classes} predicted values (a final "
                        f"fc layer with units = {n_classes}), got shape {shape}"
                    )
            if kind == "softmax":
                if len(shape) != 1 or shape[0] != n_classes:
                    raise ConfigError(
                        f"{where}: softmax needs a vector of {n_classes} class scores (a final "
                        f"fc layer with units = {n_classes}), got shape {shape}"
                    )
        row[COL_IN] = act_offsets[-1]
        row[COL_OUT] = act_cursor
        act_offsets.append(act_cursor)
        act_cursor += _align(int(np.prod(out)))
        layers.append(LayerPlan(index, layer, name, tuple(shape), tuple(out), connections))
        shape = out
    packed_cursor = 0
    for row in ops:
        if row[COL_OP] == OP_CONV:
            row[COL_PACKED] = packed_cursor
            taps = int(row[COL_C] * row[COL_K] * row[COL_K])
            packed_cursor = _align(packed_cursor + packed_conv_weights_size(int(row[COL_O]), taps))
    ops[:, COL_WORK] = packed_cursor
    if fuse:
        fuse_relu_into_pools(ops)
    return Network(
        layers=tuple(layers),
        params=tuple(params),
        n_params=n_params,
        act_offsets=tuple(act_offsets),
        act_size=act_cursor,
        weighted_dims=tuple(weighted_dims),
        ops=ops,
        input_shape=tuple(model.input),
        n_classes=n_classes,
    )


def fuse_relu_into_pools(ops: np.ndarray) -> None:
    """Let each max-pool that follows a relu do the relu's work, in place in the op table.

    max and relu commute (the largest of a window's relu outputs is the relu of its largest
    input), so the pool reads the relu's input, takes the max with zero, and in the backward pass
    routes a gradient only from outputs above zero, straight into the relu's input gradient. The
    relu row stays in the table (its activation block too, unused) and is skipped. What it saves
    is one pass forward and one backward over the larger, unpooled block (Adam section 3.2.4's
    fused kernels): 5,760 floats an example at the default model's first convolution.

    A relu that is the first layer stays separate, so that the first row alone says whether the
    input's gradient is computed (``COL_NEED_DIN``).
    """
    for layer in range(1, len(ops) - 1):
        relu, pool = ops[layer], ops[layer + 1]
        if relu[COL_OP] == OP_RELU and pool[COL_OP] == OP_MAXPOOL:
            relu[COL_FUSED_RELU] = pool[COL_FUSED_RELU] = 1
            pool[COL_IN] = relu[COL_IN]


def _add_params(
    params: list[ParamSpec], name: str, shape: tuple[int, ...], fan_in: int, cursor: int, row
) -> int:
    fan_out = shape[0] * (int(np.prod(shape[2:])) if len(shape) == 4 else 1)
    weight = ParamSpec(f"{name}.weight", shape, cursor, fan_in, fan_out, False)
    cursor = _align(cursor + weight.size)
    bias = ParamSpec(f"{name}.bias", (shape[0],), cursor, fan_in, fan_out, True)
    cursor = _align(cursor + bias.size)
    params.extend([weight, bias])
    row[COL_W], row[COL_B] = weight.offset, bias.offset
    return cursor
