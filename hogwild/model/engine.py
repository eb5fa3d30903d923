"""The numba engine: forward, backward and whole chunks of training, driven by the op table.

One call of :func:`train_chunk` trains a worker through many minibatches without returning to
Python: for each minibatch it loads the examples into the worker's preallocated activation rows,
runs every layer forward and backward (dispatching on the op table built by
:func:`hogwild.model.network.build_network`), accumulates the gradient privately, and applies the
update to the shared parameters in place (:func:`hogwild.optim.rules.apply_update`). Nothing is
allocated inside the loop: the activations ``act``, their gradients ``dact`` and the int32 ``aux``
rows (max-pool arg-max, dropout masks) are ``[batch, act_size]`` arrays owned by the worker's
training context.
"""

from numba import njit

from hogwild.model.conv_kernels import conv_backward, conv_forward
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


@njit(cache=True, nogil=True)
def forward(ops, params, a, aux, scratch, training):
    """Run every layer forward on one example's activation row ``a``."""
    for layer in range(ops.shape[0]):
        r = ops[layer]
        op, x_off, y_off = r[COL_OP], r[COL_IN], r[COL_OUT]
        if op == OP_CONV:
            conv_forward(
                a,
                x_off,
                params,
                r[COL_W],
                r[COL_B],
                a,
                y_off,
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
        elif op == OP_MAXPOOL:
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


FC_ACCUMULATE, FC_DEFER, FC_SGD_IN_PLACE = 0, 1, 2


@njit(cache=True, nogil=True)
def backward(ops, params, a, da, aux, scratch, grad, label):
    """Backpropagate one example whose forward pass is in ``a``; accumulate into ``grad``.

    Every parameter's gradient ends up in ``grad`` (the reference path, checked against finite
    differences and PyTorch); training uses :func:`backward_for_training`.
    """
    backward_for_training(ops, params, a, da, aux, scratch, grad, label, FC_ACCUMULATE, 0.0)


@njit(cache=True, nogil=True)
def backward_for_training(ops, params, a, da, aux, scratch, grad, label, fc_mode, step):
    """Backpropagate one example; ``fc_mode`` says what happens to fully connected weights.

    ``FC_ACCUMULATE``: their gradient is added to ``grad`` like every other parameter's.
    ``FC_DEFER``: nothing; the minibatch's update is applied later from the activations and
    errors left in ``a``/``da`` (:func:`~hogwild.model.layer_kernels.fc_weight_update`).
    ``FC_SGD_IN_PLACE``: SGD with learning rate ``step`` is applied to each row as the backward
    pass streams it (batch 1).
    """
    for layer in range(ops.shape[0] - 1, -1, -1):
        r = ops[layer]
        op, x_off, y_off, need = r[COL_OP], r[COL_IN], r[COL_OUT], r[COL_NEED_DIN]
        if op == OP_SOFTMAX:
            softmax_xent_backward(a, y_off, label, da, x_off, r[COL_C])
        elif op == OP_CONV:
            conv_backward(
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
        elif not need:
            continue
        elif op == OP_MAXPOOL:
            n_in = r[COL_C] * r[COL_H] * r[COL_W_IN]
            n_out = r[COL_O] * r[COL_HO] * r[COL_WO]
            maxpool_backward(da, y_off, da, x_off, aux, y_off, n_in, n_out)
        elif op == OP_RELU or op == OP_TANH or op == OP_SIGMOID:
            activation_backward(op - OP_RELU, a, y_off, da, y_off, da, x_off, r[COL_C])
        elif op == OP_DROPOUT:
            dropout_backward(da, y_off, da, x_off, aux, y_off, r[COL_C], r[COL_PERMILLE] * 1e-6)


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
):
    """Train on ``order[start:stop]`` in minibatches of ``batch``, updating ``params`` in place.

    Per-example SGD without weight decay (Adam's setting) updates each fully connected row as
    the backward pass streams it; otherwise the fully connected weights are updated once per
    minibatch from its activations and errors. Convolution weights and all biases go through the
    private gradient vector ``grad``. Every update is a lock-free read-modify-write of the shared
    ``params`` (Hogwild).

    Returns:
        (summed loss, number classified correctly) over the examples, measured during training.
    """
    last = ops.shape[0] - 1
    out_off = ops[last, COL_OUT]
    n_classes = ops[last, COL_O]
    in_place = batch == 1 and rule == RULE_SGD and wd == 0.0
    fc_mode = FC_SGD_IN_PLACE if in_place else FC_DEFER
    loss = 0.0
    correct = 0
    pos = start
    while pos < stop:
        n = min(batch, stop - pos)
        for b in range(n):
            example = order[pos + b]
            a = act[b]
            load_example(images[example], a, mean, std)
            forward(ops, params, a, aux[b], scratch, True)
            label = labels[example]
            loss += cross_entropy(a, out_off, label)
            if argmax(a, out_off, n_classes) == label:
                correct += 1
            backward_for_training(
                ops, params, a, dact[b], aux[b], scratch, grad, label, fc_mode, lr
            )
        scale = 1.0 / n
        if not in_place:
            for layer in range(ops.shape[0]):
                if ops[layer, COL_OP] == OP_FC:
                    fc_weight_update(
                        act,
                        dact,
                        n,
                        ops[layer, COL_IN],
                        ops[layer, COL_OUT],
                        params,
                        ops[layer, COL_W],
                        velocity,
                        ops[layer, COL_C],
                        ops[layer, COL_O],
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
    loss = 0.0
    correct = 0
    a = act[0]
    for example in range(start, stop):
        load_example(images[example], a, mean, std)
        forward(ops, params, a, aux[0], scratch, False)
        label = labels[example]
        loss += cross_entropy(a, out_off, label)
        if argmax(a, out_off, n_classes) == label:
            correct += 1
    return loss, correct


@njit(cache=True, nogil=True)
def predict_batch(ops, params, act, aux, scratch, inputs, probabilities):
    """Class probabilities of already normalised float32 inputs ``[n, input_size]``."""
    last = ops.shape[0] - 1
    out_off = ops[last, COL_OUT]
    n_classes = ops[last, COL_O]
    a = act[0]
    for example in range(inputs.shape[0]):
        for i in range(inputs.shape[1]):
            a[i] = inputs[example, i]
        forward(ops, params, a, aux[0], scratch, False)
        for k in range(n_classes):
            probabilities[example, k] = a[out_off + k]
