"""The register-blocked product kernel (hogwild/model/gemm.py) against numpy, in every mode.

Shapes cover full and partial register blocks in both directions (rows not a multiple of the
panel height, columns not a multiple of the block width, a single column), both visiting orders
(more rows than columns and fewer), operands at offsets inside larger arrays with leading
dimensions wider than the product: and nothing outside ``C`` is written. In float32, the
engine's only float type (:mod:`hogwild.model.simd` refuses another when it compiles).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from hogwild.model.gemm import ADD, BIAS, MOMENTUM, SET, SGD, gemm, pack_a, packed_size
from hogwild.model.simd import VECTOR_BYTES

# tests.warm_kernels compiles the kernels these tests call (the jobs'): marked warmed_kernels,
# they run once those are in numba's cache. tests/unit/test_other_width.py runs them again with
# the vector width this host does not run.
WARMED = pytest.mark.warmed_kernels

if os.environ.get("HOGWILD_SIMD_BYTES"):  # the child of tests/unit/test_other_width.py
    assert VECTOR_BYTES == int(os.environ["HOGWILD_SIMD_BYTES"])

SHAPES = [  # (M, K, N)
    (1, 1, 1),
    (5, 3, 16),
    (7, 20, 9),
    (13, 1, 33),
    (10, 25, 576),
    (250, 20, 64),
    (20, 64, 250),
    (4, 9, 2 * VECTOR_BYTES // 4 + 3),
]
LEAD = 5  # extra columns beyond each row of a stored operand
OFFSET = 7  # where each operand starts inside its array


def _stored(matrix: np.ndarray) -> tuple[np.ndarray, int]:
    """``matrix`` inside a larger flat array at OFFSET with leading dimension cols + LEAD."""
    rows, cols = matrix.shape
    ld = cols + LEAD
    flat = np.full(OFFSET + rows * ld + OFFSET, -7.0, dtype=matrix.dtype)
    flat[OFFSET : OFFSET + rows * ld].reshape(rows, ld)[:, :cols] = matrix
    return flat, ld


def _matrix(flat: np.ndarray, rows: int, cols: int) -> np.ndarray:
    ld = cols + LEAD
    return flat[OFFSET : OFFSET + rows * ld].reshape(rows, ld)[:, :cols]


def _outside(flat: np.ndarray, rows: int, cols: int) -> np.ndarray:
    mask = np.ones(flat.shape, dtype=bool)
    ld = cols + LEAD
    mask[OFFSET : OFFSET + rows * ld].reshape(rows, ld)[:, :cols] = False
    return flat[mask]


@WARMED
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mode", [SET, ADD, BIAS, SGD, MOMENTUM])
def test_every_mode_matches_numpy(mode, shape):
    m, k, n = shape
    dtype = np.float32
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    c0 = rng.standard_normal((m, n)).astype(dtype)
    a_flat, lda = _stored(a)
    packed = np.full(packed_size(m, k), np.nan, dtype=dtype)
    pack_a(a_flat, OFFSET, lda, 1, m, k, packed)
    b_flat, ldb = _stored(b)
    c_flat, ldc = _stored(c0)
    bias = rng.standard_normal(OFFSET + m).astype(dtype)
    velocity0 = rng.standard_normal(c_flat.shape).astype(dtype)
    velocity = velocity0.copy()
    s0, s1, s2, s3 = 0.9, -0.25, 0.01, 0.5
    product = a.astype(np.float64) @ b.astype(np.float64)
    if mode == BIAS:
        aux, aux_off = bias, OFFSET
        expected = product + bias[OFFSET : OFFSET + m, None]
    elif mode == MOMENTUM:
        aux, aux_off = velocity, 0
        v = s0 * _matrix(velocity0, m, n) + s1 * product + s2 * c0
        expected = c0 - s3 * v
    else:
        aux, aux_off = c_flat, 0
        expected = {SET: product, ADD: c0 + product, SGD: c0 + s0 * c0 + s1 * product}[mode]
    before = c_flat.copy()

    gemm(
        c_flat,
        OFFSET,
        ldc,
        packed,
        b_flat,
        OFFSET,
        ldb,
        m,
        n,
        k,
        mode,
        aux,
        aux_off,
        s0,
        s1,
        s2,
        s3,
    )

    tolerance = 1e-4
    scale = 1.0 + np.abs(expected).max()
    np.testing.assert_allclose(_matrix(c_flat, m, n), expected, rtol=0, atol=tolerance * scale * k)
    np.testing.assert_array_equal(_outside(c_flat, m, n), _outside(before, m, n))
    if mode == MOMENTUM:
        np.testing.assert_allclose(_matrix(velocity, m, n), v, rtol=0, atol=tolerance * scale * k)
        np.testing.assert_array_equal(_outside(velocity, m, n), _outside(velocity0, m, n))


@WARMED
def test_a_transposed_operand_packs_by_its_strides():
    """``pack_a`` with row stride 1 and column stride ld reads ``A^T`` of a stored matrix."""
    rng = np.random.default_rng(3)
    stored = rng.standard_normal((6, 11)).astype(np.float32)  # A = stored^T is 11 x 6
    flat, ld = _stored(stored)
    packed = np.zeros(packed_size(11, 6), dtype=np.float32)
    pack_a(flat, OFFSET, 1, ld, 11, 6, packed)
    b = rng.standard_normal((6, 19)).astype(np.float32)
    c = np.zeros(11 * 19, dtype=np.float32)
    gemm(c, 0, 19, packed, b.ravel(), 0, 19, 11, 19, 6, SET, c, 0, 0.0, 0.0, 0.0, 0.0)
    np.testing.assert_allclose(c.reshape(11, 19), stored.T @ b, rtol=1e-5, atol=1e-5)


@WARMED
def test_packed_rows_beyond_the_matrix_are_zeros():
    a = np.arange(1, 1 + 7 * 3, dtype=np.float32)
    packed = np.full(packed_size(7, 3), np.nan, dtype=np.float32)
    pack_a(a, 0, 3, 1, 7, 3, packed)
    assert packed.size == 10 * 3
    second_panel = packed[15:].reshape(3, 5)  # rows 5..9 of A, k-major
    np.testing.assert_array_equal(second_panel[:, 2:], 0.0)
    np.testing.assert_array_equal(second_panel[:, :2], a.reshape(7, 3)[5:7].T)


@WARMED
def test_a_float64_operand_is_refused_when_the_kernel_is_compiled():
    """float32 is the engine's float type: a float64 variant would be a second compile that
    nothing runs, so typing one fails, naming the type (hogwild.model.simd)."""
    a = np.zeros(4)
    with pytest.raises(TypeError, match="SIMD kernels take float32 arrays"):
        gemm(a, 0, 2, a, a, 0, 2, 2, 2, 2, SET, a, 0, 0.0, 0.0, 0.0, 0.0)
