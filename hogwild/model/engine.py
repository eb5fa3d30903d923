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

Labels come to :func:`train_chunk` and :func:`evaluate_range` as :data:`LABEL_DTYPE` from every
source (the arena, a data feed): numba compiles these two, and everything they call again in
their final optimisation, once per argument types, about 30 s on 2 cores for each label type.
"""

import numpy as np

from hogwild.jit import kernel
from hogwild.model.batch_kernels import fc_weight_update_batch
from hogwild.model.layer_kernels import argmax, cross_entropy, fc_weight_update
from hogwild.model.network import COL_C, COL_IN, COL_O, COL_OP, COL_OUT, COL_W, COL_WORK, OP_FC
from hogwild.model.passes import (
    FC_DEFER,
    FC_SGD_IN_PLACE,
    backward,
    backward_batch,
    forward,
    forward_batch,
    load_example,
)
from hogwild.model.update import apply_update
from hogwild.optim.rules import RULE_MOMENTUM, RULE_SGD

# int32: a feed's labels (and the data server's wire format) are int32, whatever the data set
LABEL_DTYPE = np.int32

__all__ = [
    "LABEL_DTYPE",
    "backward",
    "evaluate_range",
    "forward",
    "load_example",
    "predict_batch",
    "train_chunk",
]


@kernel(cache=True, nogil=True)
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
                        scratch[ops[0, COL_WORK] :],
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
                        scratch[ops[0, COL_WORK] :],
                    )
        apply_update(ops, params, velocity, grad, lr, scale, mu, wd, rule, False)
        pos += n
    return loss, correct


@kernel(cache=True, nogil=True)
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


@kernel(cache=True, nogil=True)
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


@kernel(cache=True, nogil=True)
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
                        scratch[ops[0, COL_WORK] :],
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
