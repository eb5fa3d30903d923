"""Forward and backward kernels of the non-convolution layers, for one example.

Max- and average pooling, fully connected, relu / tanh / sigmoid, dropout, softmax with
cross-entropy, and the mean squared error of a regression (its targets in the same row).
Every kernel addresses flat float32 rows through offsets (see :mod:`hogwild.model.network`).
Parameter gradients are accumulated into ``g`` (a minibatch sums over its examples); input
gradients are overwritten. Max-pooling records each output's arg-max, and dropout its mask, in the
int32 ``aux`` row at the layer's output offset, for the backward pass.

The fully connected weights are ``[out, in]`` (PyTorch's layout), read row by row in both
directions: forward is a dot product per row, backward streams each row once to update both the
input gradient and the weight gradient.
"""

import math

import numpy as np
from numba import uint64

from hogwild.jit import kernel


@kernel(cache=True, nogil=True, fastmath=True, error_model="numpy")
def maxpool_forward(x, x_off, y, y_off, aux, C, H, W, Ho, Wo, K, S, relu):
    """y[c, oy, ox] = max of the KxK window; aux keeps the flat input index of the maximum.

    ``relu``: the relu before the pool is fused into it (y = max(0, window's max), which is the
    max of the relu's outputs), so the relu's own pass over the larger input is not made.
    Ties go to the first maximum in reading order. The common 2x2, stride 2 window has its own
    loop: four loads and selects, no branch, and every index unsigned (a signed index is tested
    for negative wraparound at each load): several times faster than the loop it replaced
    (signed indices, a branch per comparison).
    """
    # Without the relu, the floor is the lowest finite float32, not -inf: fastmath assumes no
    # infinities, and a conv output below it is not a number any training survives.
    floor = np.float32(0.0) if relu else np.float32(-3.4028235e38)
    if K == 2 and S == 2:
        xs, ys, w = uint64(x_off), uint64(y_off), uint64(W)
        one, two = uint64(1), uint64(2)
        right, below, below_right = np.int32(1), np.int32(W), np.int32(W + 1)
        for c in range(uint64(C)):
            for oy in range(uint64(Ho)):
                top = (c * uint64(H) + two * oy) * w
                out = ys + (c * uint64(Ho) + oy) * uint64(Wo)
                for ox in range(uint64(Wo)):
                    i = top + two * ox
                    at = xs + i  # every index unsigned: no negative-index wraparound to test
                    v0, v1 = x[at], x[at + one]
                    v2, v3 = x[at + w], x[at + w + one]
                    upper_right = v1 > v0  # strict: a tie keeps the earlier input
                    upper = v1 if upper_right else v0
                    upper_at = right if upper_right else np.int32(0)
                    lower_right = v3 > v2
                    lower = v3 if lower_right else v2
                    lower_at = below_right if lower_right else below
                    take_lower = lower > upper
                    best = lower if take_lower else upper
                    y[out + ox] = max(best, floor)
                    aux[out + ox] = np.int32(i) + (lower_at if take_lower else upper_at)
        return
    for c in range(C):
        for oy in range(Ho):
            for ox in range(Wo):
                best = floor
                best_at = (c * H + oy * S) * W + ox * S  # a window's input, even if none wins
                for ky in range(K):
                    row = (c * H + oy * S + ky) * W + ox * S
                    for kx in range(K):
                        v = x[x_off + row + kx]
                        if v > best:
                            best = v
                            best_at = row + kx
                out = (c * Ho + oy) * Wo + ox
                y[y_off + out] = best
                aux[y_off + out] = best_at


@kernel(cache=True, nogil=True, fastmath=True, error_model="numpy")
def maxpool_backward(y, dy, y_off, dx, dx_off, aux, n_in, n_out, relu):
    """Route each output gradient to the input that won the max (``y``, ``dy`` and ``aux`` at
    the pool's output offset ``y_off``). ``relu``: the pool has the relu before it fused in
    (see :func:`maxpool_forward`), so only the outputs above zero pass their gradient on."""
    dxs = uint64(dx_off)
    for i in range(uint64(n_in)):
        dx[dxs + i] = 0.0
    if relu:  # the output gradient is the pool's alone: masked in place, in a vector loop
        zero, ys = np.float32(0.0), uint64(y_off)
        for j in range(uint64(n_out)):
            dy[ys + j] = dy[ys + j] if y[ys + j] > zero else zero
    for j in range(n_out):
        dx[dx_off + aux[y_off + j]] += dy[y_off + j]


