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

from numba import njit

from hogwild.model.network import COL_B, COL_C, COL_K, COL_O, COL_OP, COL_W, OP_CONV

RULE_SGD = 0
RULE_MOMENTUM = 1
RULE_CODES = {"sgd": RULE_SGD, "momentum": RULE_MOMENTUM}


@njit(cache=True, nogil=True, inline="always")
def _update_range(params, velocity, grad, start, stop, lr, scale, mu, wd, rule):
    if rule == RULE_SGD:
        for i in range(start, stop):
            p = params[i]
            params[i] = p - lr * (grad[i] * scale + wd * p)
            grad[i] = 0.0
    else:
        for i in range(start, stop):
            p = params[i]
            v = mu * velocity[i] + grad[i] * scale + wd * p
            velocity[i] = v
            params[i] = p - lr * v
            grad[i] = 0.0


@njit(cache=True, nogil=True)
def apply_update(ops, params, velocity, grad, lr, scale, mu, wd, rule):
    """Apply ``scale * grad`` to every layer's parameters with the chosen rule; zero ``grad``."""
    for layer in range(ops.shape[0]):
        w_off = ops[layer, COL_W]
        if w_off < 0:
            continue
        n_out = ops[layer, COL_O]
        if ops[layer, COL_OP] == OP_CONV:
            k = ops[layer, COL_K]
            n_weights = n_out * ops[layer, COL_C] * k * k
        else:
            n_weights = n_out * ops[layer, COL_C]
        _update_range(params, velocity, grad, w_off, w_off + n_weights, lr, scale, mu, wd, rule)
        b_off = ops[layer, COL_B]
        _update_range(params, velocity, grad, b_off, b_off + n_out, lr, scale, mu, 0.0, rule)
