"""Update rules applied in place to the shared parameters, without locks (Adam section 3.2.2).

A worker accumulates the gradient of a minibatch (one example at Adam's batch size 1) in its
private gradient vector; then, for each layer's weight and bias range
(:func:`hogwild.model.update.apply_update` walks them), :func:`update_range` reads each shared
value, writes the updated value back and clears the private gradient in the same pass. Several
workers doing this at once race on the shared values; as in Hogwild and Adam, the updates are
commutative sums and the races add only a little noise, so no lock is taken.

Rules (``rule`` codes):

* ``RULE_SGD``: ``p -= lr * (g + wd * p)``
* ``RULE_MOMENTUM``: ``v = mu * v + g + wd * p; p -= lr * v``, with the velocity ``v`` shared in
  the arena like the weights (the optimizer state of the job, not of one worker).

* ``RULE_ADAM``: Adam (Kingma and Ba), as ``torch.optim.Adam``: ``g += wd * p``;
  ``m = b1 * m + (1 - b1) * g``; ``v = b2 * v + (1 - b2) * g * g``;
  ``p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)``;
* ``RULE_ADAMW``: the same with decoupled weight decay, as ``torch.optim.AdamW``:
  ``p *= 1 - lr * wd`` before the step, and ``g`` left as it is.

Weight decay applies to weights only, never to biases.

Adam's moments ``m`` and ``v`` and its step count ``t`` are a worker's own (its training
context's ``moments``: ``m`` then ``v``, each the length of the parameter vector, then ``t``), not
shared in the arena like the momentum's velocity: each is a running average of the worker's own
gradients, which estimates the same moments as the job's, and one worker is exactly
``torch.optim.Adam``. On one machine each worker's moments are its row of the job's arena, so the
checkpoints keep them and a resumed job continues them (:mod:`hogwild.training.moments`).
"""

import numpy as np

from hogwild.jit import kernel
from hogwild.optim.rule_codes import (
    ADAPTIVE_RULES,
    RULE_ADAM,
    RULE_ADAMW,
    RULE_CODES,
    RULE_MOMENTUM,
    RULE_SGD,
    moments_size,
)

__all__ = [
    "ADAPTIVE_RULES",
    "RULE_ADAM",
    "RULE_ADAMW",
    "RULE_CODES",
    "RULE_MOMENTUM",
    "RULE_SGD",
    "moments_size",
    "update_range",
]


@kernel(cache=True, nogil=True, fastmath=True)
def update_range(params, velocity, grad, start, stop, lr, scale, mu, wd, rule):
    """Apply ``scale * grad`` to ``params[start:stop]`` with ``rule``; zero that part of ``grad``.

    ``wd`` is the weight decay (0 for biases); ``velocity`` is read and written only by
    ``RULE_MOMENTUM``.
    """
    # Slices, so the loop index is non-negative and the loops vectorise.
    p = params[start:stop]
    g = grad[start:stop]
    lr, scale, mu, wd = np.float32(lr), np.float32(scale), np.float32(mu), np.float32(wd)
    if rule == RULE_SGD:
        for i in range(p.shape[0]):
            p[i] -= lr * (g[i] * scale + wd * p[i])
            g[i] = 0.0
    else:
        v = velocity[start:stop]
        for i in range(p.shape[0]):
            vi = mu * v[i] + g[i] * scale + wd * p[i]
            v[i] = vi
            p[i] -= lr * vi
            g[i] = 0.0


@kernel(cache=True, nogil=True, fastmath=True)
def adam_range(params, moments, grad, start, stop, lr, scale, beta1, beta2, eps, wd, decoupled):
    """One Adam (or, ``decoupled``, AdamW) step of ``params[start:stop]`` with ``scale * grad``;
    zero that part of ``grad``. ``moments`` holds ``m``, then ``v`` one parameter vector on
    (see the module's docstring); the step count, already advanced, is its last element."""
    n = grad.shape[0]
    t = moments[2 * n]
    p = params[start:stop]
    g = grad[start:stop]
    m = moments[start:stop]
    v = moments[n + start : n + stop]
    step = np.float32(lr / (1.0 - beta1**t))
    root2 = np.float32(np.sqrt(1.0 - beta2**t))
    b1, b2 = np.float32(beta1), np.float32(beta2)
    one = np.float32(1.0)
    scale, eps, wd = np.float32(scale), np.float32(eps), np.float32(wd)
    shrink = np.float32(1.0 - lr * wd) if decoupled else one
    l2 = np.float32(0.0) if decoupled else wd
    for i in range(p.shape[0]):
        pi = p[i] * shrink
        gi = g[i] * scale + l2 * p[i]
        mi = b1 * m[i] + (one - b1) * gi
        vi = b2 * v[i] + (one - b2) * gi * gi
        m[i] = mi
        v[i] = vi
        p[i] = pi - step * mi / (np.sqrt(vi) / root2 + eps)
        g[i] = 0.0