@kernel(cache=True, nogil=True, fastmath=True, error_model="numpy")
def avgpool_forward(x, x_off, y, y_off, C, H, W, Ho, Wo, K, S):
    """y[c, oy, ox] = mean of the KxK window (PyTorch's ``AvgPool2d`` without padding)."""
    inv = np.float32(1.0 / (K * K))
    for c in range(C):
        for oy in range(Ho):
            for ox in range(Wo):
                acc = np.float32(0.0)
                for ky in range(K):
                    row = x_off + (c * H + oy * S + ky) * W + ox * S
                    for kx in range(K):
                        acc += x[row + kx]
                y[y_off + (c * Ho + oy) * Wo + ox] = acc * inv


@kernel(cache=True, nogil=True, fastmath=True, error_model="numpy")
def avgpool_backward(dy, dy_off, dx, dx_off, C, H, W, Ho, Wo, K, S):
    """Spread each output gradient evenly over its window (windows that overlap add up)."""
    inv = np.float32(1.0 / (K * K))
    for i in range(C * H * W):
        dx[dx_off + i] = 0.0
    for c in range(C):
        for oy in range(Ho):
            for ox in range(Wo):
                d = dy[dy_off + (c * Ho + oy) * Wo + ox] * inv
                for ky in range(K):
                    row = dx_off + (c * H + oy * S + ky) * W + ox * S
                    for kx in range(K):
                        dx[row + kx] += d


@kernel(cache=True, nogil=True, fastmath=True, error_model="numpy")
def fc_forward(x, x_off, w, w_off, b_off, y, y_off, n_in, n_out):
    """y = W x + b with W of shape [n_out, n_in]."""
    xs = x[x_off : x_off + n_in]
    for o in range(n_out):
        row = w[w_off + o * n_in : w_off + (o + 1) * n_in]
        acc = np.float32(0.0)
        for i in range(n_in):
            acc += row[i] * xs[i]
        y[y_off + o] = w[b_off + o] + acc


@kernel(cache=True, nogil=True, fastmath=True, error_model="numpy")
def fc_backward(x, x_off, w, w_off, b_off, dy, dy_off, dx, dx_off, g, n_in, n_out, need_dx):
    """Accumulate dL/dW = dy x^T and dL/db = dy into g; write dL/dx = W^T dy when needed."""
    xs = x[x_off : x_off + n_in]
    dxs = dx[dx_off : dx_off + n_in]
    if need_dx:
        dxs[:] = 0.0
    for o in range(n_out):
        d = dy[dy_off + o]
        g[b_off + o] += d
        if d == 0.0:
            continue  # relu zeroed this unit: its row contributes nothing
        row = w[w_off + o * n_in : w_off + (o + 1) * n_in]
        grow = g[w_off + o * n_in : w_off + (o + 1) * n_in]
        if need_dx:
            for i in range(n_in):
                dxs[i] += row[i] * d
        for i in range(n_in):
            grow[i] += d * xs[i]


@kernel(cache=True, nogil=True, fastmath=True, error_model="numpy")
def fc_backward_inputs(w, w_off, b_off, dy, dy_off, dx, dx_off, g, n_in, n_out, need_dx):
    """dL/dx = W^T dy and the bias gradient only; the weight update comes later."""
    dxs = dx[dx_off : dx_off + n_in]
    if need_dx:
        dxs[:] = 0.0
    for o in range(n_out):
        d = dy[dy_off + o]
        g[b_off + o] += d
        if d == 0.0 or not need_dx:
            continue
        row = w[w_off + o * n_in : w_off + (o + 1) * n_in]
        for i in range(n_in):
            dxs[i] += row[i] * d


