"""Convolutions and fully connected layers over a whole minibatch at once.

A convolution of stride 1 without padding runs forward, and computes its weight gradient,
directly from its input rows (:mod:`hogwild.model.conv_direct`). Any other is one product per
example and direction (the engine hands it one example at a time, so the example's activations
stay in cache), through the register-blocked kernel of :mod:`hogwild.model.gemm` with the
layer's weights packed once per minibatch (:func:`pack_conv_weights`). The forward product
unfolds the input into columns (``col[(c, ky, kx), (oy, ox)]``, "im2col", with zero padding and
any stride), then ``Y[o, p] = W[o, (c, ky, kx)] @ col + b``, written with its bias straight into
the example's output row. Its backward is the weight gradient, as the product
``dW += dY @ rows`` over the input unfolded pixel-major (``rows = col^T``, :func:`_im2row`),
added into the gradient as it leaves the registers; and ``dcol = W^T @ dY`` with ``dY`` read in
place, folded back onto the input gradient ("col2im"). A fully connected layer over ``n``
examples is ``Y = X W^T`` (numpy's BLAS, one thread per worker process), ``dX = dY W`` written
into the examples' rows, and its weight update ``W -= lr * (dY^T X / n + wd * W)`` applied block
by block as the product's blocks leave the registers (the gradient matrix is never stored). Adam
section 3.2.4 makes the same moves with hand-tuned assembly.

Activations stay in the engine's per-example rows (``act[b, offset:]``); operands that are not
rows of one example are gathered into the worker's scratch vector, which
:func:`hogwild.model.scratch_sizes.batch_scratch_size` sizes.
"""

import numpy as np
from numba import uint64

from hogwild.jit import kernel
from hogwild.model.conv_direct import conv_forward, conv_weight_grad, direct_applies
from hogwild.model.gemm import ADD, BIAS, MOMENTUM, SET, SGD, gemm, pack_a, packed_size
from hogwild.model.simd import data_ptr, lanes, vadd, vload, vload_n, vstore, vstore_n


