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
from numba import njit


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
def _padded_input(x, x_off, scratch, C, H, W, P):
    """The input as a flat [C, H+2P, W+2P] vector: a view of x when P == 0, else a padded copy."""
    if P == 0:
        return x[x_off : x_off + C * H * W]
    hp, wp = H + 2 * P, W + 2 * P
    padded = scratch[: C * hp * wp]
    padded[:] = 0.0
    for c in range(C):
        for iy in range(H):
            dst = padded[(c * hp + iy + P) * wp + P : (c * hp + iy + P) * wp + P + W]
            src = x[x_off + (c * H + iy) * W : x_off + (c * H + iy + 1) * W]
            dst[:] = src
    return padded


@njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
def conv_forward(x, x_off, w, w_off, b_off, y, y_off, scratch, C, H, W, O, Ho, Wo, K, S, P):
    """Convolution forward; unit stride runs on "wide rows" (see the module docstring)."""
    if S != 1:
        conv_forward_strided(x, x_off, w, w_off, b_off, y, y_off, C, H, W, O, Ho, Wo, K, S, P)
        return
    hp, wp = H + 2 * P, W + 2 * P
    src = _padded_input(x, x_off, scratch, C, H, W, P)
    span = (Ho - 1) * wp + Wo
    wide = scratch[C * hp * wp : C * hp * wp + span]
    for o in range(O):
        wide[:] = w[b_off + o]
        for c in range(C):
            for ky in range(K):
                for kx in range(K):
                    wv = w[w_off + ((o * C + c) * K + ky) * K + kx]
                    start = (c * hp + ky) * wp + kx
                    xs = src[start : start + span]
                    for p in range(span):
                        wide[p] += wv * xs[p]
        for oy in range(Ho):
            dst = y[y_off + (o * Ho + oy) * Wo : y_off + (o * Ho + oy + 1) * Wo]
            dst[:] = wide[oy * wp : oy * wp + Wo]


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
    hp, wp = H + 2 * P, W + 2 * P
    n_in = C * hp * wp
    src = _padded_input(x, x_off, scratch, C, H, W, P)
    span = (Ho - 1) * wp + Wo
    wide = scratch[n_in : n_in + span]
    if P == 0:
        dsrc = dx[dx_off : dx_off + n_in]
    else:
        dsrc = scratch[n_in + span : 2 * n_in + span]
    if need_dx:
        dsrc[:] = 0.0
    wide[:] = 0.0
    for o in range(O):
        total = np.float32(0.0)
        for oy in range(Ho):
            row = dy[dy_off + (o * Ho + oy) * Wo : dy_off + (o * Ho + oy + 1) * Wo]
            wide[oy * wp : oy * wp + Wo] = row
            for j in range(Wo):
                total += row[j]
        g[b_off + o] += total
        for c in range(C):
            for ky in range(K):
                for kx in range(K):
                    widx = w_off + ((o * C + c) * K + ky) * K + kx
                    start = (c * hp + ky) * wp + kx
                    xs = src[start : start + span]
                    acc = np.float32(0.0)
                    for p in range(span):
                        acc += wide[p] * xs[p]
                    g[widx] += acc
                    if need_dx:
                        wv = w[widx]
                        ds = dsrc[start : start + span]
                        for p in range(span):
                            ds[p] += wv * wide[p]
    if need_dx and P > 0:
        for c in range(C):
            for iy in range(H):
                at = (c * hp + iy + P) * wp + P
                dst = dx[dx_off + (c * H + iy) * W : dx_off + (c * H + iy + 1) * W]
                dst[:] = dsrc[at : at + W]


def conv_scratch_size(C: int, H: int, W: int, O: int, Ho: int, Wo: int, K: int, P: int) -> int:
    """Floats of scratch one convolution needs: padded input, its gradient, one wide output map."""
    hp, wp = H + 2 * P, W + 2 * P
    return 2 * C * hp * wp + (Ho - 1) * wp + Wo
