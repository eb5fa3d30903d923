"""Forward and backward passes of a minibatch through the op table, inside numba.

:func:`forward_batch` and :func:`backward_batch` dispatch every layer of the op table built by
:func:`hogwild.model.network.build_network` over the first ``n`` activation rows (``act[b]``, one
per example): convolutions (directly for stride 1 without padding, else as matrix products) and
fully connected layers as matrix products (:mod:`hogwild.model.batch_kernels`,
:mod:`hogwild.model.conv_direct`), the element-wise layers and pooling per example
(:mod:`hogwild.model.layer_kernels`). :func:`forward` and :func:`backward` are the one-example
reference entry points that the finite-difference and PyTorch tests check.

Only :func:`forward_batch` and :func:`backward_batch` are kernels (the training and evaluation
loops call them, and a partition calls them from Python); the levels between them and the layers'
kernels (the loop over layers, the per-example dispatch, packing the convolutions' weights) are
inlined into them. numba optimises and emits every kernel together with everything it calls, so
each of those levels, as a kernel of its own, cost a compile of every layer kernel below it again.
"""

import numpy as np
from numba import njit

from hogwild.jit import kernel
from hogwild.model.batch_kernels import (
    conv_backward_batch,
    conv_forward_batch,
    fc_backward_batch,
    fc_forward_batch,
    pack_conv_weights,
)
from hogwild.model.conv_direct import conv_weight_grad, direct_applies
from hogwild.model.layer_kernels import (
    activation_backward,
    activation_forward,
    avgpool_backward,
    avgpool_forward,
    dropout_backward,
    dropout_forward,
    fc_backward,
    fc_backward_inputs,
    fc_backward_sgd_in_place,
    fc_forward,
    maxpool_backward,
    maxpool_forward,
    mse_backward,
    softmax_forward,
    softmax_xent_backward,
)
from hogwild.model.network import (
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
    OP_AVGPOOL,
    OP_CONV,
    OP_DROPOUT,
    OP_FC,
    OP_MAXPOOL,
    OP_MSE,
    OP_RELU,
    OP_SIGMOID,
    OP_SOFTMAX,
    OP_TANH,
)


@kernel(cache=True, nogil=True)
def load_example(image, a, mean, std):
    """Write one uint8 image into the input block (offset 0) as (x / 255 - mean) / std."""
    inv = 1.0 / (255.0 * std)
    shift = mean / std
    for i in range(image.shape[0]):
        a[i] = image[i] * inv - shift


@kernel(cache=True, nogil=True)
def load_stored_example(row, a, mean, std, floats):
    """Write one stored example into the input block like :func:`load_example`.

    ``row`` is a row of the stored examples as bytes (uint8): pixels, or, when ``floats``, the
    bytes of float32 values (:mod:`hogwild.data.arrays`; see :func:`stored_rows`). One type for
    both, so the training and evaluation loops that call this are compiled once, not once per
    stored type: each of them carries every layer's kernels, and a second compile of them for
    float32 rows costs as long as the first.
    """
    if floats:
        load_example(row.view(np.float32), a, mean, std)
    else:
        load_example(row, a, mean, std)


def stored_rows(images: np.ndarray) -> tuple[np.ndarray, bool]:
    """The stored examples as the loops take them: (uint8 rows, whether they hold float32s).

    ``images`` is a C-contiguous [n, row] array of uint8 pixels or float32 values; float32 rows
    are passed as their bytes (a view, no copy) and read back as float32 by
    :func:`load_stored_example`.
    """
    if images.ndim != 2:
        raise ValueError(
            f"images: expected a 2-dimensional [examples, values] array, got {images.ndim} "
            f"dimensions (shape {images.shape})"
        )
    if not images.flags.c_contiguous:
        raise ValueError(f"images: expected a C-contiguous array, got a strided {images.shape}")
    if images.dtype == np.uint8:
        return images, False
    if images.dtype == np.float32:
        return images.view(np.uint8), True
    raise ValueError(f"images: expected uint8 or float32 values, got {images.dtype}")


FC_ACCUMULATE, FC_DEFER, FC_SGD_IN_PLACE = 0, 1, 2


