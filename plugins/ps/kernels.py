"""The parameter server's update and vector kernels (numba, ``nogil``: update threads run them in
parallel with the network thread and with each other).

Rules, for a pushed delta ``d`` scaled by its coefficient ``c`` (``e = c * d``; ``c`` is 1, the
staleness factor, or ``-lr_b`` times it for API (b)):

* ``RULE_SGD``: ``w += lr * e``
* ``RULE_MOMENTUM``: ``v = mu * v + e; w += lr * v``
* ``RULE_ADAGRAD`` (DistBelief 4.1): ``g += e * e; w += lr * e / (sqrt(g) + eps)``
* ``RULE_STALENESS`` (Chan & Lane 3.5-3.6, master momentum with gradient decay): as momentum,
  with ``c = decay ** (j - i)`` computed by the caller from the shard's version ``j`` at apply
  and the basis ``i`` the delta was computed against.

A pushed delta is already the replica's own step (``copy - base``), so ``lr`` is the server's
extra factor (1 by default). Every rule is elementwise, so applying ``k`` queued updates block by
block (Adam 3.3.1's opportunistic batching: all ``k`` to one cache-sized block of the shard, then
the next block) gives exactly what applying them one after the other would, while the shard's
values and state cross the memory bus once per batch instead of once per update.

API (b) (:func:`apply_vectors`): a fully connected layer's update ``-lr_b * E^T A`` is formed
one block of rows at a time by sgemm into a cache-sized scratch matrix, which the rule then
applies before the next block is formed: the M x N update never exists whole.

Deltas are reached by address (:func:`as_f32`), so a batch of buffers of any provenance (ZeroMQ
message buffers used in place, pool blocks) is passed as three int64 arrays, not a list.
"""

from __future__ import annotations

import numpy as np
from hogwild_plugins.ps.vector_ops import (
    OP_AMAX,
    OP_ASUM,
    OP_AXPY,
    OP_COPY,
    OP_DOT,
    OP_FILL,
    OP_MUL,
    OP_SCALE,
    VECTOR_OPS,
)
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

RULE_SGD, RULE_MOMENTUM, RULE_ADAGRAD, RULE_STALENESS = 0, 1, 2, 3
RULES = {
    "sgd": RULE_SGD,
    "momentum": RULE_MOMENTUM,
    "adagrad": RULE_ADAGRAD,
    "staleness": RULE_STALENESS,
}
STATE_ARRAYS = {RULE_SGD: 0, RULE_MOMENTUM: 1, RULE_ADAGRAD: 1, RULE_STALENESS: 1}
"""Arrays of rule state per shard (velocity, or Adagrad's accumulated squares)."""

BLOCK_FLOATS = 8192
"""Floats per block of opportunistic batching (32 KiB: a block and a few deltas stay in L1/L2)."""
SCRATCH_FLOATS = 131072
"""Floats of an update thread's API (b) scratch (512 KiB: the rows of the update being formed)."""


@intrinsic
def _voidptr(typingctx, address):
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(types.int64), codegen


@njit(inline="always")
def as_f32(address, n):
    """The ``n`` float32 values at ``address`` as an array (the caller keeps them alive)."""
    return carray(_voidptr(address), (n,), np.float32)


@njit(nogil=True, cache=True, inline="always", error_model="numpy")
def _segment(rule, w, state, lo, d, c, lr, mu, eps):
    """Apply ``e = c * d`` to ``w[lo : lo + len(d)]`` (and the rule's state) by ``rule``.

    NumPy's error model: Python's checks every division for zero, a branch that keeps LLVM
    from vectorising Adagrad's loop (``eps`` is checked with the config: positive in float32).
    """
    n = d.shape[0]
    ws = w[lo : lo + n]
    if rule == RULE_SGD:
        for i in range(n):
            ws[i] += lr * (c * d[i])
    elif rule == RULE_ADAGRAD:
        g = state[lo : lo + n]
        for i in range(n):
            e = c * d[i]
            gi = g[i] + e * e
            g[i] = gi
            ws[i] += lr * e / (np.sqrt(gi) + eps)
    else:  # momentum, staleness: the coefficient carries the decay
        v = state[lo : lo + n]
        for i in range(n):
            vi = mu * v[i] + c * d[i]
            v[i] = vi
            ws[i] += lr * vi


@njit(nogil=True, cache=True, error_model="numpy")
def apply_deltas(rule, w, state, addrs, offsets, lengths, coefs, lr, mu, eps, block):
    """Apply ``k`` deltas to one shard, block by block, in their order.

    Args:
        rule: A ``RULE_*`` code.
        w: The shard's values (float32).
        state: Its rule state (float32, same length; unused for SGD).
        addrs: int64 [k]: address of each delta's first float.
        offsets: int64 [k]: where each delta starts in the shard.
        lengths: int64 [k]: each delta's length (``offsets + lengths <= len(w)``).
        coefs: float32 [k]: each delta's coefficient ``c``.
        lr, mu, eps: The rule's factors.
        block: Floats per block.
    """
    n = w.shape[0]
    lr, mu, eps = np.float32(lr), np.float32(mu), np.float32(eps)
    for b0 in range(0, n, block):
        b1 = min(n, b0 + block)
        for u in range(addrs.shape[0]):
            lo = max(b0, offsets[u])
            hi = min(b1, offsets[u] + lengths[u])
            if lo < hi:
                d = as_f32(addrs[u] + 4 * (lo - offsets[u]), hi - lo)
                _segment(rule, w, state, lo, d, coefs[u], lr, mu, eps)