@kernel(cache=True, nogil=True, fastmath=True)
def _valid_columns(kx, S, P, W, Wo):
    """The output columns ox whose input column ox*S + kx - P lies inside [0, W)."""
    lo = P - kx
    first = 0 if lo <= 0 else (lo + S - 1) // S
    last = min(Wo, (W - 1 + P - kx) // S + 1)
    return first, max(first, last)


@kernel(cache=True, nogil=True, fastmath=True)
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


@kernel(cache=True, nogil=True, fastmath=True)
def _col2im(dcol, first_example, n, dact, dx_off, C, H, W, Ho, Wo, K, S, P):
    """Fold column gradients back onto each example's input gradient (overwriting it)."""
    for b in range(n):
        row = uint64(first_example + b)
        for i in range(uint64(C * H * W)):
            dact[row, uint64(dx_off) + i] = 0.0
    if S == 1 and P == 0:
        _add_unit_stride_columns(dcol, first_example, n, dact, dx_off, C, H, W, Ho, Wo, K)
        return
    plane = Ho * Wo
    width = n * plane
    s = uint64(S)
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


@kernel(cache=True, nogil=True, fastmath=True)
def _add_unit_stride_columns(dcol, first_example, n, dact, dx_off, C, H, W, Ho, Wo, K):
    """:func:`_col2im`'s additions for stride 1 without padding (onto the input gradient it
    zeroed), an output row at a time in SIMD vectors.

    Every tap's output row lands on one input row, ``kx`` to the right: ``dX[c, oy + ky, kx:kx
    + Wo] += dcol[(c, ky, kx), oy, :]``. The general loop added those rows element by element
    (Adam's second convolution has rows of 8: too short for the loop vectoriser), several times
    slower than this one. The order (``kx`` outermost
    after ``c``) makes an unaligned vector add read back a row it wrote shifted by another ``kx``
    only some 40 adds later, after the store has left the core's store buffer: reading part of a
    store still in flight waits for it.
    """
    L = lanes(dact)
    stride = dact.strides[0] // dact.itemsize
    plane = Ho * Wo
    width = n * plane
    d, src = data_ptr(dact), data_ptr(dcol)
    for c in range(C):
        for kx in range(K):
            for ky in range(K):
                tap = (c * K + ky) * K + kx
                for b in range(n):
                    base = (first_example + b) * stride + dx_off + (c * H + ky) * W + kx
                    for oy in range(Ho):
                        at = base + oy * W
                        col = tap * width + b * plane + oy * Wo
                        for x0 in range(0, Wo, L):
                            count = min(L, Wo - x0)
                            p, q = at + x0, col + x0
                            if count == L:
                                vstore(d, p, vadd(vload(d, p), vload(src, q)))
                            else:
                                total = vadd(vload_n(d, p, count), vload_n(src, q, count))
                                vstore_n(d, p, total, count)


@kernel(cache=True, nogil=True, fastmath=True)
def _im2row(x, x_off, rows, C, H, W, Ho, Wo, K, S, P):
    """rows[oy*Wo + ox, (c*K + ky)*K + kx] = x[c, oy*S+ky-P, ox*S+kx-P] (0 outside), one example.

    The transpose of :func:`_im2col`'s layout, for the weight gradient ``dY @ rows``: the right
    operand of :func:`hogwild.model.gemm.gemm` is read row by row.
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


@kernel(cache=True, nogil=True, fastmath=True)
def pack_conv_weights(params, w_off, packed, O, taps, transposed):
    """Pack a convolution's ``O x taps`` weights as the left operand of its forward product
    (``W``, at ``packed[0:]``) or of its input-gradient product (``W^T``, after it).

    Done once per minibatch, before its examples go through the layer one at a time: every
    example's products then read the same packed copy.
    """
    if transposed:
        at = packed_size(O, taps)
        pack_a(params, w_off, 1, taps, taps, O, packed[at : at + packed_size(taps, O)])
    else:
        pack_a(params, w_off, taps, 1, O, taps, packed[: packed_size(O, taps)])


@kernel(cache=True, nogil=True, fastmath=True)
def conv_forward_batch(
    act, n, x_off, y_off, params, w_off, b_off, packed, work, C, H, W, O, Ho, Wo, K, S, P
):
    """Convolution forward of n examples, landing with its bias in each example's output row:
    directly for stride 1 without padding (:func:`hogwild.model.conv_direct.conv_forward`),
    otherwise one product per example (the weights packed by :func:`pack_conv_weights`)."""
    if direct_applies(S, P):
        conv_forward(act, 0, n, x_off, y_off, params, w_off, b_off, C, H, W, O, Ho, Wo, K)
        return
    taps = C * K * K
    plane = Ho * Wo
    col = work[: taps * plane]
    for b in range(n):
        _im2col(act, b, 1, x_off, col, C, H, W, Ho, Wo, K, S, P)
        gemm(
            act[b],
            y_off,
            plane,
            packed,
            col,
            0,
            plane,
            O,
            plane,
            taps,
            BIAS,
            params,
            b_off,
            0.0,
            0.0,
            0.0,
            0.0,
        )


@kernel(cache=True, nogil=True, fastmath=True)
def conv_backward_batch(
    act,
    dact,
    n,
    x_off,
    y_off,
    w_off,
    b_off,
    grad,
    packed,
    work,
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
    direct_weights_later,
):
    """Convolution backward of n examples: accumulate dW and db into ``grad``; write dX.

    The weight gradient of a stride-1 unpadded convolution comes straight from ``X`` and ``dY``
    (:func:`hogwild.model.conv_direct.conv_weight_grad`, over all n examples), unless
    ``direct_weights_later``: the caller runs it itself over a larger group of examples. Other
    convolutions go one example at a time, the output gradient ``dY`` (``O x Ho*Wo``) packed as
    the left operand: ``dW += dY @ rows`` straight into ``grad`` (the inputs unfolded pixel-major
    by :func:`_im2row`). Then ``dcol = W^T @ dY`` (``W^T`` packed by :func:`pack_conv_weights`,
    ``dY`` read in place), folded back onto the input gradient by :func:`_col2im`.
    """
    taps = C * K * K
    plane = Ho * Wo
    rows = work[: plane * taps]
    packed_dy = work[plane * taps : plane * taps + packed_size(O, plane)]
    at = packed_size(O, taps)
    packed_wt = packed[at : at + packed_size(taps, O)]
    direct = direct_applies(S, P)
    for b in range(n):
        d = dact[b]
        for o in range(O):
            total = np.float32(0.0)
            row = y_off + o * plane
            for p in range(plane):
                total += d[row + p]
            grad[b_off + o] += total
        if not direct:
            pack_a(d, y_off, plane, 1, O, plane, packed_dy)
            _im2row(act[b], x_off, rows, C, H, W, Ho, Wo, K, S, P)
            gemm(
                grad,
                w_off,
                taps,
                packed_dy,
                rows,
                0,
                taps,
                O,
                taps,
                plane,
                ADD,
                grad,
                0,
                0.0,
                0.0,
                0.0,
                0.0,
            )
        if need_dx:  # the unfolded inputs are no longer needed: rows holds dcol
            gemm(
                rows,
                0,
                plane,
                packed_wt,
                d,
                y_off,
                plane,
                taps,
                plane,
                O,
                SET,
                rows,
                0,
                0.0,
                0.0,
                0.0,
                0.0,
            )
            _col2im(rows, b, 1, dact, x_off, C, H, W, Ho, Wo, K, S, P)
    if direct and not direct_weights_later:
        conv_weight_grad(act, dact, 0, n, x_off, y_off, grad, w_off, C, H, W, O, Ho, Wo, K)


@kernel(cache=True, nogil=True, fastmath=True)
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


@kernel(cache=True, nogil=True, fastmath=True)
def fc_backward_batch(
    act, dact, n, x_off, y_off, params, w_off, b_off, grad, scratch, n_in, n_out, need_dx
):
    """dX = dY W for n examples, and the bias gradient; the weights are updated separately.

    ``dY`` is packed from the examples' rows and ``dX`` written into them (``W`` read in place).
    """
    for b in range(n):
        for o in range(n_out):
            grad[b_off + o] += dact[b, y_off + o]
    if need_dx:
        stride = dact.shape[1]
        rows = dact.reshape(dact.shape[0] * stride)
        packed_dy = scratch[: packed_size(n, n_out)]
        pack_a(rows, y_off, stride, 1, n, n_out, packed_dy)
        gemm(
            rows,
            x_off,
            stride,
            packed_dy,
            params,
            w_off,
            n_in,
            n,
            n_in,
            n_out,
            SET,
            rows,
            0,
            0.0,
            0.0,
            0.0,
            0.0,
        )


@kernel(cache=True, nogil=True, fastmath=True)
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

    The gradient ``dY^T X`` (from Adam section 3.2.6's k*(M+N) values: the minibatch's error and
    activation vectors) is one product whose blocks are applied to the shared weights as they
    leave the registers: the gradient matrix is never stored.
    """
    stride = act.shape[1]
    x = act.reshape(act.shape[0] * stride)
    dy = dact.reshape(dact.shape[0] * dact.shape[1])
    packed_dyt = scratch[: packed_size(n_out, n)]
    pack_a(dy, y_off, 1, dact.shape[1], n_out, n, packed_dyt)
    if momentum:
        mode, aux, s0, s1, s2, s3 = MOMENTUM, velocity, mu, scale, wd, lr
    else:
        mode, aux, s0, s1, s2, s3 = SGD, params, -lr * wd, -lr * scale, 0.0, 0.0
    gemm(
        params,
        w_off,
        n_in,
        packed_dyt,
        x,
        x_off,
        stride,
        n_out,
        n_in,
        n,
        mode,
        aux,
        0,
        s0,
        s1,
        s2,
        s3,
    )
