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

Weight decay applies to weights only, never to biases.
"""

import numpy as np

from hogwild.jit import kernel

RULE_SGD = 0
RULE_MOMENTUM = 1
RULE_CODES = {"sgd": RULE_SGD, "momentum": RULE_MOMENTUM}


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