@kernel(cache=True, nogil=True)
def forward_batch(ops, params, act, aux, scratch, n, training):
    """Run every layer forward on the first ``n`` activation rows.

    The layers before the first fully connected one run one example at a time, so an example's
    convolution activations stay in the core's cache (Adam section 3.2.4: working sets that fit
    in L2); the fully connected layers then run over the whole minibatch as matrix products.
    The weights of the convolutions that are products are packed once, first, for all ``n``
    examples.
    """
    _pack_convolutions(ops, params, scratch, False)
    split = first_fc_layer(ops)
    if n > 1 and split > 0:
        for b in range(n):
            _forward_layers(
                ops, 0, split, params, act[b : b + 1], aux[b : b + 1], scratch, 1, training
            )
        _forward_layers(ops, split, ops.shape[0], params, act, aux, scratch, n, training)
    else:
        _forward_layers(ops, 0, ops.shape[0], params, act, aux, scratch, n, training)


@njit(inline="always")
def _pack_convolutions(ops, params, scratch, backward):
    """Pack every convolution's weights for the forward products (of those that are products:
    see :func:`hogwild.model.conv_direct.direct_applies`), or for the backward products of those
    whose input gradient is needed (:func:`pack_conv_weights`)."""
    for layer in range(ops.shape[0]):
        r = ops[layer]
        if r[COL_OP] != OP_CONV or (backward and not r[COL_NEED_DIN]):
            continue
        if not backward and direct_applies(r[COL_STRIDE], r[COL_PAD]):
            continue
        taps = r[COL_C] * r[COL_K] * r[COL_K]
        packed = scratch[r[COL_PACKED] : r[COL_WORK]]
        pack_conv_weights(params, r[COL_W], packed, r[COL_O], taps, backward)


@njit(inline="always")
def first_fc_layer(ops):
    """Index of the first fully connected layer (the number of layers if there is none)."""
    for layer in range(ops.shape[0]):
        if ops[layer, COL_OP] == OP_FC:
            return layer
    return ops.shape[0]


@njit(inline="always")
def _forward_layers(ops, first, last, params, act, aux, scratch, n, training):
    """Layers ``first:last`` forward over the first ``n`` rows of ``act``."""
    for layer in range(first, last):
        r = ops[layer]
        op, x_off, y_off = r[COL_OP], r[COL_IN], r[COL_OUT]
        if op == OP_CONV:
            conv_forward_batch(
                act,
                n,
                x_off,
                y_off,
                params,
                r[COL_W],
                r[COL_B],
                scratch[r[COL_PACKED] : r[COL_WORK]],
                scratch[r[COL_WORK] :],
                r[COL_C],
                r[COL_H],
                r[COL_W_IN],
                r[COL_O],
                r[COL_HO],
                r[COL_WO],
                r[COL_K],
                r[COL_STRIDE],
                r[COL_PAD],
            )
        elif op == OP_FC and n > 1:
            fc_forward_batch(
                act,
                n,
                x_off,
                y_off,
                params,
                r[COL_W],
                r[COL_B],
                scratch[r[COL_WORK] :],
                r[COL_C],
                r[COL_O],
            )
        else:
            for b in range(n):
                _forward_one(r, params, act[b], aux[b], training)


@njit(inline="always")
def _forward_one(r, params, a, aux, training):
    op, x_off, y_off = r[COL_OP], r[COL_IN], r[COL_OUT]
    if op == OP_MAXPOOL:
        maxpool_forward(
            a,
            x_off,
            a,
            y_off,
            aux,
            r[COL_C],
            r[COL_H],
            r[COL_W_IN],
            r[COL_HO],
            r[COL_WO],
            r[COL_K],
            r[COL_STRIDE],
            r[COL_FUSED_RELU],
        )
    elif op == OP_AVGPOOL:
        avgpool_forward(
            a,
            x_off,
            a,
            y_off,
            r[COL_C],
            r[COL_H],
            r[COL_W_IN],
            r[COL_HO],
            r[COL_WO],
            r[COL_K],
            r[COL_STRIDE],
        )
    elif op == OP_FC:
        fc_forward(a, x_off, params, r[COL_W], r[COL_B], a, y_off, r[COL_C], r[COL_O])
    elif (op == OP_RELU and not r[COL_FUSED_RELU]) or op == OP_TANH or op == OP_SIGMOID:
        activation_forward(op - OP_RELU, a, x_off, a, y_off, r[COL_C])
    elif op == OP_DROPOUT:
        dropout_forward(a, x_off, a, y_off, aux, r[COL_C], r[COL_PERMILLE] * 1e-6, training)
    elif op == OP_SOFTMAX:
        softmax_forward(a, x_off, a, y_off, r[COL_C])
    elif op == OP_MSE:
        for i in range(r[COL_C]):
            a[y_off + i] = a[x_off + i]


