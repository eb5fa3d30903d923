"""The direct convolution kernels against numpy, on the shapes that exercise their blocks.

Each case stores the examples' inputs and output gradients inside larger activation rows (at an
offset, with other values around them, and rows before and after the ones used) and checks that
the forward output and the gradient added into ``grad`` are numpy's in float64, and that nothing
outside the layer's output or weights changes. The shapes cover Adam's two convolutions, a row
of several vectors with a partial last one, a row shorter than one vector, output maps that do
not fill the last block, kernels of 3 (fewer than a block's five columns), 7 and 10 (two column
blocks), and groups of examples (Adam's second convolution has only one vector per row), in
float32, the engine's float type. tests/unit/test_other_width.py runs them again with the other
vector width (64 bytes on an AVX2 host, 32 on an AVX-512 one), in a process of its own.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from hogwild.model.conv_direct import conv_forward, conv_weight_grad, direct_applies
from hogwild.model.simd import VECTOR_BYTES

# tests.warm_kernels compiles the kernels these tests call (the jobs'): marked warmed_kernels,
# they run once those are in numba's cache. tests/unit/test_other_width.py runs them again with
# the vector width this host does not run.
WARMED = pytest.mark.warmed_kernels

if os.environ.get("HOGWILD_SIMD_BYTES"):  # the child of tests/unit/test_other_width.py
    assert VECTOR_BYTES == int(os.environ["HOGWILD_SIMD_BYTES"])

SHAPES = [  # (C, H, W, O, K, examples)
    (1, 28, 28, 10, 5, 3),  # Adam's first convolution
    (10, 12, 12, 20, 5, 9),  # Adam's second: one vector per row, examples in groups
    (3, 9, 13, 3, 3, 2),  # odd maps, three columns per block
    (2, 11, 30, 5, 7, 4),  # two column blocks (5 + 2), a partial vector
    (1, 5, 5, 1, 5, 1),  # one output pixel
    (2, 20, 40, 4, 10, 3),  # two full column blocks
    (1, 6, 2 * VECTOR_BYTES // 4 + 8, 2, 5, 2),  # two full vectors and a partial one
]
X_OFF, Y_OFF, W_OFF = 3, 7, 4
FIRST = 1  # rows before the examples, and one after them


def _reference(x: np.ndarray, dy: np.ndarray, K: int) -> np.ndarray:
    """dW[o, c, ky, kx] = sum over examples and pixels of dY[o, oy, ox] X[c, oy+ky, ox+kx]."""
    _, _, Ho, Wo = dy.shape
    dw = np.zeros((dy.shape[1], x.shape[1], K, K))
    for ky in range(K):
        for kx in range(K):
            window = x[:, :, ky : ky + Ho, kx : kx + Wo]
            dw[:, :, ky, kx] = np.einsum("bopq,bcpq->oc", dy, window)
    return dw


@WARMED
@pytest.mark.parametrize("shape", SHAPES, ids=[str(s) for s in SHAPES])
def test_the_gradient_is_numpys_and_nothing_else_is_written(shape):
    dtype = np.float32  # the engine's only float type (hogwild.model.simd)
    C, H, W, O, K, n = shape  # noqa: E741 (the tensor-dimension names of the kernels)
    Ho, Wo = H - K + 1, W - K + 1
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal((n, C, H, W))
    dy = rng.standard_normal((n, O, Ho, Wo))
    act = rng.standard_normal((n + 2 * FIRST, X_OFF + C * H * W + 5)).astype(dtype)
    dact = rng.standard_normal((n + 2 * FIRST, Y_OFF + O * Ho * Wo + 5)).astype(dtype)
    act[FIRST : FIRST + n, X_OFF : X_OFF + C * H * W] = x.reshape(n, -1)
    dact[FIRST : FIRST + n, Y_OFF : Y_OFF + O * Ho * Wo] = dy.reshape(n, -1)
    size = O * C * K * K
    grad = rng.standard_normal(W_OFF + size + 3).astype(dtype)
    before = grad.copy()
    act_before, dact_before = act.copy(), dact.copy()

    conv_weight_grad(act, dact, FIRST, n, X_OFF, Y_OFF, grad, W_OFF, C, H, W, O, Ho, Wo, K)

    stored_x = act[FIRST : FIRST + n, X_OFF : X_OFF + C * H * W].reshape(n, C, H, W)
    stored_dy = dact[FIRST : FIRST + n, Y_OFF : Y_OFF + O * Ho * Wo].reshape(n, O, Ho, Wo)
    expected = _reference(stored_x.astype(np.float64), stored_dy.astype(np.float64), K)
    added = grad[W_OFF : W_OFF + size].astype(np.float64) - before[W_OFF : W_OFF + size]
    tolerance = 1e-5
    scale = np.abs(expected).max()
    assert np.abs(added - expected.reshape(-1)).max() <= tolerance * scale
    assert (grad[:W_OFF] == before[:W_OFF]).all()
    assert (grad[W_OFF + size :] == before[W_OFF + size :]).all()
    assert (act == act_before).all() and (dact == dact_before).all()


@WARMED
@pytest.mark.parametrize("shape", SHAPES, ids=[str(s) for s in SHAPES])
def test_the_forward_output_is_numpys_and_nothing_else_is_written(shape):
    dtype = np.float32
    C, H, W, O, K, n = shape  # noqa: E741 (the tensor-dimension names of the kernels)
    Ho, Wo = H - K + 1, W - K + 1
    y_off = X_OFF + C * H * W + 2  # the output region follows the input region, as in a network
    rng = np.random.default_rng(sum(shape) + 1)
    act = rng.standard_normal((n + 2 * FIRST, y_off + O * Ho * Wo + 5)).astype(dtype)
    size = O * C * K * K
    params = rng.standard_normal(W_OFF + size + O + 3).astype(dtype)
    b_off = W_OFF + size
    before = act.copy()

    conv_forward(act, FIRST, n, X_OFF, y_off, params, W_OFF, b_off, C, H, W, O, Ho, Wo, K)

    x = before[FIRST : FIRST + n, X_OFF : X_OFF + C * H * W].reshape(n, C, H, W)
    weights = params[W_OFF:b_off].reshape(O, C, K, K).astype(np.float64)
    expected = np.zeros((n, O, Ho, Wo)) + params[b_off : b_off + O, None, None]
    for ky in range(K):
        for kx in range(K):
            window = x[:, :, ky : ky + Ho, kx : kx + Wo].astype(np.float64)
            expected += np.einsum("oc,bcpq->bopq", weights[:, :, ky, kx], window)
    got = act[FIRST : FIRST + n, y_off : y_off + O * Ho * Wo].reshape(n, O, Ho, Wo)
    tolerance = 1e-5
    assert np.abs(got - expected).max() <= tolerance * np.abs(expected).max()
    untouched = np.ones(act.shape, dtype=bool)
    untouched[FIRST : FIRST + n, y_off : y_off + O * Ho * Wo] = False
    assert (act[untouched] == before[untouched]).all()


@WARMED
def test_it_applies_to_stride_one_without_padding_only():
    assert direct_applies(1, 0)
    assert not direct_applies(2, 0)
    assert not direct_applies(1, 1)
