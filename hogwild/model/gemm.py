"""One register-blocked matrix-product kernel, ``C (op)= A @ B``, for every layer's products.

Adam section 3.2.4 reached its speed with hand-packed kernels whose working sets fit the caches.
This is the same design in numba: the left operand ``A`` is packed by :func:`pack_a` into panels
of ``MR`` rows, laid out so that one step of the reduction reads ``MR`` consecutive values; the
kernel :func:`gemm` keeps an ``MR x 2`` block of SIMD vectors of ``C`` in registers (10
accumulators: five rows of ``A`` times two vectors of a row of ``B``) through the whole reduction,
reading per step two vectors of ``B`` and broadcasting five values of ``A``: ten fused
multiply-adds for seven loads. Blocks of ``C`` are visited so that the part of the larger
operand in use stays in cache: panel by panel of ``A`` when it has more rows than ``B`` has
columns, else column panel by column panel of ``B`` (``K`` rows of two vectors) while every panel
of ``A`` passes over it. ``B`` and ``C`` are read and written in place, through offsets and
leading dimensions, so the layers' activation rows are operands without copies; a partial last
vector is read and written with masks, so nothing beyond a row is touched.

Why not BLAS: the layers' products are small and oddly shaped (Adam's first convolution is
``10 x 25`` times ``25 x 576`` per example, the second's weight gradient ``20 x 64`` times
``64 x 250``), where OpenBLAS's sgemm spends most of its time outside its kernel, far below its
own speed on large matrices; this kernel runs them faster (``tests/unit/test_gemm.py`` checks
its results against numpy).

How a block of ``C`` is written is the epilogue, chosen by ``mode``:

* ``SET``: ``C = acc``; ``ADD``: ``C += acc``;
* ``BIAS``: ``C = acc + aux[aux_off + row]`` (a layer's bias, one value per row);
* ``SGD``: ``C += s0 * C + s1 * acc`` (a weight update in place: ``s0 = -lr * wd``,
  ``s1 = -lr * scale``; the update is summed before it is added, as the per-example kernels do,
  rather than scaling ``C`` by ``1 - lr * wd``, a factor float32 rounds by up to 3e-8);
* ``MOMENTUM``: ``v = s0 * v + s1 * acc + s2 * C; C -= s3 * v`` with the velocity ``v`` in
  ``aux`` at the same offsets as ``C`` (``s0 = mu``, ``s1 = scale``, ``s2 = wd``, ``s3 = lr``).

So the gradient of a fully connected layer over a minibatch is never materialised: its blocks are
applied to the weights as they leave the registers.
"""

from numba import njit

from hogwild.jit import kernel
from hogwild.model.scratch_sizes import MR  # rows of A per panel (and of a register block of C)
from hogwild.model.scratch_sizes import packed_size as _packed_size
from hogwild.model.simd import (
    data_ptr,
    lanes,
    vadd,
    vbload,
    vfma,
    vload,
    vload_n,
    vmul,
    vsplat,
    vstore,
    vstore_n,
    vsub,
    vzero,
)

SET, ADD, BIAS, SGD, MOMENTUM = range(5)


# Floats pack_a writes for an m x k matrix, callable from the kernels (the arithmetic's one source
# is hogwild.model.scratch_sizes, which plans networks without compiled code).
packed_size = kernel(cache=True, nogil=True)(_packed_size)


