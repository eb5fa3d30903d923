"""The numba engine: forward, backward and whole chunks of training, driven by the op table.

One call of :func:`train_chunk` trains a worker through many minibatches without returning to
Python: for each minibatch it loads the examples into the worker's preallocated activation rows
(``act[b]``, one per example), runs the layers forward and backward over the whole minibatch
(dispatching on the op table built by :func:`hogwild.model.network.build_network`), and applies
the update to the shared parameters in place. Convolutions and fully connected layers over
several examples are matrix products (:mod:`hogwild.model.batch_kernels`); the element-wise layers
and pooling run per example (:mod:`hogwild.model.layer_kernels`). Nothing is allocated inside the
loop: ``act``, ``dact`` (activation gradients), ``aux`` (max-pool arg-max, dropout masks), the
scratch and the private gradient vector belong to the worker's training context.
"""

import numpy as np
from numba import njit

from hogwild.model.batch_kernels import (
    conv_backward_batch,
    conv_forward_batch,
    fc_backward_batch,
    fc_forward_batch,
    fc_weight_update_batch,
)
from hogwild.model.layer_kernels import (
    activation_backward,
    activation_forward,
    argmax,
    cross_entropy,
    dropout_backward,
    dropout_forward,
    fc_backward,
    fc_backward_inputs,
    fc_backward_sgd_in_place,
    fc_forward,
    fc_weight_update,
    maxpool_backward,
    maxpool_forward,
    softmax_forward,
    softmax_xent_backward,
)
from hogwild.model.network import (
    COL_B,
    COL_C,
    COL_H,
    COL_HO,
    COL_IN,
    COL_K,
    COL_NEED_DIN,
    COL_O,
    COL_OP,
    COL_OUT,
    COL_PAD,
    COL_PERMILLE,
    COL_STRIDE,
    COL_W,
    COL_W_IN,
    COL_WO,
    OP_CONV,
    OP_DROPOUT,
    OP_FC,
    OP_MAXPOOL,
    OP_RELU,
    OP_SIGMOID,
    OP_SOFTMAX,
    OP_TANH,
)
from hogwild.optim.rules import RULE_MOMENTUM, RULE_SGD, apply_update


@njit(cache=True, nogil=True)
def load_example(image, a, mean, std):
    """Write one uint8 image into the input block (offset 0) as (x / 255 - mean) / std."""
    inv = 1.0 / (255.0 * std)
    shift = mean / std
    for i in range(image.shape[0]):
        a[i] = image[i] * inv - shift


FC_ACCUMULATE, FC_DEFER, FC_SGD_IN_PLACE = 0, 1, 2


@njit(cache=True, nogil=True)
def forward_batch(ops, params, act, aux, scratch, n, training):
    """Run every layer forward on the first ``n`` activation rows.

    The layers before the first fully connected one run one example at a time, so an example's
    convolution activations stay in the core's cache (Adam section 3.2.4: working sets that fit
    in L2); the fully connected layers then run over the whole minibatch as matrix products.
    """
    split = first_fc_layer(ops)
    if n > 1 and split > 0:
        for b in range(n):
            _forward_layers(
                ops, 0, split, params, act[b : b + 1], aux[b : b + 1], scratch, 1, training
            )
        _forward_layers(ops, split, ops.shape[0], params, act, aux, scratch, n, training)
    else:
        _forward_layers(ops, 0, ops.shape[0], params, act, aux, scratch, n, training)


@njit(cache=True, nogil=True)
def first_fc_layer(ops):
    """Index of the first fully connected layer (the number of layers if there is none)."""
    for layer in range(ops.shape[0]):
        if ops[layer, COL_OP] == OP_FC:
            return layer
    return ops.shape[0]


@njit(cache=True, nogil=True)
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
                scratch,
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
                act, n, x_off, y_off, params, r[COL_W], r[COL_B], scratch, r[COL_C], r[COL_O]
            )
        else:
            for b in range(n):
                _forward_one(r, params, act[b], aux[b], training)


@njit(cache=True, nogil=True)
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
        )
    elif op == OP_FC:
        fc_forward(a, x_off, params, r[COL_W], r[COL_B], a, y_off, r[COL_C], r[COL_O])
    elif op == OP_RELU or op == OP_TANH or op == OP_SIGMOID:
        activation_forward(op - OP_RELU, a, x_off, a, y_off, r[COL_C])
    elif op == OP_DROPOUT:
        dropout_forward(a, x_off, a, y_off, aux, r[COL_C], r[COL_PERMILLE] * 1e-6, training)
    elif op == OP_SOFTMAX:
        softmax_forward(a, x_off, a, y_off, r[COL_C])


