"""A convolution's weight gradient computed straight from its input and its output gradient.

For a convolution of stride 1 without padding, over examples ``b``::

    dW[o, c, ky, kx] += sum_b sum_oy sum_ox dY_b[o, oy, ox] * X_b[c, oy + ky, ox + kx]

The route through a matrix product (:mod:`hogwild.model.batch_kernels`) first unfolds the input
pixel-major, copying every input value ``K * K`` times, and packs ``dY``; for Adam's small
convolutions those copies cost more than the arithmetic (about 21 of a backward pass's 111 us
per example on a 2-core AMD EPYC). Here nothing is copied: one SIMD step reads a vector of ``dY``
along ``ox`` for two output maps and the five input vectors that vector meets at five
consecutive ``kx`` (unaligned loads of one input row), and does ten fused multiply-adds into ten
accumulators (two maps times five ``kx``) that stay in registers across examples, rows and
column chunks. Their lanes are summed once per block, when the block's ``dW`` values are added
into the gradient. A row's last, partial vector is read with masks, so nothing beyond it is
touched.

Examples go through a block in groups of ``G``, with ``G`` the fewest that give a block at least
:data:`MIN_STEPS` steps (Adam's second convolution has only 8 rows of one vector per example:
one example per block would spend as long summing lanes as multiplying), so that a group's
activations stay in cache while every block passes over them.
"""

from numba import njit

from hogwild.model.simd import data_ptr, lanes, vfma, vhsum, vload, vload_n, vzero

KB = 5  # kernel columns (kx) per block
MIN_STEPS = 64  # SIMD steps per block worth one lane sum per accumulator


@njit(cache=True, nogil=True)
def direct_weight_grad_applies(S, P):
    """Whether :func:`conv_weight_grad` computes this convolution's weight gradient."""
    return S == 1 and P == 0


@njit(cache=True, nogil=True, fastmath=True)
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
    L = lanes(grad)
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
    (``nk``): every load is masked, and the absent map's and columns' loads read nothing."""
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
                d0 = vload_n(d, q, count)
                d1 = vload_n(d, q + plane, count if two else 0)
                v = vload_n(x, p, count)
                a00 = vfma(d0, v, a00)
                a10 = vfma(d1, v, a10)
                v = vload_n(x, p + 1, count if nk > 1 else 0)
                a01 = vfma(d0, v, a01)
                a11 = vfma(d1, v, a11)
                v = vload_n(x, p + 2, count if nk > 2 else 0)
                a02 = vfma(d0, v, a02)
                a12 = vfma(d1, v, a12)
                v = vload_n(x, p + 3, count if nk > 3 else 0)
                a03 = vfma(d0, v, a03)
                a13 = vfma(d1, v, a13)
                v = vload_n(x, p + 4, count if nk > 4 else 0)
                a04 = vfma(d0, v, a04)
                a14 = vfma(d1, v, a14)
                p += L
                q += L
    return a00, a01, a02, a03, a04, a10, a11, a12, a13, a14