@kernel(cache=True, nogil=True, fastmath=True, error_model="numpy")
def fc_backward_sgd_in_place(
    x, x_off, w, w_off, b_off, dy, dy_off, dx, dx_off, g, n_in, n_out, need_dx, step, decay
):
    """Backward of one example fused with its SGD step: ``W = decay * W - step * dy x^T``.

    Each row of W is streamed once: its old values feed dL/dx, then it is updated in place.
    ``decay`` is ``1 - lr * weight_decay``; without weight decay (1.0), rows whose output gradient
    is zero (a relu that was off) are not touched at all. The bias gradient still goes to ``g``,
    applied with the other small tensors.
    """
    xs = x[x_off : x_off + n_in]
    dxs = dx[dx_off : dx_off + n_in]
    if need_dx:
        dxs[:] = 0.0
    shrink = np.float32(decay)
    for o in range(n_out):
        d = dy[dy_off + o]
        g[b_off + o] += d
        row = w[w_off + o * n_in : w_off + (o + 1) * n_in]
        if d == 0.0:
            if shrink != 1.0:
                for i in range(n_in):
                    row[i] *= shrink
            continue
        delta = np.float32(-step * d)
        if need_dx:
            for i in range(n_in):
                old = row[i]
                dxs[i] += old * d
                row[i] = old * shrink + delta * xs[i]
        else:
            for i in range(n_in):
                row[i] = row[i] * shrink + delta * xs[i]


@kernel(cache=True, nogil=True, fastmath=True, error_model="numpy")
def fc_weight_update(
    act, dact, n, x_off, y_off, w, w_off, velocity, n_in, n_out, lr, scale, mu, wd, momentum, tmp
):
    """Apply a minibatch's fully connected weight update from its activations and errors.

    The gradient of W over n examples is ``sum_b dy_b x_b^T`` (Adam section 3.2.6 sends exactly
    these vectors to the parameter server instead of the M*N matrix). It is never materialised:
    each row is formed in ``tmp`` (or, for plain SGD, applied straight from the vectors) and
    written once, so a minibatch costs one pass over W instead of a gradient buffer's three.
    """
    for o in range(n_out):
        row = w[w_off + o * n_in : w_off + (o + 1) * n_in]
        if not momentum and wd == 0.0:
            for b in range(n):
                c = np.float32(-lr * scale * dact[b, y_off + o])
                if c != 0.0:
                    xs = act[b, x_off : x_off + n_in]
                    for i in range(n_in):
                        row[i] += c * xs[i]
            continue
        t = tmp[:n_in]
        t[:] = 0.0
        for b in range(n):
            d = np.float32(scale * dact[b, y_off + o])
            if d != 0.0:
                xs = act[b, x_off : x_off + n_in]
                for i in range(n_in):
                    t[i] += d * xs[i]
        if momentum:
            v = velocity[w_off + o * n_in : w_off + (o + 1) * n_in]
            for i in range(n_in):
                vi = mu * v[i] + t[i] + wd * row[i]
                v[i] = vi
                row[i] -= lr * vi
        else:
            for i in range(n_in):
                row[i] -= lr * (t[i] + wd * row[i])


@kernel(cache=True, nogil=True, fastmath=True, error_model="numpy")
def activation_forward(kind, x, x_off, y, y_off, n):
    """kind 0: relu, 1: tanh, 2: sigmoid.

    One loop per kind, so the relu loop has no branch in it and compiles to vector code.
    """
    if kind == 0:
        zero = np.float32(0.0)
        xs, ys = uint64(x_off), uint64(y_off)  # unsigned: no negative-index wraparound
        for i in range(uint64(n)):
            y[ys + i] = max(x[xs + i], zero)
    elif kind == 1:
        for i in range(n):
            y[y_off + i] = math.tanh(x[x_off + i])
    else:
        for i in range(n):
            y[y_off + i] = 1.0 / (1.0 + math.exp(-x[x_off + i]))


@kernel(cache=True, nogil=True, fastmath=True, error_model="numpy")
def activation_backward(kind, y, y_off, dy, dy_off, dx, dx_off, n):
    """The derivative from the activation's output: relu 1[y>0], tanh 1-y^2, sigmoid y(1-y)."""
    if kind == 0:
        zero = np.float32(0.0)
        ys, dys, dxs = uint64(y_off), uint64(dy_off), uint64(dx_off)
        for i in range(uint64(n)):
            dx[dxs + i] = dy[dys + i] if y[ys + i] > zero else zero
    elif kind == 1:
        for i in range(n):
            v = y[y_off + i]
            dx[dx_off + i] = dy[dy_off + i] * (1.0 - v * v)
    else:
        for i in range(n):
            v = y[y_off + i]
            dx[dx_off + i] = dy[dy_off + i] * v * (1.0 - v)