@njit(cache=True, nogil=True)
def backward_batch(ops, params, act, dact, aux, scratch, grad, targets, n, fc_mode, step, decay):
    """Backpropagate the first ``n`` rows; ``fc_mode`` says what happens to fc weights.

    ``FC_ACCUMULATE``: their gradient is added to ``grad`` like every other parameter's (the
    reference path, checked against finite differences and PyTorch). ``FC_DEFER``: nothing; the
    minibatch's update is applied afterwards from the activations and errors left in
    ``act``/``dact``. ``FC_SGD_IN_PLACE``: SGD with learning rate ``step`` (and weight decay
    factor ``decay``) is applied to each row as the backward pass streams it (one example).
    Like :func:`forward_batch`, the layers before the first fully connected one run one example
    at a time.
    """
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
            )
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
        )


@njit(cache=True, nogil=True)
def _backward_layers(
    ops, first, last, params, act, dact, aux, scratch, grad, targets, n, fc_mode, step, decay
):
    """Layers ``last-1`` down to ``first`` backward over the first ``n`` rows."""
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
                params,
                r[COL_W],
                r[COL_B],
                grad,
                scratch,
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
                scratch,
                r[COL_C],
                r[COL_O],
                need,
            )
        else:
            for b in range(n):
                _backward_one(
                    r, params, act[b], dact[b], aux[b], grad, targets[b], fc_mode, step, decay
                )


@njit(cache=True, nogil=True)
def _backward_one(r, params, a, da, aux, grad, label, fc_mode, step, decay):
    op, x_off, y_off, need = r[COL_OP], r[COL_IN], r[COL_OUT], r[COL_NEED_DIN]
    if op == OP_SOFTMAX:
        softmax_xent_backward(a, y_off, label, da, x_off, r[COL_C])
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
        maxpool_backward(da, y_off, da, x_off, aux, y_off, n_in, n_out)
    elif op == OP_RELU or op == OP_TANH or op == OP_SIGMOID:
        activation_backward(op - OP_RELU, a, y_off, da, y_off, da, x_off, r[COL_C])
    elif op == OP_DROPOUT:
        dropout_backward(da, y_off, da, x_off, aux, y_off, r[COL_C], r[COL_PERMILLE] * 1e-6)


@njit(cache=True, nogil=True)
def forward(ops, params, a, aux, scratch, training):
    """Run every layer forward on one example's activation row ``a``."""
    size = a.shape[0]
    forward_batch(ops, params, a.reshape((1, size)), aux.reshape((1, size)), scratch, 1, training)


@njit(cache=True, nogil=True)
def backward(ops, params, a, da, aux, scratch, grad, label):
    """Backpropagate one example whose forward pass is in ``a``; every gradient into ``grad``."""
    size = a.shape[0]
    targets = np.full(1, label, dtype=np.int64)
    backward_batch(
        ops,
        params,
        a.reshape((1, size)),
        da.reshape((1, size)),
        aux.reshape((1, size)),
        scratch,
        grad,
        targets,
        1,
        FC_ACCUMULATE,
        0.0,
        1.0,
    )


@njit(cache=True, nogil=True)
def train_chunk(
    ops,
    params,
    velocity,
    grad,
    act,
    dact,
    aux,
    scratch,
    targets,
    images,
    labels,
    order,
    start,
    stop,
    batch,
    lr,
    mu,
    wd,
    rule,
    mean,
    std,
    update_every=1,
):
    """Train on ``order[start:stop]`` in minibatches of ``batch``, updating ``params`` in place.

    Per-example SGD (Adam's setting) updates each fully connected row as the backward pass
    streams it; otherwise the fully connected weights are updated once per
    minibatch from its activations and errors. Convolution weights and all biases go through the
    private gradient vector ``grad``. Every update is a lock-free read-modify-write of the shared
    ``params`` (Hogwild).

    ``update_every`` > 1 (batch 1 only) keeps per-example updates for the convolutions and biases
    but applies the fully connected weights' updates once every that many examples, from their
    activation and error vectors: two workers writing the same 1.15 MB of fully connected weights
    after every example spend most of their time moving cache lines between cores.

    Returns:
        (summed loss, number classified correctly) over the examples, measured during training.
    """
    if batch == 1 and update_every > 1:
        return _train_grouped(
            ops,
            params,
            velocity,
            grad,
            act,
            dact,
            aux,
            scratch,
            targets,
            images,
            labels,
            order,
            start,
            stop,
            lr,
            mu,
            wd,
            rule,
            mean,
            std,
            update_every,
        )
    last = ops.shape[0] - 1
    out_off = ops[last, COL_OUT]
    n_classes = ops[last, COL_O]
    in_place = batch == 1 and rule == RULE_SGD
    fc_mode = FC_SGD_IN_PLACE if in_place else FC_DEFER
    loss = 0.0
    correct = 0
    pos = start
    while pos < stop:
        n = min(batch, stop - pos)
        for b in range(n):
            example = order[pos + b]
            load_example(images[example], act[b], mean, std)
            targets[b] = labels[example]
        forward_batch(ops, params, act, aux, scratch, n, True)
        for b in range(n):
            loss += cross_entropy(act[b], out_off, targets[b])
            if argmax(act[b], out_off, n_classes) == targets[b]:
                correct += 1
        backward_batch(
            ops, params, act, dact, aux, scratch, grad, targets, n, fc_mode, lr, 1.0 - lr * wd
        )
        scale = 1.0 / n
        if not in_place:
            for layer in range(ops.shape[0]):
                r = ops[layer]
                if r[COL_OP] != OP_FC:
                    continue
                if n > 1:
                    fc_weight_update_batch(
                        act,
                        dact,
                        n,
                        r[COL_IN],
                        r[COL_OUT],
                        params,
                        r[COL_W],
                        velocity,
                        scratch,
                        r[COL_C],
                        r[COL_O],
                        lr,
                        scale,
                        mu,
                        wd,
                        rule == RULE_MOMENTUM,
                    )
                else:
                    fc_weight_update(
                        act,
                        dact,
                        n,
                        r[COL_IN],
                        r[COL_OUT],
                        params,
                        r[COL_W],
                        velocity,
                        r[COL_C],
                        r[COL_O],
                        lr,
                        scale,
                        mu,
                        wd,
                        rule == RULE_MOMENTUM,
                        scratch,
                    )
        apply_update(ops, params, velocity, grad, lr, scale, mu, wd, rule, False)
        pos += n
    return loss, correct


