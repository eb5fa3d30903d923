"""Layers over a whole minibatch at once, as matrix products through BLAS (sgemm).

A convolution is one product per example and direction (the engine hands it one example at a
time, so the example's activations stay in cache; a group of examples in one product was measured
slower here). The forward product unfolds the input into columns (``col[(c, ky, kx), (oy, ox)]``,
"im2col", with zero padding and any stride), then ``Y[o, p] = W[o, (c, ky, kx)] @ col``, written
straight into the example's output row. Its backward is two more products: the weight gradient
``dW += dY @ rows`` over the input unfolded pixel-major (``rows = col^T``, :func:`_im2row`), or
``dY @ col^T`` for layers with fewer taps than output pixels (whichever OpenBLAS runs faster), and
``dcol = W^T @ dY``, folded back onto the input gradient ("col2im"); ``dY`` is read in place. A
fully connected layer over ``n`` examples is ``Y = X W^T``, ``dX = dY W`` and ``dW = dY^T X``.
Adam section 3.2.4 makes the same move with hand-tuned assembly; here numba calls the BLAS that
SciPy ships (numba's ``np.dot`` with an ``out`` array, so nothing is allocated), one thread per
worker process.

Activations stay in the engine's per-example rows (``act[b, offset:]``); operands that are not
rows of one example are gathered into the worker's scratch vector, which
:func:`batch_scratch_size` sizes.
"""

import numpy as np
from numba import njit, uint64


