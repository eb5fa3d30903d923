"""Update rules applied in place to the shared parameters, without locks (Adam section 3.2.2).

A worker accumulates the gradient of a minibatch (one example at Adam's batch size 1) in its
private gradient vector, then calls :func:`apply_update`, which walks the layers' weight and bias
ranges and, for each parameter, reads the shared value, writes the updated value back and clears
the private gradient in the same pass. Several workers doing this at once race on the shared
values; as in Hogwild and Adam, the updates are commutative sums and the races add only a little
noise, so no lock is taken.

Rules (``rule`` codes):

* ``RULE_SGD``: ``p -= lr * (g + wd * p)``
* ``RULE_MOMENTUM``: ``v = mu * v + g + wd * p; p -= lr * v``, with the velocity ``v`` shared in
  the arena like the weights (the optimizer state of the job, not of one worker).

Weight decay applies to weights only, never to biases.
"""

import numpy as np

from hogwild.model.jit import kernel
from hogwild.model.network import COL_B, COL_C, COL_K, COL_O, COL_OP, COL_W, OP_CONV

RULE_SGD = 0
RULE_MOMENTUM = 1
RULE_CODES = {"sgd": RULE_SGD, "momentum": RULE_MOMENTUM}


@kernel(cache=True, nogil=True, fastmath=True)
def _update_range(params, velocity, grad, start, stop, lr, scale, mu, wd, rule):
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


@kernel(cache=True, nogil=True)
def apply_update(ops, params, velocity, grad, lr, scale, mu, wd, rule, fc_weights):
    """Apply ``scale * grad`` to the layers' parameters with the chosen rule; zero ``grad``.

    With ``fc_weights`` false the fully connected weight matrices are left out: the training
    path updates them from activations and errors instead (``fc_weight_update``).
    """
    for layer in range(ops.shape[0]):
        w_off = ops[layer, COL_W]
        if w_off < 0:
            continue
        n_out = ops[layer, COL_O]
        if ops[layer, COL_OP] == OP_CONV:
            k = ops[layer, COL_K]
            n_weights = n_out * ops[layer, COL_C] * k * k
        elif fc_weights:
            n_weights = n_out * ops[layer, COL_C]
        else:
            n_weights = 0
        _update_range(params, velocity, grad, w_off, w_off + n_weights, lr, scale, mu, wd, rule)
        b_off = ops[layer, COL_B]
        _update_range(params, velocity, grad, b_off, b_off + n_out, lr, scale, mu, 0.0, rule)