@njit(cache=True, nogil=True)
def evaluate_range(ops, params, act, aux, scratch, images, labels, start, stop, mean, std):
    """Summed loss and number correct of the examples ``start:stop``, without training."""
    last = ops.shape[0] - 1
    out_off = ops[last, COL_OUT]
    n_classes = ops[last, COL_O]
    batch = act.shape[0]
    loss = 0.0
    correct = 0
    for first in range(start, stop, batch):
        n = min(batch, stop - first)
        for b in range(n):
            load_example(images[first + b], act[b], mean, std)
        forward_batch(ops, params, act, aux, scratch, n, False)
        for b in range(n):
            label = labels[first + b]
            loss += cross_entropy(act[b], out_off, label)
            if argmax(act[b], out_off, n_classes) == label:
                correct += 1
    return loss, correct


@njit(cache=True, nogil=True)
def predict_batch(ops, params, act, aux, scratch, inputs, probabilities):
    """Class probabilities of already normalised float32 inputs ``[n, input_size]``."""
    last = ops.shape[0] - 1
    out_off = ops[last, COL_OUT]
    n_classes = ops[last, COL_O]
    batch = act.shape[0]
    for first in range(0, inputs.shape[0], batch):
        n = min(batch, inputs.shape[0] - first)
        for b in range(n):
            act[b, : inputs.shape[1]] = inputs[first + b]
        forward_batch(ops, params, act, aux, scratch, n, False)
        for b in range(n):
            for k in range(n_classes):
                probabilities[first + b, k] = act[b, out_off + k]


@njit(cache=True, nogil=True)
def _train_grouped(
    ops,
    params,
    velocity,
    grad,
    act,
    dact,
    aux,
    scratch,
    targets,
    images,
    labels,
    order,
    start,
    stop,
    lr,
    mu,
    wd,
    rule,
    mean,
    std,
    group,
):
    """Per-example training whose fully connected weight updates are applied every ``group``.

    Example j of a group lives in activation row j; its forward pass sees the fully connected
    weights as they were at the start of the group (staleness of at most ``group - 1`` examples,
    the local analogue of Adam's k-example accumulation before a push, section 3.2.6). The group's
    update is the sum of its per-example updates, with weight decay applied once per example.
    """
    last = ops.shape[0] - 1
    out_off = ops[last, COL_OUT]
    n_classes = ops[last, COL_O]
    momentum = rule == RULE_MOMENTUM
    loss = 0.0
    correct = 0
    j = 0
    for pos in range(start, stop):
        example = order[pos]
        load_example(images[example], act[j], mean, std)
        targets[j] = labels[example]
        forward_batch(ops, params, act[j : j + 1], aux[j : j + 1], scratch, 1, True)
        loss += cross_entropy(act[j], out_off, targets[j])
        if argmax(act[j], out_off, n_classes) == targets[j]:
            correct += 1
        backward_batch(
            ops,
            params,
            act[j : j + 1],
            dact[j : j + 1],
            aux[j : j + 1],
            scratch,
            grad,
            targets[j : j + 1],
            1,
            FC_DEFER,
            lr,
            1.0,
        )
        apply_update(ops, params, velocity, grad, lr, 1.0, mu, wd, rule, False)
        j += 1
        if j == group or pos == stop - 1:
            for layer in range(ops.shape[0]):
                r = ops[layer]
                if r[COL_OP] == OP_FC:
                    fc_weight_update_batch(
                        act,
                        dact,
                        j,
                        r[COL_IN],
                        r[COL_OUT],
                        params,
                        r[COL_W],
                        velocity,
                        scratch,
                        r[COL_C],
                        r[COL_O],
                        lr,
                        1.0,
                        mu,
                        wd * j,
                        momentum,
                    )
            j = 0
    return loss, correct
