"""Convolution forward and backward for one example, as numba kernels.

Layouts follow PyTorch: input ``[C, H, W]``, weights ``[O, C, K, K]``, output ``[O, Ho, Wo]``, all
flat float32 vectors addressed through offsets, so the engine can keep every activation of an
example in one preallocated row. Padding is implicit: taps that fall outside the input are skipped
(zero padding) by clipping each row's range of output columns, so no padded copy is made.

The innermost loop runs along an output row with unit stride in the output, which is what the
compiler vectorises. Gradients are *accumulated* into ``gw``/``gb`` (a minibatch sums over its
examples); the input gradient ``dx`` is overwritten.
"""

import numpy as np
from numba import njit, uint64


@njit(cache=True, nogil=True, inline="always")
def _col_range(kx, stride, pad, width, out_w):
    """Output columns ox whose input column ox*stride + kx - pad lies inside [0, width)."""
    lo = pad - kx
    first = 0 if lo <= 0 else (lo + stride - 1) // stride
    last = (width - 1 + pad - kx) // stride + 1
    if last > out_w:
        last = out_w
    return first, last


@njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
def conv_forward_strided(x, x_off, w, w_off, b_off, y, y_off, C, H, W, O, Ho, Wo, K, S, P):
    """y[o, oy, ox] = bias[o] + sum_{c,ky,kx} w[o, c, ky, kx] * x[c, oy*S+ky-P, ox*S+kx-P]."""
    plane = Ho * Wo
    for o in range(O):
        bias = w[b_off + o]
        base = y_off + o * plane
        for i in range(plane):
            y[base + i] = bias
        for c in range(C):
            for ky in range(K):
                for kx in range(K):
                    wv = w[w_off + ((o * C + c) * K + ky) * K + kx]
                    first, last = _col_range(kx, S, P, W, Wo)
                    n = last - first
                    for oy in range(Ho):
                        iy = oy * S + ky - P
                        if iy < 0 or iy >= H:
                            continue
                        out_at = base + oy * Wo + first
                        in_at = x_off + (c * H + iy) * W + kx - P + first * S
                        # Slices let the compiler see non-negative indices and vectorise.
                        yr = y[out_at : out_at + n]
                        xr = x[in_at : in_at + (n - 1) * S + 1]
                        for j in range(n):
                            yr[j] += wv * xr[j * S]


@njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
def conv_backward_strided(
    x, x_off, w, w_off, b_off, dy, dy_off, dx, dx_off, g, C, H, W, O, Ho, Wo, K, S, P, need_dx
):
    """Accumulate dL/dw and dL/db into ``g`` (parameter layout); write dL/dx when ``need_dx``."""
    plane = Ho * Wo
    if need_dx:
        for i in range(C * H * W):
            dx[dx_off + i] = 0.0
    for o in range(O):
        base = dy_off + o * plane
        total = 0.0
        for i in range(plane):
            total += dy[base + i]
        g[b_off + o] += total
        for c in range(C):
            for ky in range(K):
                for kx in range(K):
                    widx = w_off + ((o * C + c) * K + ky) * K + kx
                    wv = w[widx]
                    first, last = _col_range(kx, S, P, W, Wo)
                    n = last - first
                    acc = np.float32(0.0)
                    for oy in range(Ho):
                        iy = oy * S + ky - P
                        if iy < 0 or iy >= H:
                            continue
                        out_at = base + oy * Wo + first
                        in_at = (c * H + iy) * W + kx - P + first * S
                        dyr = dy[out_at : out_at + n]
                        xr = x[x_off + in_at : x_off + in_at + (n - 1) * S + 1]
                        for j in range(n):
                            acc += dyr[j] * xr[j * S]
                        if need_dx:
                            dxr = dx[dx_off + in_at : dx_off + in_at + (n - 1) * S + 1]
                            for j in range(n):
                                dxr[j * S] += wv * dyr[j]
                    g[widx] += acc


@njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
def _pad_into(x, x_off, scratch, C, H, W, P):
    """Copy the [C, H, W] input into scratch as a zero-bordered [C, H+2P, W+2P] block."""
    hp, wp = H + 2 * P, W + 2 * P
    for i in range(C * hp * wp):
        scratch[i] = 0.0
    for c in range(C):
        for iy in range(H):
            dst = (c * hp + iy + P) * wp + P
            src = x_off + (c * H + iy) * W
            for ix in range(W):
                scratch[dst + ix] = x[src + ix]


@njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
def conv_forward(x, x_off, w, w_off, b_off, y, y_off, scratch, C, H, W, O, Ho, Wo, K, S, P):
    """Convolution forward; unit stride runs on "wide rows" (see the module docstring)."""
    if S != 1:
        conv_forward_strided(x, x_off, w, w_off, b_off, y, y_off, C, H, W, O, Ho, Wo, K, S, P)
        return
    if P > 0:
        _pad_into(x, x_off, scratch, C, H, W, P)
        src, base = scratch, uint64(0)
    else:
        src, base = x, uint64(x_off)
    # Unsigned indices: numba then skips negative-index wraparound and the loops vectorise.
    C, K, wo = uint64(C), uint64(K), uint64(Wo)
    hp, wp = uint64(H + 2 * P), uint64(W + 2 * P)
    span = uint64((Ho - 1) * (W + 2 * P) + Wo)
    wide_at = C * hp * wp
    w_off, b_off, y_off = uint64(w_off), uint64(b_off), uint64(y_off)
    for o in range(uint64(O)):
        bias = w[b_off + o]
        for p in range(span):
            scratch[wide_at + p] = bias
        for c in range(C):
            for ky in range(K):
                for kx in range(K):
                    wv = w[w_off + ((o * C + c) * K + ky) * K + kx]
                    start = base + (c * hp + ky) * wp + kx
                    for p in range(span):
                        scratch[wide_at + p] += wv * src[start + p]
        for oy in range(uint64(Ho)):
            row_out = y_off + (o * uint64(Ho) + oy) * wo
            row_wide = wide_at + oy * wp
            for ox in range(wo):
                y[row_out + ox] = scratch[row_wide + ox]


@njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
def conv_backward(
    x,
    x_off,
    w,
    w_off,
    b_off,
    dy,
    dy_off,
    dx,
    dx_off,
    g,
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
    """Accumulate dL/dw and dL/db into ``g`` (parameter layout); write dL/dx when ``need_dx``."""
    if S != 1:
        conv_backward_strided(
            x,
            x_off,
            w,
            w_off,
            b_off,
            dy,
            dy_off,
            dx,
            dx_off,
            g,
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
        )
        return
    n_padded = C * (H + 2 * P) * (W + 2 * P)
    if P > 0:
        _pad_into(x, x_off, scratch, C, H, W, P)
        src, base = scratch, uint64(0)
        dsrc, dbase = scratch, uint64(n_padded)
    else:
        src, base = x, uint64(x_off)
        dsrc, dbase = dx, uint64(dx_off)
    C, K, ho, wo = uint64(C), uint64(K), uint64(Ho), uint64(Wo)
    hp, wp = uint64(H + 2 * P), uint64(W + 2 * P)
    span = uint64((Ho - 1) * (W + 2 * P) + Wo)
    wide_at = uint64(2 * n_padded)
    w_off, b_off, dy_off = uint64(w_off), uint64(b_off), uint64(dy_off)
    if need_dx:
        for i in range(uint64(n_padded)):
            dsrc[dbase + i] = 0.0
    for p in range(span):
        scratch[wide_at + p] = 0.0  # the gap columns between rows stay zero
    for o in range(uint64(O)):
        total = np.float32(0.0)
        for oy in range(ho):
            row_dy = dy_off + (o * ho + oy) * wo
            row_wide = wide_at + oy * wp
            for ox in range(wo):
                v = dy[row_dy + ox]
                scratch[row_wide + ox] = v
                total += v
        g[b_off + o] += total
        for c in range(C):
            for ky in range(K):
                for kx in range(K):
                    widx = w_off + ((o * C + c) * K + ky) * K + kx
                    start = (c * hp + ky) * wp + kx
                    acc = np.float32(0.0)
                    for p in range(span):
                        acc += scratch[wide_at + p] * src[base + start + p]
                    g[widx] += acc
                    if need_dx:
                        wv = w[widx]
                        for p in range(span):
                            dsrc[dbase + start + p] += wv * scratch[wide_at + p]
    if need_dx and P > 0:
        for c in range(C):
            for iy in range(H):
                at = n_padded + (c * (H + 2 * P) + iy + P) * (W + 2 * P) + P
                for ix in range(W):
                    dx[dx_off + (c * H + iy) * W + ix] = scratch[at + ix]


def conv_scratch_size(C: int, H: int, W: int, O: int, Ho: int, Wo: int, K: int, P: int) -> int:
    """Floats of scratch one convolution needs: padded input, its gradient, one wide output map."""
    hp, wp = H + 2 * P, W + 2 * P
    return 2 * C * hp * wp + (Ho - 1) * wp + Wo