@njit(nogil=True, cache=True, error_model="numpy")
def apply_delta(rule, w, state, d, offset, c, lr, mu, eps):
    """Apply one delta ``d`` at ``offset`` of the shard (:func:`apply_deltas` of one, taking
    the array itself: nothing to batch, so no blocks and no addresses to gather)."""
    lr, mu, eps, c = np.float32(lr), np.float32(mu), np.float32(eps), np.float32(c)
    _segment(rule, w, state, offset, d, c, lr, mu, eps)


@njit(nogil=True, cache=True, error_model="numpy")
def apply_vectors(rule, w, state, shard_lo, w_off, m, r0, et, a, c, lr, mu, eps, scratch, wd=0.0):
    """API (b) for the part of one fully connected layer that lies in one shard.

    The layer's weights ``W`` ([N, M], row-major) start at global offset ``w_off``; rows
    ``r0 .. r0 + len(et)`` overlap the shard, which starts at global offset ``shard_lo``. The
    update ``c * (et @ a + wd * W)`` (``et``: the rows' errors transposed, [rows, k]; ``a``:
    activations, [k, M]; ``wd * W`` the units' weight decay, as the replica would have added it
    to its deltas) is formed block of rows by block of rows into ``scratch`` and applied by
    ``rule`` to the elements that lie in the shard.
    """
    n = w.shape[0]
    rows = et.shape[0]
    per = max(1, scratch.shape[0] // m)
    lr, mu, eps, c = np.float32(lr), np.float32(mu), np.float32(eps), np.float32(c)
    for rb in range(0, rows, per):
        nr = min(per, rows - rb)
        block = scratch[: nr * m].reshape((nr, m))
        np.dot(et[rb : rb + nr], a, block)
        g0 = w_off + (r0 + rb) * m
        lo = max(g0, shard_lo)
        hi = min(g0 + nr * m, shard_lo + n)
        if lo < hi:
            flat = scratch[lo - g0 : hi - g0]
            if wd != 0.0:
                decay = np.float32(wd)
                for i in range(hi - lo):
                    flat[i] += decay * w[lo - shard_lo + i]
            _segment(rule, w, state, lo - shard_lo, flat, c, lr, mu, eps)


@njit(nogil=True, cache=True, fastmath=True)
def _dot(x, y):
    total = 0.0
    for i in range(x.shape[0]):
        total += np.float64(x[i]) * np.float64(y[i])
    return total


@njit(nogil=True, cache=True, fastmath={"reassoc"})
def _asum(x):
    """``sum |x_i|`` in float64 (reassociated to vectorise; NaN still propagates)."""
    total = 0.0
    for i in range(x.shape[0]):
        total += abs(np.float64(x[i]))
    return total


@njit(nogil=True, cache=True)
def _amax(x):
    """``max |x_i|`` (0 for an empty vector); NaN if any element is NaN, as torch's max is."""
    top = 0.0
    for i in range(x.shape[0]):
        a = abs(np.float64(x[i]))
        if a > top:
            top = a
        elif a != a:
            return a
    return top


@njit(nogil=True, cache=True)
def vector_op(op, x, y, z, alpha):
    """One shard-local operation on named vectors; the result of a reduction (else 0).

    Reductions (a float64 result per shard; the caller combines the shards'): ``dot``:
    ``x . y`` (a sum); ``asum``: ``sum |x_i|`` (a sum); ``amax``: ``max |x_i|`` (a maximum).
    Updates: ``axpy``: ``y += alpha * x``; ``scale``: ``x *= alpha``; ``copy``: ``y = x``;
    ``mul``: ``z = x * y`` (coefficient-wise); ``fill``: ``x = alpha``.
    """
    a = np.float32(alpha)
    if op == OP_DOT:
        return _dot(x, y)
    if op == OP_ASUM:
        return _asum(x)
    if op == OP_AMAX:
        return _amax(x)
    if op == OP_AXPY:
        for i in range(x.shape[0]):
            y[i] += a * x[i]
    elif op == OP_SCALE:
        for i in range(x.shape[0]):
            x[i] *= a
    elif op == OP_COPY:
        y[:] = x
    elif op == OP_MUL:
        for i in range(x.shape[0]):
            z[i] = x[i] * y[i]
    elif op == OP_FILL:
        x[:] = a
    return 0.0


@njit(nogil=True, cache=True)
def assign(w, lo, values):
    """``w[lo : lo + len(values)] = values``."""
    w[lo : lo + values.shape[0]] = values


def compile_kernels() -> None:
    """Compile (or load from numba's cache) every kernel, for all rules, before serving."""
    w = np.zeros(64, np.float32)
    d = np.ones(16, np.float32)
    one = np.ones(1, np.int64)
    et, a = np.ones((8, 2), np.float32), np.ones((2, 8), np.float32)
    frozen = [x.copy() for x in (et, a, d)]
    for x in frozen:
        x.flags.writeable = False  # arrays over received frames are read-only
    for rule in RULES.values():
        apply_deltas(
            rule,
            w,
            w.copy(),
            one * d.ctypes.data,
            one * 8,
            one * 16,
            np.ones(1, np.float32),
            1.0,
            0.9,
            1e-8,
            BLOCK_FLOATS,
        )
        for delta in (d, frozen[2]):
            apply_delta(rule, w, w.copy(), delta, 8, 1.0, 1.0, 0.9, 1e-8)
        for e, x in ((et, a), (frozen[0], frozen[1])):
            apply_vectors(
                rule, w, w.copy(), 0, 0, 8, 0, e, x, 1.0, 1.0, 0.9, 1e-8,
                np.zeros(64, np.float32), 0.5,
            )  # fmt: skip
    for op in VECTOR_OPS.values():
        vector_op(op, d, d.copy(), d.copy(), 1.0)
    assign(w, 0, d)
    assign(w, 0, frozen[2])
