"""The parameter server's kernels against numpy references: every rule, batching, API (b), ops."""

from __future__ import annotations

import numpy as np
import pytest
from hogwild_plugins.ps import kernels
from hogwild_plugins.ps.kernels import (
    RULE_ADAGRAD,
    RULE_MOMENTUM,
    RULE_SGD,
    RULE_STALENESS,
    RULES,
    apply_deltas,
    apply_vectors,
    vector_op,
)

# it calls kernels tests.warm_kernels compiles: it runs once they are in numba's cache
pytestmark = pytest.mark.warmed_kernels

LR, MU, EPS = 0.5, 0.9, 1e-8


def reference(rule, w, state, updates, lr=LR, mu=MU, eps=EPS):
    """Apply ``(offset, delta, coef)`` updates one after the other, in float32 numpy."""
    w, state = w.copy(), state.copy()
    lr, mu, eps = np.float32(lr), np.float32(mu), np.float32(eps)
    for offset, d, coef in updates:
        e = np.float32(coef) * d
        sl = slice(offset, offset + d.size)
        if rule == RULE_SGD:
            w[sl] += lr * e
        elif rule == RULE_ADAGRAD:
            state[sl] += e * e
            w[sl] += lr * e / (np.sqrt(state[sl]) + eps)
        else:  # momentum; staleness is momentum with the decay in the coefficient
            state[sl] = mu * state[sl] + e
            w[sl] += lr * state[sl]
    return w, state


def run(rule, w, state, updates, block=64):
    w, state = w.copy(), state.copy()
    deltas = [np.ascontiguousarray(d) for _, d, _ in updates]
    apply_deltas(
        rule,
        w,
        state,
        np.array([d.ctypes.data for d in deltas], np.int64),
        np.array([o for o, _, _ in updates], np.int64),
        np.array([d.size for d in deltas], np.int64),
        np.array([c for _, _, c in updates], np.float32),
        LR,
        MU,
        EPS,
        block,
    )
    return w, state


@pytest.mark.parametrize("rule", sorted(RULES.values()))
def test_batched_rules_equal_sequential_numpy(rule):
    rng = np.random.default_rng(rule)
    n = 1000
    w = rng.standard_normal(n).astype(np.float32)
    state = rng.random(n).astype(np.float32) if rule != RULE_SGD else np.zeros(n, np.float32)
    updates = []
    for _ in range(9):
        offset = int(rng.integers(0, n - 1))
        length = int(rng.integers(1, n - offset + 1))
        coef = 1.0 if rule != RULE_STALENESS else 0.8 ** int(rng.integers(0, 6))
        updates.append((offset, rng.standard_normal(length).astype(np.float32), coef))
    got_w, got_s = run(rule, w, state, updates, block=64)  # blocks cut through every update
    want_w, want_s = reference(rule, w, state, updates)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_s, want_s, rtol=1e-5, atol=1e-6)


def test_staleness_decay_scales_by_beta_to_the_staleness():
    w, v = np.zeros(4, np.float32), np.zeros(4, np.float32)
    d = np.ones(4, np.float32)
    beta, staleness = 0.5, 3
    got_w, got_v = run(RULE_STALENESS, w, v, [(0, d, beta**staleness)])
    np.testing.assert_allclose(got_v, 0.125)  # v = mu * 0 + beta^3 * d
    np.testing.assert_allclose(got_w, LR * 0.125)


def test_adagrad_accumulates_squares_per_parameter():
    w, g = np.zeros(2, np.float32), np.zeros(2, np.float32)
    d = np.array([2.0, -3.0], np.float32)
    got_w, got_g = run(RULE_ADAGRAD, w, g, [(0, d, 1.0), (0, d, 1.0)])
    np.testing.assert_allclose(got_g, [8.0, 18.0])
    want = LR * d / np.sqrt(d * d) + LR * d / np.sqrt(2 * d * d)
    np.testing.assert_allclose(got_w, want, rtol=1e-6)


@pytest.mark.parametrize("rule", [RULE_SGD, RULE_MOMENTUM, RULE_ADAGRAD])
@pytest.mark.parametrize(("shard_lo", "shard_n"), [(0, 5000), (1000, 900), (1730, 333)])
def test_vectors_equal_the_delta_formed_by_the_client(rule, shard_lo, shard_n):
    """API (b) on a shard that cuts rows of W apart equals API (a) with E^T A from numpy."""
    rng = np.random.default_rng(7)
    k, m, n_out, w_off, lr_b = 5, 37, 41, 1100, 0.01
    a = rng.standard_normal((k, m)).astype(np.float32)
    e = rng.standard_normal((k, n_out)).astype(np.float32)
    w0 = rng.standard_normal(shard_n).astype(np.float32)
    state = np.zeros(shard_n, np.float32)
    lo, hi = max(shard_lo, w_off), min(shard_lo + shard_n, w_off + m * n_out)
    r0, r1 = (lo - w_off) // m, (hi - 1 - w_off) // m + 1
    et = np.ascontiguousarray(e[:, r0:r1].T)
    w, s = w0.copy(), state.copy()
    scratch = np.zeros(3 * m, np.float32)  # 3 rows per block: blocks cut the shard too
    apply_vectors(rule, w, s, shard_lo, w_off, m, r0, et, a, -lr_b, LR, MU, EPS, scratch)
    full = (e.T @ a).reshape(-1)  # the client's outer products
    delta = full[lo - w_off : hi - w_off]
    want_w, want_s = reference(rule, w0, state, [(lo - shard_lo, delta, -lr_b)])
    np.testing.assert_allclose(w, want_w, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(s, want_s, rtol=1e-4, atol=1e-6)


def test_vector_operations():
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal(100).astype(np.float32), rng.standard_normal(100).astype(np.float32)
    z = np.zeros(100, np.float32)
    dot = vector_op(kernels.OP_DOT, x, y, y, 0.0)
    assert dot == pytest.approx(float(x.astype(np.float64) @ y.astype(np.float64)), rel=1e-9)
    y0 = y.copy()
    vector_op(kernels.OP_AXPY, x, y, y, 2.0)
    np.testing.assert_allclose(y, y0 + np.float32(2.0) * x)
    vector_op(kernels.OP_MUL, x, y, z, 0.0)
    np.testing.assert_allclose(z, x * y)
    vector_op(kernels.OP_SCALE, z, z, z, 0.5)
    np.testing.assert_allclose(z, 0.5 * x * y, rtol=1e-6)
    vector_op(kernels.OP_COPY, x, z, z, 0.0)
    np.testing.assert_array_equal(z, x)
    vector_op(kernels.OP_FILL, z, z, z, 3.0)
    assert (z == 3.0).all()


def test_asum_and_amax_against_numpy_with_nan_propagating():
    rng = np.random.default_rng(6)
    x = (rng.standard_normal(10_001) * 10).astype(np.float32)
    wide = np.abs(x.astype(np.float64))
    asum = vector_op(kernels.OP_ASUM, x, x, x, 0.0)
    assert asum == pytest.approx(float(wide.sum()), rel=1e-12)
    assert vector_op(kernels.OP_AMAX, x, x, x, 0.0) == float(wide.max())
    assert vector_op(kernels.OP_AMAX, -np.ones(3, np.float32), x, x, 0.0) == 1.0
    x[7] = np.nan
    assert np.isnan(vector_op(kernels.OP_ASUM, x, x, x, 0.0))
    assert np.isnan(vector_op(kernels.OP_AMAX, x, x, x, 0.0))