@kernel(cache=True, nogil=True, fastmath=True, error_model="numpy")
def dropout_forward(x, x_off, y, y_off, aux, n, p, training):
    """Inverted dropout: keep each unit with probability 1-p and scale it by 1/(1-p).

    One number drawn from numba's generator per call (one example through one layer) keys a
    counter-based hash (Wellons' lowbias32 of key + unit * golden ratio); a unit is kept when its
    32-bit hash is at least p * 2^32. The loop has no branch and no generator state to carry
    from unit to unit, so it compiles to vector code: drawing every unit from the generator and
    branching on it cost a noticeable share of a training step of the default job.
    """
    xs, ys = uint64(x_off), uint64(y_off)
    if not training or p == 0.0:
        for i in range(uint64(n)):
            y[ys + i] = x[xs + i]
            aux[ys + i] = 1
        return
    scale = 1.0 / (1.0 - p)
    drop_below = uint64(p * 4294967296.0)  # p < 1 (the config says so): below 2^32
    key = uint64(np.random.randint(0, 4294967296))
    low32 = uint64(0xFFFFFFFF)
    for i in range(uint64(n)):
        h = (key + i * uint64(0x9E3779B9)) & low32
        h ^= h >> uint64(16)
        h = (h * uint64(0x7FEB352D)) & low32
        h ^= h >> uint64(15)
        h = (h * uint64(0x846CA68B)) & low32
        h ^= h >> uint64(16)
        keep = h >= drop_below
        aux[ys + i] = np.int32(1) if keep else np.int32(0)
        y[ys + i] = x[xs + i] * scale if keep else 0.0


@kernel(cache=True, nogil=True, fastmath=True, error_model="numpy")
def dropout_backward(dy, dy_off, dx, dx_off, aux, aux_off, n, p):
    scale = 1.0 / (1.0 - p)
    for i in range(n):
        dx[dx_off + i] = dy[dy_off + i] * scale if aux[aux_off + i] else 0.0


@kernel(cache=True, nogil=True, fastmath=True, error_model="numpy")
def softmax_forward(x, x_off, y, y_off, n):
    """Numerically stable softmax of n class scores."""
    top = x[x_off]
    for i in range(1, n):
        if x[x_off + i] > top:
            top = x[x_off + i]
    total = 0.0
    for i in range(n):
        e = math.exp(x[x_off + i] - top)
        y[y_off + i] = e
        total += e
    for i in range(n):
        y[y_off + i] /= total


@kernel(cache=True, nogil=True, fastmath=True, error_model="numpy")
def softmax_xent_backward(y, y_off, label, dx, dx_off, n):
    """Gradient of cross-entropy through softmax: probabilities minus the one-hot label."""
    for i in range(n):
        dx[dx_off + i] = y[y_off + i]
    dx[dx_off + label] -= 1.0


@kernel(cache=True, nogil=True, fastmath=True, error_model="numpy")
def mse_backward(y, y_off, t_off, dx, dx_off, n):
    """Gradient of the mean squared error over ``n`` values (PyTorch's ``MSELoss``): the
    prediction ``y`` less the target ``t`` (``y``'s row at ``t_off``), times 2 / n."""
    scale = np.float32(2.0 / n)
    for i in range(n):
        dx[dx_off + i] = (y[y_off + i] - y[t_off + i]) * scale


@kernel(cache=True, nogil=True, fastmath=True, error_model="numpy")
def mean_squared_error(y, y_off, t_off, n):
    """The mean over ``n`` values of (prediction - target)^2, the targets at ``t_off``."""
    total = 0.0
    for i in range(n):
        d = y[y_off + i] - y[t_off + i]
        total += d * d
    return total / n


@kernel(cache=True, nogil=True, fastmath=True, error_model="numpy")
def cross_entropy(y, y_off, label):
    """-log p(label), floored so a zero probability gives a large finite loss."""
    p = y[y_off + label]
    return -math.log(p if p > 1e-30 else 1e-30)


@kernel(cache=True, nogil=True, fastmath=True, error_model="numpy")
def argmax(y, y_off, n):
    best = 0
    for i in range(1, n):
        if y[y_off + i] > y[y_off + best]:
            best = i
    return best
