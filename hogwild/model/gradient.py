"""Loss and gradient of a range of examples, with no update: what a batch method's replica computes.

Batch methods (Sandblaster L-BFGS, DistBelief section 4.2) need the gradient of the summed loss
over many examples against parameters held fixed for the whole batch; the SGD engine
(:func:`hogwild.model.engine.train_chunk`) instead writes its updates into the weights as it goes.
:func:`gradient_range` runs the same forward and backward passes
(:mod:`hogwild.model.passes`) minibatch by minibatch, with the fully connected layers'
gradients accumulated like every other parameter's (``FC_ACCUMULATE``, the path the
finite-difference and PyTorch tests check), and never touches ``params``.

A line search compares losses across evaluations, so the objective must be deterministic:
:func:`deterministic_ops` turns dropout off (inference-mode forward, and a backward that does
not rescale by ``1 / (1 - p)``). Batch methods train the network without dropout.
"""

from __future__ import annotations

import numpy as np

from hogwild.jit import kernel
from hogwild.model.layer_kernels import cross_entropy
from hogwild.model.network import COL_OP, COL_OUT, COL_PERMILLE, OP_DROPOUT
from hogwild.model.passes import FC_ACCUMULATE, backward_batch, forward_batch, load_example

__all__ = ["deterministic_ops", "gradient_range"]


def deterministic_ops(ops: np.ndarray) -> np.ndarray:
    """A copy of the op table with every dropout layer's probability set to 0 (identity)."""
    out = ops.copy()
    out[out[:, COL_OP] == OP_DROPOUT, COL_PERMILLE] = 0
    return out


@kernel(cache=True, nogil=True)
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
    """Add the gradient of the summed loss over ``order[start:stop]`` to ``grad``.

    Args:
        ops: The op table (from :func:`deterministic_ops`).
        params: The parameters (read only).
        grad: float [n_params]: the gradient is added to it (zero it first for this range's
            own gradient).
        act, dact, aux, scratch, targets: A training context's buffers
            (:class:`hogwild.model.context.TrainingContext`); its batch sets the minibatch.
        images: uint8 [N, input_size]; labels: [N].
        order: Example indices; ``start``, ``stop``: the range of ``order`` to use.
        mean, std: Input normalisation.

    Returns:
        The summed cross-entropy of the examples (float64).
    """
    out_off = ops[ops.shape[0] - 1, COL_OUT]
    batch = act.shape[0]
    loss = 0.0
    pos = start
    while pos < stop:
        n = min(batch, stop - pos)
        for b in range(n):
            example = order[pos + b]
            load_example(images[example], act[b], mean, std)
            targets[b] = labels[example]
        forward_batch(ops, params, act, aux, scratch, n, False)
        for b in range(n):
            loss += cross_entropy(act[b], out_off, targets[b])
        backward_batch(
            ops, params, act, dact, aux, scratch, grad, targets, n, FC_ACCUMULATE, 0.0, 1.0
        )
        pos += n
    return loss
