"""Max-pooling's arg-max on ties, and relu forward and backward, against plain Python.

The PyTorch oracle tests draw continuous values, which never tie; here the inputs are small
integers, so most windows hold several equal maxima. The backward pass routes a window's gradient
to the recorded arg-max, so which of the equal inputs wins is part of the kernel's contract: the
first in reading order (row by row), for the 2x2 stride-2 window's own loop and for the general
one.
"""

from __future__ import annotations

import numpy as np
import pytest

from hogwild.model.layer_kernels import activation_backward, activation_forward, maxpool_forward


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