@kernel(cache=True, nogil=True)
def backward_batch(ops, params, act, dact, aux, scratch, grad, targets, n, fc_mode, step, decay):
    """Backpropagate the first ``n`` rows; ``fc_mode`` says what happens to fc weights.

    ``FC_ACCUMULATE``: their gradient is added to ``grad`` like every other parameter's (the
    reference path, checked against finite differences and PyTorch). ``FC_DEFER``: nothing; the
    minibatch's update is applied afterwards from the activations and errors left in
    ``act``/``dact``. ``FC_SGD_IN_PLACE``: SGD with learning rate ``step`` (and weight decay
    factor ``decay``) is applied to each row as the backward pass streams it (one example).
    Like :func:`forward_batch`, the layers before the first fully connected one run one example
    at a time, except the convolutions' directly computed weight gradients, which run afterwards
    over all ``n`` examples in cache-sized groups. The convolutions' weights are packed once,
    first, for all ``n`` examples.
    """
    _pack_convolutions(ops, params, scratch, True)
    split = first_fc_layer(ops)
    if n > 1 and split > 0:
        _backward_layers(
            ops,
            split,
            ops.shape[0],
            params,
            act,
            dact,
            aux,
            scratch,
            grad,
            targets,
            n,
            fc_mode,
            step,
            decay,
            False,
        )
        for b in range(n):
            _backward_layers(
                ops,
                0,
                split,
                params,
                act[b : b + 1],
                dact[b : b + 1],
                aux[b : b + 1],
                scratch,
                grad,
                targets[b : b + 1],
                1,
                fc_mode,
                step,
                decay,
                True,
            )
        _direct_conv_weight_grads(ops, split, act, dact, grad, n)
    else:
        _backward_layers(
            ops,
            0,
            ops.shape[0],
            params,
            act,
            dact,
            aux,
            scratch,
            grad,
            targets,
            n,
            fc_mode,
            step,
            decay,
            False,
        )


@njit(inline="always")
def _direct_conv_weight_grads(ops, last, act, dact, grad, n):
    """The weight gradients the per-example passes left (see :func:`_backward_layers`): those of
    the convolutions before layer ``last`` that :func:`conv_weight_grad` computes, over all
    ``n`` examples, which it takes in groups."""
    for layer in range(last):
        r = ops[layer]
        if r[COL_OP] == OP_CONV and direct_applies(r[COL_STRIDE], r[COL_PAD]):
            conv_weight_grad(
                act,
                dact,
                0,
                n,
                r[COL_IN],
                r[COL_OUT],
                grad,
                r[COL_W],
                r[COL_C],
                r[COL_H],
                r[COL_W_IN],
                r[COL_O],
                r[COL_HO],
                r[COL_WO],
                r[COL_K],
            )


@njit(inline="always")
def _backward_layers(
    ops,
    first,
    last,
    params,
    act,
    dact,
    aux,
    scratch,
    grad,
    targets,
    n,
    fc_mode,
    step,
    decay,
    direct_weights_later,
):
    """Layers ``last-1`` down to ``first`` backward over the first ``n`` rows.

    ``direct_weights_later``: leave the convolutions' directly computed weight gradients to the
    caller (:func:`_direct_conv_weight_grads`, over a larger group of examples).
    """
    for layer in range(last - 1, first - 1, -1):
        r = ops[layer]
        op, x_off, y_off, need = r[COL_OP], r[COL_IN], r[COL_OUT], r[COL_NEED_DIN]
        if op == OP_CONV:
            conv_backward_batch(
                act,
                dact,
                n,
                x_off,
                y_off,
                r[COL_W],
                r[COL_B],
                grad,
                scratch[r[COL_PACKED] : r[COL_WORK]],
                scratch[r[COL_WORK] :],
                r[COL_C],
                r[COL_H],
                r[COL_W_IN],
                r[COL_O],
                r[COL_HO],
                r[COL_WO],
                r[COL_K],
                r[COL_STRIDE],
                r[COL_PAD],
                need,
                direct_weights_later,
            )
        elif op == OP_FC and fc_mode == FC_DEFER and n > 1:
            fc_backward_batch(
                act,
                dact,
                n,
                x_off,
                y_off,
                params,
                r[COL_W],
                r[COL_B],
                grad,
                scratch[r[COL_WORK] :],
                r[COL_C],
                r[COL_O],
                need,
            )
        else:
            for b in range(n):
                _backward_one(
                    r, params, act[b], dact[b], aux[b], grad, targets[b], fc_mode, step, decay
                )