@kernel(cache=True, nogil=True, fastmath=True)
def pack_a(a, a_off, lda_m, lda_k, M, K, ap):
    """Pack ``A[m, k] = a[a_off + m * lda_m + k * lda_k]`` into panels of ``MR`` rows.

    ``ap[(i * K + k) * MR + r] = A[i * MR + r, k]``, zeros for the rows beyond ``M``.
    """
    for i in range(0, (M + MR - 1) // MR):
        base = i * K * MR
        for r in range(MR):
            m = i * MR + r
            if m < M:
                src = a_off + m * lda_m
                for k in range(K):
                    ap[base + k * MR + r] = a[src + k * lda_k]
            else:
                for k in range(K):
                    ap[base + k * MR + r] = 0.0


@njit(cache=True, nogil=True, fastmath=True)
def _block_full(ap, pa, b, pb, ldb, K, L):
    """The 5 x 2-vector block of ``A @ B`` for full vectors of ``B``."""
    c00 = vzero(b)
    c01 = vzero(b)
    c10 = vzero(b)
    c11 = vzero(b)
    c20 = vzero(b)
    c21 = vzero(b)
    c30 = vzero(b)
    c31 = vzero(b)
    c40 = vzero(b)
    c41 = vzero(b)
    for _ in range(K):
        b0 = vload(b, pb)
        b1 = vload(b, pb + L)
        w = vbload(ap, pa)
        c00 = vfma(w, b0, c00)
        c01 = vfma(w, b1, c01)
        w = vbload(ap, pa + 1)
        c10 = vfma(w, b0, c10)
        c11 = vfma(w, b1, c11)
        w = vbload(ap, pa + 2)
        c20 = vfma(w, b0, c20)
        c21 = vfma(w, b1, c21)
        w = vbload(ap, pa + 3)
        c30 = vfma(w, b0, c30)
        c31 = vfma(w, b1, c31)
        w = vbload(ap, pa + 4)
        c40 = vfma(w, b0, c40)
        c41 = vfma(w, b1, c41)
        pa += MR
        pb += ldb
    return c00, c01, c10, c11, c20, c21, c30, c31, c40, c41


@njit(cache=True, nogil=True, fastmath=True)
def _block_masked(ap, pa, b, pb, ldb, K, L, n):
    """The same block when only the first ``n`` (< 2 vectors) columns of ``B`` exist."""
    c00 = vzero(b)
    c01 = vzero(b)
    c10 = vzero(b)
    c11 = vzero(b)
    c20 = vzero(b)
    c21 = vzero(b)
    c30 = vzero(b)
    c31 = vzero(b)
    c40 = vzero(b)
    c41 = vzero(b)
    for _ in range(K):
        b0 = vload_n(b, pb, n)
        b1 = vload_n(b, pb + L, n - L)
        w = vbload(ap, pa)
        c00 = vfma(w, b0, c00)
        c01 = vfma(w, b1, c01)
        w = vbload(ap, pa + 1)
        c10 = vfma(w, b0, c10)
        c11 = vfma(w, b1, c11)
        w = vbload(ap, pa + 2)
        c20 = vfma(w, b0, c20)
        c21 = vfma(w, b1, c21)
        w = vbload(ap, pa + 3)
        c30 = vfma(w, b0, c30)
        c31 = vfma(w, b1, c31)
        w = vbload(ap, pa + 4)
        c40 = vfma(w, b0, c40)
        c41 = vfma(w, b1, c41)
        pa += MR
        pb += ldb
    return c00, c01, c10, c11, c20, c21, c30, c31, c40, c41


@njit(cache=True, nogil=True, fastmath=True)
def _finish(c, pc, acc, mode, aux, pa, s0, s1, s2, s3):
    """One vector of the block, combined with what is at ``c[pc:]`` as ``mode`` says."""
    if mode == SET:
        return acc
    if mode == ADD:
        return vadd(acc, vload(c, pc))
    if mode == BIAS:
        return vadd(acc, vbload(aux, pa))
    old = vload(c, pc)
    if mode == SGD:
        return vadd(old, vfma(vsplat(c, s0), old, vmul(vsplat(c, s1), acc)))
    v = vfma(vsplat(c, s0), vload(aux, pc), vfma(vsplat(c, s1), acc, vmul(vsplat(c, s2), old)))
    vstore(aux, pc, v)
    return vsub(old, vmul(vsplat(c, s3), v))


@njit(cache=True, nogil=True, fastmath=True)
def _finish_n(c, pc, acc, n, mode, aux, pa, s0, s1, s2, s3):
    """:func:`_finish` for a vector of which only the first ``n`` lanes exist."""
    if mode == SET:
        return acc
    if mode == ADD:
        return vadd(acc, vload_n(c, pc, n))
    if mode == BIAS:
        return vadd(acc, vbload(aux, pa))
    old = vload_n(c, pc, n)
    if mode == SGD:
        return vadd(old, vfma(vsplat(c, s0), old, vmul(vsplat(c, s1), acc)))
    v = vfma(vsplat(c, s0), vload_n(aux, pc, n), vfma(vsplat(c, s1), acc, vmul(vsplat(c, s2), old)))
    vstore_n(aux, pc, v, n)
    return vsub(old, vmul(vsplat(c, s3), v))


@njit(cache=True, nogil=True, fastmath=True)
def _store_row(c, pc, a0, a1, n, L, mode, aux, pa, s0, s1, s2, s3):
    """Write one row of a block: ``n`` columns (two full vectors when ``n == 2 * L``)."""
    if n == 2 * L:
        vstore(c, pc, _finish(c, pc, a0, mode, aux, pa, s0, s1, s2, s3))
        vstore(c, pc + L, _finish(c, pc + L, a1, mode, aux, pa, s0, s1, s2, s3))
    elif n > L:
        vstore(c, pc, _finish(c, pc, a0, mode, aux, pa, s0, s1, s2, s3))
        r = n - L
        vstore_n(c, pc + L, _finish_n(c, pc + L, a1, r, mode, aux, pa, s0, s1, s2, s3), r)
    else:
        vstore_n(c, pc, _finish_n(c, pc, a0, n, mode, aux, pa, s0, s1, s2, s3), n)


@kernel(cache=True, nogil=True, fastmath=True)
def gemm(c, c_off, ldc, ap, b, b_off, ldb, M, N, K, mode, aux, aux_off, s0, s1, s2, s3):
    """``C[m, n] (op)= sum_k A[m, k] B[k, n]`` for ``m < M``, ``n < N``, ``k < K``.

    Args:
        c: ``C[m, n]`` is ``c[c_off + m * ldc + n]``.
        ap: ``A``, packed by :func:`pack_a` (``M`` rows, ``K`` columns).
        b: ``B[k, n]`` is ``b[b_off + k * ldb + n]``.
        mode: the epilogue (``SET``, ``ADD``, ``BIAS``, ``SGD``, ``MOMENTUM``; see the module).
        aux: the bias (``BIAS``, row m at ``aux_off + m``) or the velocity (``MOMENTUM``, at the
            offsets of ``C``); unused otherwise (pass any array of ``c``'s type).
        s0, s1, s2, s3: the epilogue's scalars.

    Each mode has its own compiled loop nest, so its epilogue is fixed at compile time: with the
    mode a run-time value inside the loops, its branches kept the accumulators from staying in
    registers between blocks, and small products ran at a fifth of the speed.
    """
    if mode == SET:
        _gemm_set(c, c_off, ldc, ap, b, b_off, ldb, M, N, K)
    elif mode == ADD:
        _gemm_add(c, c_off, ldc, ap, b, b_off, ldb, M, N, K)
    elif mode == BIAS:
        _gemm_bias(c, c_off, ldc, ap, b, b_off, ldb, M, N, K, aux, aux_off)
    elif mode == SGD:
        _gemm_sgd(c, c_off, ldc, ap, b, b_off, ldb, M, N, K, s0, s1)
    else:
        _gemm_momentum(c, c_off, ldc, ap, b, b_off, ldb, M, N, K, aux, s0, s1, s2, s3)


@kernel(cache=True, nogil=True, fastmath=True)
def _gemm_set(c, c_off, ldc, ap, b, b_off, ldb, M, N, K):
    _loops(c, c_off, ldc, ap, b, b_off, ldb, M, N, K, SET, c, 0, 0.0, 0.0, 0.0, 0.0)


@kernel(cache=True, nogil=True, fastmath=True)
def _gemm_add(c, c_off, ldc, ap, b, b_off, ldb, M, N, K):
    _loops(c, c_off, ldc, ap, b, b_off, ldb, M, N, K, ADD, c, 0, 0.0, 0.0, 0.0, 0.0)


@kernel(cache=True, nogil=True, fastmath=True)
def _gemm_bias(c, c_off, ldc, ap, b, b_off, ldb, M, N, K, aux, aux_off):
    _loops(c, c_off, ldc, ap, b, b_off, ldb, M, N, K, BIAS, aux, aux_off, 0.0, 0.0, 0.0, 0.0)


@kernel(cache=True, nogil=True, fastmath=True)
def _gemm_sgd(c, c_off, ldc, ap, b, b_off, ldb, M, N, K, s0, s1):
    _loops(c, c_off, ldc, ap, b, b_off, ldb, M, N, K, SGD, c, 0, s0, s1, 0.0, 0.0)


@kernel(cache=True, nogil=True, fastmath=True)
def _gemm_momentum(c, c_off, ldc, ap, b, b_off, ldb, M, N, K, aux, s0, s1, s2, s3):
    _loops(c, c_off, ldc, ap, b, b_off, ldb, M, N, K, MOMENTUM, aux, 0, s0, s1, s2, s3)


@njit(cache=True, nogil=True, fastmath=True)
def _loops(c, c_off, ldc, ap, b, b_off, ldb, M, N, K, mode, aux, aux_off, s0, s1, s2, s3):
    """Every block of ``C``, in the order that keeps the larger operand's part in cache.

    When ``A`` is the larger, each of its panels stays in cache while every column panel of ``B``
    passes over it; otherwise each column panel of ``B`` stays while every panel of ``A`` passes.
    """
    L = lanes(b)
    # Raw pointers for the inlined helpers: arrays passed to them are counted references.
    c, ap, b, aux = data_ptr(c), data_ptr(ap), data_ptr(b), data_ptr(aux)
    row_blocks = (M + MR - 1) // MR
    column_blocks = (N + 2 * L - 1) // (2 * L)
    a_outer = M > N
    outer = row_blocks if a_outer else column_blocks
    inner = column_blocks if a_outer else row_blocks
    for i in range(outer):
        for j in range(inner):
            m0 = (i if a_outer else j) * MR
            n0 = (j if a_outer else i) * 2 * L
            _block(
                c,
                c_off,
                ldc,
                ap,
                b,
                b_off,
                ldb,
                M,
                N,
                K,
                mode,
                aux,
                aux_off,
                s0,
                s1,
                s2,
                s3,
                m0,
                n0,
                L,
            )


@njit(cache=True, nogil=True, fastmath=True)
def _block(
    c, c_off, ldc, ap, b, b_off, ldb, M, N, K, mode, aux, aux_off, s0, s1, s2, s3, m0, n0, L
):
    """The block of ``C`` at rows ``m0:m0+MR``, columns ``n0:n0+2L``."""
    n = min(2 * L, N - n0)
    pa = m0 * K
    pb = b_off + n0
    if n == 2 * L:
        acc = _block_full(ap, pa, b, pb, ldb, K, L)
    else:
        acc = _block_masked(ap, pa, b, pb, ldb, K, L, n)
    rows = min(MR, M - m0)
    pc = c_off + m0 * ldc + n0
    bias = aux_off + m0
    _store_row(c, pc, acc[0], acc[1], n, L, mode, aux, bias, s0, s1, s2, s3)
    if rows > 1:
        pc += ldc
        _store_row(c, pc, acc[2], acc[3], n, L, mode, aux, bias + 1, s0, s1, s2, s3)
    if rows > 2:
        pc += ldc
        _store_row(c, pc, acc[4], acc[5], n, L, mode, aux, bias + 2, s0, s1, s2, s3)
    if rows > 3:
        pc += ldc
        _store_row(c, pc, acc[6], acc[7], n, L, mode, aux, bias + 3, s0, s1, s2, s3)
    if rows > 4:
        pc += ldc
        _store_row(c, pc, acc[8], acc[9], n, L, mode, aux, bias + 4, s0, s1, s2, s3)
