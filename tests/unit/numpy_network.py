"""A network's loss for one example, written again in float64 numpy: the kernels' oracle.

:func:`loss` evaluates, layer by layer from the network's configuration (never from the
engine's op table or kernels), the cross-entropy of the softmax of one example's output, in
PyTorch's conventions (convolution weights ``[out, in, kh, kw]``, fully connected ``[out, in]``,
as :meth:`~hogwild.model.network.Network.views` lays them out; pooling windows inside the input,
no ceil mode). Its central differences in float64 are the gradient the engine's float32 backward
pass must return (:mod:`tests.unit.test_kernels_gradcheck`): an oracle that shares no code with
what it checks, and that compiles nothing. Dropout multiplies by a keep mask given from outside
(the engine draws it from its own generator) and divides by ``1 - p``.
"""

from __future__ import annotations

import numpy as np

from hogwild.model.network import Network, conv_padding


def loss(network: Network, params: np.ndarray, x: np.ndarray, label: int, masks: dict) -> float:
    """``-log softmax(output)[label]`` of the example ``x`` (flat, the network's input size).

    Args:
        network: The layers and the parameter layout.
        params: The flat parameter vector (float64; the engine's layout).
        x: One example's input values.
        label: Its class.
        masks: Per dropout layer's index, the keep mask (0 or 1) of its output units.
    """
    return float(-np.log(probabilities(network, params, x, masks)[label]))


def probabilities(network: Network, params: np.ndarray, x: np.ndarray, masks: dict) -> np.ndarray:
    """The softmax output of the example ``x`` (see :func:`loss`)."""
    views = network.views(np.asarray(params, dtype=np.float64))
    a = np.asarray(x, dtype=np.float64).reshape(network.input_shape)
    for layer in network.layers:
        cfg, kind = layer.config, layer.config.type
        if kind == "conv":
            weights, bias = views[f"{layer.name}.weight"], views[f"{layer.name}.bias"]
            a = _conv(a, weights, bias, cfg.stride, conv_padding(cfg))
        elif kind in ("maxpool", "avgpool"):
            a = _pool(a, cfg.size, cfg.stride, np.max if kind == "maxpool" else np.mean)
        elif kind == "fc":
            a = views[f"{layer.name}.weight"] @ a.ravel() + views[f"{layer.name}.bias"]
        elif kind == "relu":
            a = np.maximum(a, 0.0)
        elif kind == "tanh":
            a = np.tanh(a)
        elif kind == "sigmoid":
            a = 1.0 / (1.0 + np.exp(-a))
        elif kind == "dropout":
            a = a * masks[layer.index].reshape(a.shape) / (1.0 - cfg.p)
        elif kind == "softmax":
            z = np.exp(a - a.max())
            a = z / z.sum()
        else:
            raise ValueError(f"numpy_network: no reference for layer type {kind!r}")
        assert a.shape == tuple(layer.out_shape), (layer.name, a.shape, layer.out_shape)
    return a.ravel()


def _conv(x: np.ndarray, weights: np.ndarray, bias: np.ndarray, stride: int, pad: int):
    """``x`` [C, H, W] convolved (cross-correlated) with ``weights`` [O, C, K, K], plus bias."""
    x = np.pad(x, ((0, 0), (pad, pad), (pad, pad)))
    out_maps, _, k, _ = weights.shape
    ho = (x.shape[1] - k) // stride + 1
    wo = (x.shape[2] - k) // stride + 1
    y = np.zeros((out_maps, ho, wo))
    for ky in range(k):
        for kx in range(k):
            window = x[
                :,
                ky : ky + stride * (ho - 1) + 1 : stride,
                kx : kx + stride * (wo - 1) + 1 : stride,
            ]
            y += np.tensordot(weights[:, :, ky, kx], window, axes=(1, 0))
    return y + bias[:, None, None]


def _pool(x: np.ndarray, size: int, stride: int, reduce) -> np.ndarray:
    """Each ``size`` x ``size`` window of every map of ``x`` [C, H, W], ``stride`` apart."""
    ho = (x.shape[1] - size) // stride + 1
    wo = (x.shape[2] - size) // stride + 1
    windows = [
        x[:, ky : ky + stride * (ho - 1) + 1 : stride, kx : kx + stride * (wo - 1) + 1 : stride]
        for ky in range(size)
        for kx in range(size)
    ]
    return reduce(np.stack(windows), axis=0)
