"""The loops over ranges of examples: train, take a gradient, evaluate, predict.

One call of :func:`train_chunk` trains a worker through many minibatches without returning to
Python: for each minibatch it loads the examples into the worker's preallocated activation rows
(``act[b]``, one per example), runs the layers forward and backward over the whole minibatch
(dispatching on the op table built by :func:`hogwild.model.network.build_network`), and applies
the update to the shared parameters in place. Convolutions and fully connected layers over
several examples are matrix products (:mod:`hogwild.model.batch_kernels`); the element-wise layers
and pooling run per example (:mod:`hogwild.model.layer_kernels`). Nothing is allocated inside the
loop: ``act``, ``dact`` (activation gradients), ``aux`` (max-pool arg-max, dropout masks), the
scratch and the private gradient vector belong to the worker's training context.

:func:`gradient_range` runs the same loop and step (:func:`_step`: load, forward, loss, backward)
with no update: what a batch method's replica computes (Sandblaster L-BFGS, DistBelief section
4.2), the gradient of the summed loss over many examples against parameters held fixed for the
whole batch, with the fully connected layers' gradients accumulated like every other parameter's
(``FC_ACCUMULATE``, the path the finite-difference and PyTorch tests check). A line search
compares losses across evaluations, so that objective must be deterministic:
:func:`deterministic_ops` turns dropout off (inference-mode forward, and a backward that does not
rescale by ``1 / (1 - p)``).

Labels come to :func:`train_chunk` and :func:`evaluate_range` as :data:`LABEL_DTYPE` from every
source (the arena, a data feed), and the stored examples as uint8 rows whatever their type (pixels,
or the bytes of float32 values with ``floats`` set: :func:`hogwild.model.passes.stored_rows`), so
numba compiles these two, and everything they call, for one set of types.
"""

import numpy as np
from numba import njit

from hogwild.data.labels import LABEL_DTYPE
from hogwild.jit import kernel
from hogwild.model.batch_kernels import fc_weight_update_batch
from hogwild.model.layer_kernels import (
    argmax,
    cross_entropy,
    fc_weight_update,
    mean_squared_error,
)
from hogwild.model.network import (
    COL_C,
    COL_IN,
    COL_K,
    COL_O,
    COL_OP,
    COL_OUT,
    COL_PERMILLE,
    COL_W,
    COL_WORK,
    OP_DROPOUT,
    OP_FC,
    OP_MSE,
)
from hogwild.model.passes import (
    FC_ACCUMULATE,
    FC_DEFER,
    FC_SGD_IN_PLACE,
    backward_batch,
    forward_batch,
    load_stored_example,
    stored_rows,
)
from hogwild.model.update import apply_adam, apply_update
from hogwild.optim.rule_codes import GRADIENT_ONLY
from hogwild.optim.rules import RULE_ADAM, RULE_ADAMW, RULE_MOMENTUM, RULE_SGD

__all__ = [
    "GRADIENT_ONLY",
    "LABEL_DTYPE",
    "NO_PROBABILITIES",
    "deterministic_ops",
    "evaluate_range",
    "gradient_range",
    "predict_batch",
    "train_chunk",
]


# Inlined into train_chunk, its one caller: as a kernel of its own it was a whole compile of every
# layer's kernels more, since numba optimises and emits a kernel together with all it calls
# (about a tenth of the training loop's cold compile).
@njit(inline="always")
def _step(
    ops,
    params,
    act,
    dact,
    aux,
    scratch,
    grad,
    targets,
    images,
    floats,
    labels,
    order,
    pos,
    n,
    training,
    fc_mode,
    lr,
    decay,
    mean,
    std,
    loss,
):
    """One minibatch, forward and backward: the examples ``order[pos:pos+n]`` in rows ``0:n``.

    ``images`` holds uint8 rows, pixels or (``floats``) float32 values' bytes
    (:func:`hogwild.model.passes.load_stored_example`). ``training`` selects the forward pass's
    mode (dropout on); ``fc_mode``, ``lr`` and ``decay``
    say what the backward pass does with the fully connected weights
    (:func:`hogwild.model.passes.backward_batch`). Every other gradient goes into ``grad``.

    ``loss`` is the running loss so far: each example's loss is added to it in turn, so a total
    over many steps is summed in example order whatever the minibatch size.

    Returns:
        (the running loss with the ``n`` examples' added, number of them classified correctly).
    """
    last = ops.shape[0] - 1
    out_off = ops[last, COL_OUT]
    n_classes = ops[last, COL_O]
    for b in range(n):
        example = order[pos + b]
        load_stored_example(images[example], act[b], mean, std, floats)
        targets[b] = labels[example]
    forward_batch(ops, params, act, aux, scratch, n, training)
    correct = 0
    regression = ops[last, COL_OP] == OP_MSE
    for b in range(n):
        if regression:  # the targets came with the input (load_example), after it
            loss += mean_squared_error(act[b], out_off, ops[last, COL_K], n_classes)
            continue
        loss += cross_entropy(act[b], out_off, targets[b])
        if argmax(act[b], out_off, n_classes) == targets[b]:
            correct += 1
    backward_batch(ops, params, act, dact, aux, scratch, grad, targets, n, fc_mode, lr, decay)
    return loss, correct