@njit(inline="always")
def _backward_one(r, params, a, da, aux, grad, label, fc_mode, step, decay):
    op, x_off, y_off, need = r[COL_OP], r[COL_IN], r[COL_OUT], r[COL_NEED_DIN]
    if op == OP_SOFTMAX:
        softmax_xent_backward(a, y_off, label, da, x_off, r[COL_C])
    elif op == OP_MSE:
        mse_backward(a, y_off, r[COL_K], da, x_off, r[COL_C])
    elif op == OP_FC:
        if fc_mode == FC_SGD_IN_PLACE:
            fc_backward_sgd_in_place(
                a,
                x_off,
                params,
                r[COL_W],
                r[COL_B],
                da,
                y_off,
                da,
                x_off,
                grad,
                r[COL_C],
                r[COL_O],
                need,
                step,
                decay,
            )
        elif fc_mode == FC_ACCUMULATE:
            fc_backward(
                a,
                x_off,
                params,
                r[COL_W],
                r[COL_B],
                da,
                y_off,
                da,
                x_off,
                grad,
                r[COL_C],
                r[COL_O],
                need,
            )
        else:
            fc_backward_inputs(
                params, r[COL_W], r[COL_B], da, y_off, da, x_off, grad, r[COL_C], r[COL_O], need
            )
    elif not need:
        return
    elif op == OP_MAXPOOL:
        n_in = r[COL_C] * r[COL_H] * r[COL_W_IN]
        n_out = r[COL_O] * r[COL_HO] * r[COL_WO]
        maxpool_backward(a, da, y_off, da, x_off, aux, n_in, n_out, r[COL_FUSED_RELU])
    elif op == OP_AVGPOOL:
        avgpool_backward(
            da,
            y_off,
            da,
            x_off,
            r[COL_C],
            r[COL_H],
            r[COL_W_IN],
            r[COL_HO],
            r[COL_WO],
            r[COL_K],
            r[COL_STRIDE],
        )
    elif (op == OP_RELU and not r[COL_FUSED_RELU]) or op == OP_TANH or op == OP_SIGMOID:
        activation_backward(op - OP_RELU, a, y_off, da, y_off, da, x_off, r[COL_C])
    elif op == OP_DROPOUT:
        dropout_backward(da, y_off, da, x_off, aux, y_off, r[COL_C], r[COL_PERMILLE] * 1e-6)


def forward(ops, params, a, aux, scratch, training):
    """Run every layer forward on one example's activation row ``a``.

    Python, not a kernel: it calls :func:`forward_batch` over a one-row view of ``a`` (a view
    whatever its strides, never a copy: the kernel writes into ``a`` itself), with the argument
    types a job's training step calls it with, so it runs the code a job compiled.
    Compiled itself, it would be a whole second compile of every layer's forward pass (numba
    optimises a kernel together with everything it calls), for each float type, for tests only.
    """
    forward_batch(ops, params, a[np.newaxis], aux[np.newaxis], scratch, 1, bool(training))


def backward(ops, params, a, da, aux, scratch, grad, label):
    """Backpropagate one example whose forward pass is in ``a``; every gradient into ``grad``.

    Python, like :func:`forward`: :func:`backward_batch` over one-row views, its targets an int64
    row as a job's are, whatever integer type ``label`` has.
    """
    targets = np.full(1, label, dtype=np.int64)
    backward_batch(
        ops,
        params,
        a[np.newaxis],
        da[np.newaxis],
        aux[np.newaxis],
        scratch,
        grad,
        targets,
        1,
        FC_ACCUMULATE,
        0.0,
        1.0,
    )