@njit(cache=True, nogil=True, fastmath=True)
def _valid_columns(kx, S, P, W, Wo):
    """The output columns ox whose input column ox*S + kx - P lies inside [0, W)."""
    lo = P - kx
    first = 0 if lo <= 0 else (lo + S - 1) // S
    last = min(Wo, (W - 1 + P - kx) // S + 1)
    return first, max(first, last)


@njit(cache=True, nogil=True, fastmath=True)
def _im2col(act, first_example, n, x_off, col, C, H, W, Ho, Wo, K, S, P):
    """col[(c*K + ky)*K + kx, b*Ho*Wo + oy*Wo + ox] = x_b[c, oy*S+ky-P, ox*S+kx-P] (0 outside).

    Indices are unsigned so numba skips negative-index wraparound and the copies vectorise.
    """
    plane = Ho * Wo
    width = n * plane
    wo, s = uint64(Wo), uint64(S)
    for c in range(C):
        for ky in range(K):
            for kx in range(K):
                tap = (c * K + ky) * K + kx
                lo, hi = _valid_columns(kx, S, P, W, Wo)
                lo_u, hi_u = uint64(lo), uint64(hi)
                for b in range(n):
                    row = uint64(first_example + b)
                    for oy in range(Ho):
                        dst = uint64(tap * width + b * plane + oy * Wo)
                        iy = oy * S + ky - P
                        if iy < 0 or iy >= H:
                            for j in range(wo):
                                col[dst + j] = 0.0
                            continue
                        for j in range(lo_u):
                            col[dst + j] = 0.0
                        for j in range(hi_u, wo):
                            col[dst + j] = 0.0
                        src = uint64(x_off + (c * H + iy) * W + lo * S + kx - P)
                        dst += lo_u
                        if S == 1:
                            for j in range(hi_u - lo_u):
                                col[dst + j] = act[row, src + j]
                        else:
                            for j in range(hi_u - lo_u):
                                col[dst + j] = act[row, src + j * s]


@njit(cache=True, nogil=True, fastmath=True)
def _col2im(dcol, first_example, n, dact, dx_off, C, H, W, Ho, Wo, K, S, P):
    """Fold column gradients back onto each example's input gradient (overwriting it)."""
    plane = Ho * Wo
    width = n * plane
    s = uint64(S)
    for b in range(n):
        row = uint64(first_example + b)
        for i in range(uint64(C * H * W)):
            dact[row, uint64(dx_off) + i] = 0.0
    for c in range(C):
        for ky in range(K):
            for kx in range(K):
                tap = (c * K + ky) * K + kx
                lo, hi = _valid_columns(kx, S, P, W, Wo)
                count = uint64(hi - lo)
                for b in range(n):
                    row = uint64(first_example + b)
                    for oy in range(Ho):
                        iy = oy * S + ky - P
                        if iy < 0 or iy >= H:
                            continue
                        src = uint64(tap * width + b * plane + oy * Wo + lo)
                        dst = uint64(dx_off + (c * H + iy) * W + lo * S + kx - P)
                        if S == 1:
                            for j in range(count):
                                dact[row, dst + j] += dcol[src + j]
                        else:
                            for j in range(count):
                                dact[row, dst + j * s] += dcol[src + j]


@njit(cache=True, nogil=True, fastmath=True)
def _im2row(x, x_off, rows, C, H, W, Ho, Wo, K, S, P):
    """rows[oy*Wo + ox, (c*K + ky)*K + kx] = x[c, oy*S+ky-P, ox*S+kx-P] (0 outside), one example.

    The transpose of :func:`_im2col`'s layout, for the weight gradient ``dY @ rows``: a product
    whose right operand is row-major runs about twice as fast as one through a transposed view.
    """
    taps = uint64(C * K * K)
    k = uint64(K)
    xs = uint64(x_off)
    for oy in range(Ho):
        for ox in range(Wo):
            dst = uint64(oy * Wo + ox) * taps
            for c in range(C):
                for ky in range(K):
                    iy = oy * S + ky - P
                    at = dst + uint64(c * K + ky) * k
                    if iy < 0 or iy >= H:
                        for kx in range(k):
                            rows[at + kx] = 0.0
                        continue
                    ix0 = ox * S - P
                    if ix0 >= 0 and ix0 + K <= W:
                        src = xs + uint64((c * H + iy) * W + ix0)
                        for kx in range(k):
                            rows[at + kx] = x[src + kx]
                    else:
                        line = x_off + (c * H + iy) * W
                        for kx in range(K):
                            ix = ix0 + kx
                            inside = ix >= 0 and ix < W
                            rows[at + uint64(kx)] = x[line + ix] if inside else 0.0


@njit(cache=True, nogil=True, fastmath=True)
def conv_forward_batch(
    act, n, x_off, y_off, params, w_off, b_off, scratch, C, H, W, O, Ho, Wo, K, S, P
):
    """Convolution forward of n examples, one product each, landing in the example's output row
    (where the bias is then added)."""
    taps = C * K * K
    plane = Ho * Wo
    weights = params[w_off : w_off + O * taps].reshape((O, taps))
    col = scratch[: taps * plane]
    for b in range(n):
        _im2col(act, b, 1, x_off, col, C, H, W, Ho, Wo, K, S, P)
        y = act[b, y_off : y_off + O * plane].reshape((O, plane))
        np.dot(weights, col.reshape((taps, plane)), y)
        for o in range(O):
            bias = params[b_off + o]
            for p in range(plane):
                y[o, p] += bias


@njit(cache=True, nogil=True, fastmath=True)
def conv_backward_batch(
    act,
    dact,
    n,
    x_off,
    y_off,
    params,
    w_off,
    b_off,
    grad,
    scratch,
    C,
    H,
    W,
    O,
    Ho,
    Wo,
    K,
    S,
    P,
    need_dx,
):
    """Convolution backward of n examples: accumulate dW and db into ``grad``; write dX.

    One example at a time, its output gradient read in place as an ``O x Ho*Wo`` matrix:
    ``dW += dY @ rows`` (:func:`_im2row`) when the layer has at least as many taps as output
    pixels, else ``dW += dY @ col^T`` (:func:`_im2col`): OpenBLAS runs the first twice as fast
    for Adam's second convolution (250 taps, 64 pixels) and the second 1.7x as fast for its
    first (25 taps, 576 pixels). ``dcol = W^T @ dY`` is folded back by :func:`_col2im`.
    """
    taps = C * K * K
    plane = Ho * Wo
    weights = params[w_off : w_off + O * taps].reshape((O, taps))
    g = grad[w_off : w_off + O * taps]
    rows = scratch[: plane * taps].reshape((plane, taps))
    gw = scratch[plane * taps : plane * taps + O * taps].reshape((O, taps))
    flat = gw.reshape(O * taps)
    for b in range(n):
        d = dact[b]
        dy = d[y_off : y_off + O * plane].reshape((O, plane))
        for o in range(O):
            total = np.float32(0.0)
            for p in range(plane):
                total += dy[o, p]
            grad[b_off + o] += total
        if taps >= plane:
            _im2row(act[b], x_off, rows.reshape(plane * taps), C, H, W, Ho, Wo, K, S, P)
            np.dot(dy, rows, gw)
        else:
            col = rows.reshape((taps, plane))
            _im2col(act, b, 1, x_off, col.reshape(plane * taps), C, H, W, Ho, Wo, K, S, P)
            np.dot(dy, col.T, gw)
        for i in range(O * taps):
            g[i] += flat[i]
        if need_dx:
            col = rows.reshape((taps, plane))  # the unfolded inputs are no longer needed
            np.dot(weights.T, dy, col)
            _col2im(rows.reshape(plane * taps), b, 1, dact, x_off, C, H, W, Ho, Wo, K, S, P)


@njit(cache=True, nogil=True, fastmath=True)
def fc_forward_batch(act, n, x_off, y_off, params, w_off, b_off, scratch, n_in, n_out):
    """Y = X W^T + b for n examples."""
    x = scratch[: n * n_in].reshape((n, n_in))
    y = scratch[n * n_in : n * n_in + n * n_out].reshape((n, n_out))
    for b in range(n):
        x[b, :] = act[b, x_off : x_off + n_in]
    weights = params[w_off : w_off + n_out * n_in].reshape((n_out, n_in))
    np.dot(x, weights.T, y)
    for b in range(n):
        dst = act[b, y_off : y_off + n_out]
        for o in range(n_out):
            dst[o] = y[b, o] + params[b_off + o]


@njit(cache=True, nogil=True, fastmath=True)
def fc_backward_batch(
    act, dact, n, x_off, y_off, params, w_off, b_off, grad, scratch, n_in, n_out, need_dx
):
    """dX = dY W for n examples, and the bias gradient; the weights are updated separately."""
    dy = scratch[: n * n_out].reshape((n, n_out))
    dx = scratch[n * n_out : n * n_out + n * n_in].reshape((n, n_in))
    for b in range(n):
        src = dact[b, y_off : y_off + n_out]
        dy[b, :] = src
        for o in range(n_out):
            grad[b_off + o] += src[o]
    if need_dx:
        weights = params[w_off : w_off + n_out * n_in].reshape((n_out, n_in))
        np.dot(dy, weights, dx)
        for b in range(n):
            dact[b, x_off : x_off + n_in] = dx[b]


@njit(cache=True, nogil=True, fastmath=True)
def fc_weight_update_batch(
    act,
    dact,
    n,
    x_off,
    y_off,
    params,
    w_off,
    velocity,
    scratch,
    n_in,
    n_out,
    lr,
    scale,
    mu,
    wd,
    momentum,
):
    """Apply a minibatch's weight update ``-lr * (scale * dY^T X + wd * W)`` (or momentum).

    The gradient matrix is formed by one sgemm from the minibatch's error and activation vectors
    (Adam section 3.2.6's k*(M+N) values), then applied in one pass over the shared weights.
    """
    dy = scratch[: n * n_out].reshape((n, n_out))
    x = scratch[n * n_out : n * n_out + n * n_in].reshape((n, n_in))
    g = scratch[n * n_out + n * n_in : n * n_out + n * n_in + n_out * n_in].reshape((n_out, n_in))
    for b in range(n):
        dy[b, :] = dact[b, y_off : y_off + n_out]
        x[b, :] = act[b, x_off : x_off + n_in]
    np.dot(dy.T, x, g)
    w = params[w_off : w_off + n_out * n_in]
    flat = g.reshape(n_out * n_in)
    lr, scale, mu, wd = np.float32(lr), np.float32(scale), np.float32(mu), np.float32(wd)
    if momentum:
        v = velocity[w_off : w_off + n_out * n_in]
        for i in range(n_out * n_in):
            vi = mu * v[i] + scale * flat[i] + wd * w[i]
            v[i] = vi
            w[i] -= lr * vi
    else:
        for i in range(n_out * n_in):
            w[i] -= lr * (scale * flat[i] + wd * w[i])


def batch_scratch_size(layers_dims, batch: int) -> int:
    """Floats of scratch the batched kernels need for ``batch`` examples.

    Args:
        layers_dims: per weighted layer, ``("conv", C, O, Ho*Wo, K)`` or ``("fc", n_in, n_out)``.
        batch: the largest minibatch.
    """
    size = 1
    for dims in layers_dims:
        if dims[0] == "conv":  # one example's unfolded input and a weight-gradient block
            _, c, o, plane, k = dims
            taps = c * k * k
            size = max(size, taps * plane + o * taps)
        else:
            _, n_in, n_out = dims
            size = max(size, batch * (n_in + n_out) + n_in * n_out)
    return size