# Inlined into train_chunk, its one caller, like _step: a kernel of its own compiled the fully
# connected updates' matrix products once more.
@njit(inline="always")
def _update_fc_weights(
    ops, params, velocity, act, dact, scratch, n, lr, scale, mu, wd, momentum, batched
):
    """Update every fully connected layer's weights from the activations and errors of rows
    ``0:n`` (Adam section 3.2.6), as one matrix product when ``batched``, else row by row."""
    work = scratch[ops[0, COL_WORK] :]
    for layer in range(ops.shape[0]):
        r = ops[layer]
        if r[COL_OP] != OP_FC:
            continue
        if batched:
            fc_weight_update_batch(
                act,
                dact,
                n,
                r[COL_IN],
                r[COL_OUT],
                params,
                r[COL_W],
                velocity,
                work,
                r[COL_C],
                r[COL_O],
                lr,
                scale,
                mu,
                wd,
                momentum,
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
                momentum,
                work,
            )


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
    floats,
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
    update_every,
    moments,
    beta2,
    eps,
):
    """Train on ``order[start:stop]`` in minibatches of ``batch``, updating ``params`` in place.

    Per-example SGD (Adam's setting) updates each fully connected row as the backward pass
    streams it; otherwise the fully connected weights are updated once per
    minibatch from its activations and errors. Convolution weights and all biases go through the
    private gradient vector ``grad``. Every update is a lock-free read-modify-write of the shared
    ``params`` (Hogwild).

    ``update_every`` > 1 (batch 1 only) keeps per-example updates for the convolutions and biases
    but applies the fully connected weights' updates once every that many examples, from their
    activation and error vectors: two workers writing the same fully connected weights after
    every example spend most of their time moving cache lines between cores. Example ``j`` of
    such a group lives in activation row ``j``; its forward pass sees the fully connected weights
    as they were at the start of the group (staleness of at most ``update_every - 1`` examples,
    the local analogue of Adam's k-example accumulation before a push, section 3.2.6). The
    group's update is the sum of its per-example updates, with weight decay applied once per
    example.

    Adam and AdamW (``RULE_ADAM``, ``RULE_ADAMW``; ``mu`` is Adam's beta1) update every
    parameter, the fully connected weights too, from the minibatch's gradient with the worker's
    own ``moments`` (:mod:`hogwild.optim.rules`); ``update_every`` does not apply to them.

    :data:`GRADIENT_ONLY` updates nothing: every gradient, the fully connected weights' too, is
    added to ``grad`` (which is never cleared), with dropout in inference mode
    (:func:`gradient_range`).

    Returns:
        (summed loss, number classified correctly) over the examples, measured during training.
    """
    gradient_only = rule == GRADIENT_ONLY
    adam = rule == RULE_ADAM or rule == RULE_ADAMW
    grouped = batch == 1 and update_every > 1 and not adam and not gradient_only
    unit = update_every if grouped else batch
    momentum = rule == RULE_MOMENTUM
    in_place = batch == 1 and rule == RULE_SGD
    accumulate = adam or gradient_only
    fc_mode = FC_SGD_IN_PLACE if in_place else (FC_ACCUMULATE if accumulate else FC_DEFER)
    loss = 0.0
    correct = 0
    pos = start
    while pos < stop:
        n = min(unit, stop - pos)
        if grouped:
            for j in range(n):
                loss, step_correct = _step(
                    ops,
                    params,
                    act[j : j + 1],
                    dact[j : j + 1],
                    aux[j : j + 1],
                    scratch,
                    grad,
                    targets[j : j + 1],
                    images,
                    floats,
                    labels,
                    order,
                    pos + j,
                    1,
                    True,
                    FC_DEFER,
                    lr,
                    1.0,
                    mean,
                    std,
                    loss,
                )
                correct += step_correct
                apply_update(ops, params, velocity, grad, lr, 1.0, mu, wd, rule, False)
            _update_fc_weights(
                ops, params, velocity, act, dact, scratch, n, lr, 1.0, mu, wd * n, momentum, True
            )
        else:
            loss, step_correct = _step(
                ops,
                params,
                act,
                dact,
                aux,
                scratch,
                grad,
                targets,
                images,
                floats,
                labels,
                order,
                pos,
                n,
                not gradient_only,
                fc_mode,
                lr,
                1.0 - lr * wd,
                mean,
                std,
                loss,
            )
            correct += step_correct
            if gradient_only:
                pos += n
                continue
            scale = 1.0 / n
            if adam:
                apply_adam(
                    ops, params, moments, grad, lr, scale, mu, beta2, eps, wd, rule == RULE_ADAMW
                )
                pos += n
                continue
            if not in_place:
                _update_fc_weights(
                    ops, params, velocity, act, dact, scratch, n, lr, scale, mu, wd, momentum, n > 1
                )
            apply_update(ops, params, velocity, grad, lr, scale, mu, wd, rule, False)
        pos += n
    return loss, correct


