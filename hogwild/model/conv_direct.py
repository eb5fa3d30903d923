"""Convolutions of stride 1 without padding computed directly, without unfolding the input.

The route through matrix products (:mod:`hogwild.model.batch_kernels`) first unfolds the input
("im2col", or pixel-major for the weight gradient), copying every input value ``K * K`` times;
for Adam's small convolutions those copies cost more than the arithmetic (a large share of a
backward pass). Here nothing is copied: the kernels read the
input's rows in place with unaligned SIMD loads shifted by ``kx``, and keep a block of results in
registers. A row's last, partial vector is read and written with masks, so nothing beyond it is
touched.

**Forward** (:func:`conv_forward`), per example::

    Y[o, oy, ox] = b[o] + sum_c sum_ky sum_kx W[o, c, ky, kx] * X[c, oy + ky, ox + kx]

A block is five output maps times two output vectors (two positions along the rows, which may
be on different rows): per input tap, two input vectors and five broadcast weights, ten fused
multiply-adds into ten accumulators; the bias is added as the block is stored.

**Weight gradient** (:func:`conv_weight_grad`), over examples ``b``::

    dW[o, c, ky, kx] += sum_b sum_oy sum_ox dY_b[o, oy, ox] * X_b[c, oy + ky, ox + kx]

One step reads a vector of ``dY`` along ``ox`` for two output maps and the five input vectors it
meets at five consecutive ``kx``, and does ten fused multiply-adds into ten accumulators (two
maps times five ``kx``) that stay in registers across examples, rows and column chunks; their
lanes are summed once per block, when the block's ``dW`` values are added into the gradient.
Examples go through a block in groups of ``G``, with ``G`` the fewest that give a block at least
:data:`MIN_STEPS` steps (Adam's second convolution has only 8 rows of one vector per example:
one example per block would spend as long summing lanes as multiplying), so that a group's
activations stay in cache while every block passes over them.
"""

from numba import njit

from hogwild.jit import kernel
from hogwild.model.simd import (
    data_ptr,
    lanes,
    vadd,
    vbload,
    vfma,
    vhsum,
    vload,
    vload_n,
    vsplat,
    vstore,
    vstore_n,
    vzero,
)

MAPS = 5  # output maps per forward block
KB = 5  # kernel columns (kx) per weight-gradient block
MIN_STEPS = 64  # SIMD steps per block worth one lane sum per accumulator


@kernel(cache=True, nogil=True)
def direct_applies(S, P):
    """Whether this module's kernels compute a convolution of stride ``S`` and padding ``P``."""
    return S == 1 and P == 0


