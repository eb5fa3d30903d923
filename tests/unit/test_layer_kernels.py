"""Max-pooling's arg-max on ties, the pool with the relu fused in, and relu forward and backward,
against plain Python.

The PyTorch oracle tests draw continuous values, which never tie; here the inputs are small
integers, so most windows hold several equal maxima. The backward pass routes a window's gradient
to the recorded arg-max, so which of the equal inputs wins is part of the kernel's contract: the
first in reading order (row by row), for the 2x2 stride-2 window's own loop and for the general
one.
"""

from __future__ import annotations

import numpy as np
import pytest

from hogwild.model.layer_kernels import (
    activation_backward,
    activation_forward,
    maxpool_backward,
    maxpool_forward,
)

# it calls kernels tests.warm_kernels compiles: it runs once they are in numba's cache
pytestmark = pytest.mark.warmed_kernels


def _reference_pool(x, C, H, W, K, S):
    Ho, Wo = (H - K) // S + 1, (W - K) // S + 1
    y = np.zeros(C * Ho * Wo, dtype=x.dtype)
    at = np.zeros(C * Ho * Wo, dtype=np.int32)
    for c in range(C):
        for oy in range(Ho):
            for ox in range(Wo):
                best, best_at = -np.inf, -1
                for ky in range(K):
                    for kx in range(K):
                        i = (c * H + oy * S + ky) * W + ox * S + kx
                        if x[i] > best:
                            best, best_at = x[i], i
                out = (c * Ho + oy) * Wo + ox
                y[out], at[out] = best, best_at
    return y, at


@pytest.mark.parametrize("C, H, W, K, S", [(3, 8, 8, 2, 2), (2, 7, 9, 2, 2), (2, 9, 9, 3, 2)])
def test_maxpool_ties_go_to_the_first_maximum_in_reading_order(C, H, W, K, S):
    rng = np.random.default_rng(C * 100 + H)
    offset = 5  # the input and output sit at offsets in one row, as in the engine
    for _ in range(20):
        x = rng.integers(0, 3, C * H * W).astype(np.float32)
        expected, expected_at = _reference_pool(x, C, H, W, K, S)
        Ho, Wo = (H - K) // S + 1, (W - K) // S + 1
        row = np.zeros(offset + x.size + expected.size, dtype=np.float32)
        row[offset : offset + x.size] = x
        aux = np.zeros(row.size, dtype=np.int32)
        y_off = offset + x.size
        maxpool_forward(row, offset, row, y_off, aux, C, H, W, Ho, Wo, K, S, 0)
        np.testing.assert_array_equal(row[y_off:], expected)
        np.testing.assert_array_equal(aux[y_off:], expected_at)


def test_relu_forward_and_backward():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(103).astype(np.float32)
    dy = rng.standard_normal(103).astype(np.float32)
    row = np.concatenate([x, np.zeros(103, np.float32), dy, np.zeros(103, np.float32)])
    activation_forward(0, row, 0, row, 103, 103)
    np.testing.assert_array_equal(row[103:206], np.maximum(x, 0))
    activation_backward(0, row, 103, row, 206, row, 309, 103)
    np.testing.assert_array_equal(row[309:], np.where(x > 0, dy, 0))


@pytest.mark.parametrize("C, H, W, K, S", [(3, 8, 8, 2, 2), (2, 9, 9, 3, 2)])
def test_a_pool_with_the_relu_fused_in_is_the_pool_of_the_relu(C, H, W, K, S):
    """Forward: the values of pooling the relu's outputs, each arg-max inside its own window
    (also where every input is at most zero). Backward: a gradient passes only from outputs above
    zero, to their arg-max; the outputs at zero pass none (the relu cut it)."""
    rng = np.random.default_rng(C * 10 + K)
    Ho, Wo = (H - K) // S + 1, (W - K) // S + 1
    n_in, n_out = C * H * W, C * Ho * Wo
    x = rng.integers(-3, 2, n_in).astype(np.float32)  # many windows without a positive input
    relu_pooled, relu_at = _reference_pool(np.maximum(x, 0), C, H, W, K, S)
    y_off = n_in
    row = np.zeros(n_in + n_out, dtype=np.float32)
    row[:n_in] = x
    aux = np.zeros(row.size, dtype=np.int32)
    maxpool_forward(row, 0, row, y_off, aux, C, H, W, Ho, Wo, K, S, 1)
    y, at = row[y_off:], aux[y_off:]
    np.testing.assert_array_equal(y, relu_pooled)
    assert 0 < (y == 0).sum() < n_out  # some windows are cut, some are not
    positive = y > 0
    np.testing.assert_array_equal(at[positive], relu_at[positive])
    for out in range(n_out):  # every arg-max is an input of its window
        c, rest = divmod(out, Ho * Wo)
        oy, ox = divmod(rest, Wo)
        iy, ix = divmod(int(at[out]) - c * H * W, W)
        assert oy * S <= iy < oy * S + K and ox * S <= ix < ox * S + K

    dy = rng.standard_normal(n_out).astype(np.float32)
    grads = np.zeros(n_in + n_out, dtype=np.float32)
    grads[y_off:] = dy
    grads[:n_in] = 7.0  # overwritten, not added to
    maxpool_backward(row, grads, y_off, grads, 0, aux, n_in, n_out, 1)
    expected = np.zeros(n_in, dtype=np.float32)
    np.add.at(expected, at[positive], dy[positive])
    np.testing.assert_array_equal(grads[:n_in], expected)