@kernel(cache=True, nogil=True)
def evaluate_range(
    ops, params, act, aux, scratch, images, floats, labels, start, stop, mean, std, probabilities
):
    """Summed loss and number correct of the examples ``start:stop``, without training.

    ``probabilities``: float32 [stop - start, classes] receives the examples' class
    probabilities (:func:`predict_batch`), or [0, 0] for none.
    """
    last = ops.shape[0] - 1
    out_off = ops[last, COL_OUT]
    n_classes = ops[last, COL_O]
    batch = act.shape[0]
    keep = probabilities.shape[0] > 0
    loss = 0.0
    correct = 0
    for first in range(start, stop, batch):
        n = min(batch, stop - first)
        for b in range(n):
            load_stored_example(images[first + b], act[b], mean, std, floats)
        forward_batch(ops, params, act, aux, scratch, n, False)
        for b in range(n):
            if keep:
                for k in range(n_classes):
                    probabilities[first - start + b, k] = act[b, out_off + k]
            if ops[last, COL_OP] == OP_MSE:
                loss += mean_squared_error(act[b], out_off, ops[last, COL_K], n_classes)
                continue
            label = labels[first + b]
            loss += cross_entropy(act[b], out_off, label)
            if argmax(act[b], out_off, n_classes) == label:
                correct += 1
    return loss, correct


NO_PROBABILITIES = np.zeros((0, 0), np.float32)  # evaluate_range's argument when none are wanted


def predict_batch(ops, params, act, aux, scratch, inputs, probabilities):
    """Class probabilities of already normalised float32 inputs ``[n, input_size]``.

    :func:`evaluate_range` over the inputs as float32 rows taken as given (its loss is of no
    use here): the evaluation loop, not a loop of its own (each kernel that calls the layers'
    kernels costs their whole compile again).
    """
    n_classes = int(ops[-1, COL_O])
    if (
        probabilities.shape != (len(inputs), n_classes)
        or probabilities.dtype != np.float32
        or not probabilities.flags.c_contiguous
    ):
        # the kernel writes [examples, classes] float32 unchecked: a smaller array is an
        # out-of-bounds write, another type a second compile of the evaluation loop
        raise ValueError(
            f"probabilities: expected a C-contiguous float32 [{len(inputs)}, {n_classes}] array, "
            f"got {probabilities.dtype} {probabilities.shape}"
            f"{'' if probabilities.flags.c_contiguous else ' (strided)'}"
        )
    rows, floats = stored_rows(np.ascontiguousarray(inputs, dtype=np.float32))
    mean, std = 0.0, 1.0 / 255.0  # x * 1 - 0: the values as given (hogwild.data.arrays)
    labels = np.zeros(len(inputs), LABEL_DTYPE)
    evaluate_range(
        ops, params, act, aux, scratch, rows, floats, labels, 0, len(inputs), mean, std,
        probabilities,
    )  # fmt: skip


def deterministic_ops(ops: np.ndarray) -> np.ndarray:
    """A copy of the op table with every dropout layer's probability set to 0 (identity)."""
    out = ops.copy()
    out[out[:, COL_OP] == OP_DROPOUT, COL_PERMILLE] = 0
    return out


def gradient_range(
    ops,
    params,
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
    mean,
    std,
):
    """Add the gradient of the summed loss over ``order[start:stop]`` to ``grad``; no update.

    :func:`train_chunk` with the rule :data:`GRADIENT_ONLY`, in minibatches of the context's batch:
    the training loop, not a loop of its own (each kernel that calls the layers' kernels costs
    their whole compile again).

    Args:
        ops: The op table (from :func:`deterministic_ops`).
        params: The parameters (read only).
        grad: float [n_params]: the gradient is added to it (zero it first for this range's
            own gradient).
        act, dact, aux, scratch, targets: A training context's buffers
            (:class:`hogwild.model.context.TrainingContext`); its batch sets the minibatch.
        images: uint8 or float32 [N, input_size] (:func:`hogwild.model.passes.stored_rows`);
            labels: [N].
        order: Example indices; ``start``, ``stop``: the range of ``order`` to use.
        mean, std: Input normalisation, as :func:`hogwild.data.arrays.input_normalisation`
            gives it for the images' type: for float32 rows (0, 1/255), which takes the values
            as given; any other pair scales them as if they were pixels.

    Returns:
        The summed cross-entropy of the examples (float64).
    """
    rows, floats = stored_rows(images)
    loss, _ = train_chunk(
        ops,
        params,
        grad,
        grad,
        act,
        dact,
        aux,
        scratch,
        targets,
        rows,
        floats,
        labels,
        order,
        start,
        stop,
        act.shape[0],
        0.0,
        0.0,
        0.0,
        GRADIENT_ONLY,
        float(mean),
        float(std),
        1,
        grad,
        0.0,
        0.0,
    )  # fmt: skip  (velocity and moments: unused by this rule; grad stands in, of their type)
    return loss
