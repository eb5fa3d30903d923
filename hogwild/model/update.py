"""A whole update of the model: the rule applied to every layer's weight and bias ranges.

The model's op table says where each layer's weights and biases lie in the parameter vector;
:func:`apply_update` walks it and hands each range to the update rule
(:func:`hogwild.optim.rules.update_range`), which knows nothing of layers.
"""

from hogwild.jit import kernel
from hogwild.model.network import COL_B, COL_C, COL_K, COL_O, COL_OP, COL_W, OP_CONV
from hogwild.optim.rules import adam_range, update_range

__all__ = ["apply_adam", "apply_update"]


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
        update_range(params, velocity, grad, w_off, w_off + n_weights, lr, scale, mu, wd, rule)
        b_off = ops[layer, COL_B]
        update_range(params, velocity, grad, b_off, b_off + n_out, lr, scale, mu, 0.0, rule)


@kernel(cache=True, nogil=True)
def apply_adam(ops, params, moments, grad, lr, scale, beta1, beta2, eps, wd, decoupled):
    """One Adam (AdamW if ``decoupled``) step of every layer's parameters, the fully connected
    weights included, from ``scale * grad``; zero ``grad``. Advances the step count kept at the
    end of ``moments`` (:func:`hogwild.optim.rules.adam_range`)."""
    n = grad.shape[0]
    moments[2 * n] += 1.0
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
        adam_range(
            params,
            moments,
            grad,
            w_off,
            w_off + n_weights,
            lr,
            scale,
            beta1,
            beta2,
            eps,
            wd,
            decoupled,
        )
        b_off = ops[layer, COL_B]
        adam_range(
            params,
            moments,
            grad,
            b_off,
            b_off + n_out,
            lr,
            scale,
            beta1,
            beta2,
            eps,
            0.0,
            decoupled,
        )