@kernel(cache=True, nogil=True, fastmath=True)
def conv_weight_grad(act, dact, first, n, x_off, y_off, grad, w_off, C, H, W, O, Ho, Wo, K):
    """Add the weight gradient of rows ``first:first+n`` of ``act``/``dact`` into ``grad``.

    Args:
        act: the examples' activation rows; the layer's input ``X[c, y, x]`` of example ``b`` is
            ``act[b, x_off + (c * H + y) * W + x]``.
        dact: their gradient rows; ``dY[o, oy, ox]`` is ``dact[b, y_off + (o * Ho + oy) * Wo +
            ox]``.
        grad: ``dW[o, c, ky, kx]`` is ``grad[w_off + ((o * C + c) * K + ky) * K + kx]``.
        C, H, W, O, Ho, Wo, K: the layer's shape (stride 1, no padding: ``Ho = H - K + 1``).
    """
    L = lanes(act)  # the vectors' width is the activations' (grad shares their float type)
    steps = Ho * ((Wo + L - 1) // L)
    group = max(1, min(n, (MIN_STEPS + steps - 1) // steps))
    x_stride = act.strides[0] // act.itemsize
    d_stride = dact.strides[0] // dact.itemsize
    # Raw pointers for the inlined helpers: arrays passed to them are counted references.
    x, d = data_ptr(act), data_ptr(dact)
    plane = Ho * Wo
    taps = C * K * K
    for b0 in range(first, first + n, group):
        nb = min(group, first + n - b0)
        for c in range(C):
            for ky in range(K):
                for kx0 in range(0, K, KB):
                    nk = min(KB, K - kx0)
                    px = b0 * x_stride + x_off + (c * H + ky) * W + kx0
                    for o0 in range(0, O, 2):
                        two = o0 + 1 < O
                        pd = b0 * d_stride + y_off + o0 * plane
                        if two and nk == KB:
                            acc = _block(x, d, px, pd, nb, x_stride, d_stride, plane, Ho, W, Wo, L)
                        else:
                            acc = _block_edge(
                                x, d, px, pd, nb, x_stride, d_stride, plane, Ho, W, Wo, L, two, nk
                            )
                        at = w_off + o0 * taps + (c * K + ky) * K + kx0
                        _add_sums(grad, at, acc, nk)
                        if two:
                            _add_sums(grad, at + taps, acc[KB:], nk)


@njit(cache=True, nogil=True, fastmath=True)
def _add_sums(grad, at, acc, nk):
    """``grad[at + j] += sum of acc[j]``'s lanes, for the block's ``nk`` columns."""
    grad[at] += vhsum(acc[0])
    if nk > 1:
        grad[at + 1] += vhsum(acc[1])
    if nk > 2:
        grad[at + 2] += vhsum(acc[2])
    if nk > 3:
        grad[at + 3] += vhsum(acc[3])
    if nk > 4:
        grad[at + 4] += vhsum(acc[4])


@njit(cache=True, nogil=True, fastmath=True)
def _block(x, d, px, pd, nb, x_stride, d_stride, plane, Ho, W, Wo, L):
    """Two output maps times five ``kx``: ``(a0[0..4], a1[0..4])``, lanes not yet summed."""
    a00 = vzero(x)
    a01 = vzero(x)
    a02 = vzero(x)
    a03 = vzero(x)
    a04 = vzero(x)
    a10 = vzero(x)
    a11 = vzero(x)
    a12 = vzero(x)
    a13 = vzero(x)
    a14 = vzero(x)
    full = Wo // L
    tail = Wo - full * L
    for b in range(nb):
        for oy in range(Ho):
            p = px + b * x_stride + oy * W
            q = pd + b * d_stride + oy * Wo
            for _ in range(full):
                d0 = vload(d, q)
                d1 = vload(d, q + plane)
                v = vload(x, p)
                a00 = vfma(d0, v, a00)
                a10 = vfma(d1, v, a10)
                v = vload(x, p + 1)
                a01 = vfma(d0, v, a01)
                a11 = vfma(d1, v, a11)
                v = vload(x, p + 2)
                a02 = vfma(d0, v, a02)
                a12 = vfma(d1, v, a12)
                v = vload(x, p + 3)
                a03 = vfma(d0, v, a03)
                a13 = vfma(d1, v, a13)
                v = vload(x, p + 4)
                a04 = vfma(d0, v, a04)
                a14 = vfma(d1, v, a14)
                p += L
                q += L
            if tail:
                d0 = vload_n(d, q, tail)
                d1 = vload_n(d, q + plane, tail)
                v = vload_n(x, p, tail)
                a00 = vfma(d0, v, a00)
                a10 = vfma(d1, v, a10)
                v = vload_n(x, p + 1, tail)
                a01 = vfma(d0, v, a01)
                a11 = vfma(d1, v, a11)
                v = vload_n(x, p + 2, tail)
                a02 = vfma(d0, v, a02)
                a12 = vfma(d1, v, a12)
                v = vload_n(x, p + 3, tail)
                a03 = vfma(d0, v, a03)
                a13 = vfma(d1, v, a13)
                v = vload_n(x, p + 4, tail)
                a04 = vfma(d0, v, a04)
                a14 = vfma(d1, v, a14)
    return a00, a01, a02, a03, a04, a10, a11, a12, a13, a14


@njit(cache=True, nogil=True, fastmath=True)
def _block_edge(x, d, px, pd, nb, x_stride, d_stride, plane, Ho, W, Wo, L, two, nk):
    """:func:`_block` for a last, single output map (``two`` False) or fewer than five ``kx``
    (``nk``): every load is masked, and the absent map and columns are zeros."""
    a00 = vzero(x)
    a01 = vzero(x)
    a02 = vzero(x)
    a03 = vzero(x)
    a04 = vzero(x)
    a10 = vzero(x)
    a11 = vzero(x)
    a12 = vzero(x)
    a13 = vzero(x)
    a14 = vzero(x)
    chunks = (Wo + L - 1) // L
    for b in range(nb):
        for oy in range(Ho):
            p = px + b * x_stride + oy * W
            q = pd + b * d_stride + oy * Wo
            for chunk in range(chunks):
                count = min(L, Wo - chunk * L)
                # An absent map or column is zeros, not a masked-off load: its address would lie
                # beyond the data, which some processors may fault on even with no lane read.
                d0 = vload_n(d, q, count)
                d1 = vload_n(d, q + plane, count) if two else vzero(d)
                v = vload_n(x, p, count)
                a00 = vfma(d0, v, a00)
                a10 = vfma(d1, v, a10)
                v = vload_n(x, p + 1, count) if nk > 1 else vzero(x)
                a01 = vfma(d0, v, a01)
                a11 = vfma(d1, v, a11)
                v = vload_n(x, p + 2, count) if nk > 2 else vzero(x)
                a02 = vfma(d0, v, a02)
                a12 = vfma(d1, v, a12)
                v = vload_n(x, p + 3, count) if nk > 3 else vzero(x)
                a03 = vfma(d0, v, a03)
                a13 = vfma(d1, v, a13)
                v = vload_n(x, p + 4, count) if nk > 4 else vzero(x)
                a04 = vfma(d0, v, a04)
                a14 = vfma(d1, v, a14)
                p += L
                q += L
    return a00, a01, a02, a03, a04, a10, a11, a12, a13, a14


@kernel(cache=True, nogil=True, fastmath=True)
def conv_forward(act, first, n, x_off, y_off, params, w_off, b_off, C, H, W, O, Ho, Wo, K):
    """``Y = W * X + b`` for rows ``first:first+n`` of ``act``, written into the same rows.

    Args:
        act: the examples' activation rows: ``X[c, y, x]`` is ``act[b, x_off + (c * H + y) * W
            + x]``, and ``Y[o, oy, ox]`` is written to ``act[b, y_off + (o * Ho + oy) * Wo +
            ox]``.
        params: ``W[o, c, ky, kx]`` is ``params[w_off + ((o * C + c) * K + ky) * K + kx]`` and
            ``b[o]`` is ``params[b_off + o]``.
        C, H, W, O, Ho, Wo, K: the layer's shape (stride 1, no padding: ``Ho = H - K + 1``).
    """
    L = lanes(act)
    chunks = (Wo + L - 1) // L
    positions = Ho * chunks
    stride = act.strides[0] // act.itemsize
    taps = C * K * K
    # Raw pointers for the inlined helpers: arrays passed to them are counted references.
    a, w = data_ptr(act), data_ptr(params)
    for b in range(first, first + n):
        row = b * stride
        for o0 in range(0, O, MAPS):
            maps = min(MAPS, O - o0)
            for i in range(0, positions, 2):
                oy0, ch0 = i // chunks, i % chunks
                count0 = min(L, Wo - ch0 * L)
                px0 = row + x_off + oy0 * W + ch0 * L
                py0 = row + y_off + o0 * Ho * Wo + oy0 * Wo + ch0 * L
                count1, px1, py1 = 0, px0, py0
                if i + 1 < positions:
                    oy1, ch1 = (i + 1) // chunks, (i + 1) % chunks
                    count1 = min(L, Wo - ch1 * L)
                    px1 = row + x_off + oy1 * W + ch1 * L
                    py1 = row + y_off + o0 * Ho * Wo + oy1 * Wo + ch1 * L
                pw = w_off + o0 * taps
                if maps == MAPS and count0 == L and count1 == L:
                    acc = _forward_block(a, px0, px1, w, pw, taps, C, H, W, K)
                else:
                    acc = _forward_block_edge(
                        a, px0, px1, count0, count1, w, pw, taps, maps, C, H, W, K
                    )
                plane = Ho * Wo
                for m in range(maps):
                    bias = vsplat(a, params[b_off + o0 + m])
                    _store(a, py0 + m * plane, vadd(acc[2 * m], bias), count0, L)
                    if count1:
                        _store(a, py1 + m * plane, vadd(acc[2 * m + 1], bias), count1, L)


@njit(cache=True, nogil=True, fastmath=True)
def _store(a, at, value, count, L):
    if count == L:
        vstore(a, at, value)
    else:
        vstore_n(a, at, value, count)


@njit(cache=True, nogil=True, fastmath=True)
def _forward_block(a, px0, px1, w, pw, taps, C, H, W, K):
    """Five maps times two full output vectors: ``(m0 v0, m0 v1, m1 v0, ..., m4 v1)``."""
    c00 = vzero(a)
    c01 = vzero(a)
    c10 = vzero(a)
    c11 = vzero(a)
    c20 = vzero(a)
    c21 = vzero(a)
    c30 = vzero(a)
    c31 = vzero(a)
    c40 = vzero(a)
    c41 = vzero(a)
    tap = pw
    for c in range(C):
        for ky in range(K):
            line = (c * H + ky) * W
            for kx in range(K):
                x0 = vload(a, px0 + line + kx)
                x1 = vload(a, px1 + line + kx)
                v = vbload(w, tap)
                c00 = vfma(v, x0, c00)
                c01 = vfma(v, x1, c01)
                v = vbload(w, tap + taps)
                c10 = vfma(v, x0, c10)
                c11 = vfma(v, x1, c11)
                v = vbload(w, tap + 2 * taps)
                c20 = vfma(v, x0, c20)
                c21 = vfma(v, x1, c21)
                v = vbload(w, tap + 3 * taps)
                c30 = vfma(v, x0, c30)
                c31 = vfma(v, x1, c31)
                v = vbload(w, tap + 4 * taps)
                c40 = vfma(v, x0, c40)
                c41 = vfma(v, x1, c41)
                tap += 1
    return c00, c01, c10, c11, c20, c21, c30, c31, c40, c41


@njit(cache=True, nogil=True, fastmath=True)
def _forward_block_edge(a, px0, px1, count0, count1, w, pw, taps, maps, C, H, W, K):
    """:func:`_forward_block` for partial vectors (``count0``, ``count1`` lanes; 0: none) or
    fewer than five maps (``maps``): loads are masked, absent maps' weights are zeros."""
    c00 = vzero(a)
    c01 = vzero(a)
    c10 = vzero(a)
    c11 = vzero(a)
    c20 = vzero(a)
    c21 = vzero(a)
    c30 = vzero(a)
    c31 = vzero(a)
    c40 = vzero(a)
    c41 = vzero(a)
    zero = vzero(a)
    tap = pw
    for c in range(C):
        for ky in range(K):
            line = (c * H + ky) * W
            for kx in range(K):
                x0 = vload_n(a, px0 + line + kx, count0)
                x1 = vload_n(a, px1 + line + kx, count1)
                v = vbload(w, tap)
                c00 = vfma(v, x0, c00)
                c01 = vfma(v, x1, c01)
                v = vbload(w, tap + taps) if maps > 1 else zero
                c10 = vfma(v, x0, c10)
                c11 = vfma(v, x1, c11)
                v = vbload(w, tap + 2 * taps) if maps > 2 else zero
                c20 = vfma(v, x0, c20)
                c21 = vfma(v, x1, c21)
                v = vbload(w, tap + 3 * taps) if maps > 3 else zero
                c30 = vfma(v, x0, c30)
                c31 = vfma(v, x1, c31)
                v = vbload(w, tap + 4 * taps) if maps > 4 else zero
                c40 = vfma(v, x0, c40)
                c41 = vfma(v, x1, c41)
                tap += 1
    return c00, c01, c10, c11, c20, c21, c30, c31, c40, c41
