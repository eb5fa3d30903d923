"""The exchange kernels between a copy of the parameters and its home (numba, GIL released).

A copy that a worker (or a node's workers) trains on keeps a **base**: the home's values at the
last exchange plus the progress already pushed since. ``copy - base`` is therefore the copy's
unpushed progress, so nothing is lost whatever the order of pushes and pulls:

* push: ``d = copy - base; base += d; home += d`` (the copy's progress goes home once);
* pull: ``h = home; copy += h - base; base = h`` (the copy receives everyone else's progress and
  keeps its own unpushed progress on top);
* exchange: both in one pass (DistBelief's push/fetch loop when ``n_push == n_fetch``).

Each runs over a list of ``[start, stop)`` ranges of the flat vector (all of it, or everything
but the fully connected weights when those travel as activation and error vectors, Adam
section 3.2.6). Nothing is locked: the copy's workers keep training while its communication
thread exchanges, and every step is a per-element read-modify-write whose races lose at most one
of two concurrent additions, as every other Hogwild write does.

For a remote home the same bookkeeping is split: :func:`take_deltas` moves the unpushed progress
into a send buffer (advancing the base), and :func:`merge_pulled` folds received values in.
"""

import numpy as np
from numba import njit


@njit(cache=True, nogil=True, fastmath=True)
def push_ranges(home, copy, base, ranges):
    """``home += copy - base`` and ``base = copy`` (as it was read), over ``ranges``."""
    for r in range(ranges.shape[0]):
        lo, hi = ranges[r, 0], ranges[r, 1]
        h, c, b = home[lo:hi], copy[lo:hi], base[lo:hi]
        for i in range(hi - lo):
            d = c[i] - b[i]
            b[i] += d
            h[i] += d


@njit(cache=True, nogil=True, fastmath=True)
def pull_ranges(home, copy, base, ranges):
    """``copy += home - base`` and ``base = home`` (as it was read), over ``ranges``."""
    for r in range(ranges.shape[0]):
        lo, hi = ranges[r, 0], ranges[r, 1]
        h, c, b = home[lo:hi], copy[lo:hi], base[lo:hi]
        for i in range(hi - lo):
            hv = h[i]
            c[i] += hv - b[i]
            b[i] = hv


@njit(cache=True, nogil=True, fastmath=True)
def exchange_ranges(home, copy, base, ranges):
    """Push then pull in one pass: afterwards ``base == home`` and the copy holds everything."""
    for r in range(ranges.shape[0]):
        lo, hi = ranges[r, 0], ranges[r, 1]
        h, c, b = home[lo:hi], copy[lo:hi], base[lo:hi]
        for i in range(hi - lo):
            hv = h[i]  # read once: the others' progress is hv - base
            merged = hv + (c[i] - b[i])
            c[i] += hv - b[i]
            h[i] = merged
            b[i] = merged


@njit(cache=True, nogil=True, fastmath=True)
def take_deltas(out, copy, base, ranges):
    """Move the copy's unpushed progress into ``out`` (``out = copy - base; base += out``).

    ``out`` is a full-length vector; elements outside ``ranges`` are left as they are.
    """
    for r in range(ranges.shape[0]):
        lo, hi = ranges[r, 0], ranges[r, 1]
        o, c, b = out[lo:hi], copy[lo:hi], base[lo:hi]
        for i in range(hi - lo):
            d = c[i] - b[i]
            b[i] += d
            o[i] = d


@njit(cache=True, nogil=True, fastmath=True)
def merge_pulled(values, copy, base, ranges):
    """Fold pulled home values into the copy: ``copy += values - base; base = values``."""
    for r in range(ranges.shape[0]):
        lo, hi = ranges[r, 0], ranges[r, 1]
        v, c, b = values[lo:hi], copy[lo:hi], base[lo:hi]
        for i in range(hi - lo):
            c[i] += v[i] - b[i]
            b[i] = v[i]


@njit(cache=True, nogil=True)
def copy_ranges(dst, src, ranges):
    """``dst[r] = src[r]`` for every range (a base snapshot of the fully connected weights)."""
    for r in range(ranges.shape[0]):
        lo, hi = ranges[r, 0], ranges[r, 1]
        dst[lo:hi] = src[lo:hi]


@njit(cache=True, nogil=True)
def capture_vectors(act, dact, n, x_off, y_off, n_in, n_out, scale, acts, errs, row):
    """Copy a unit's input activations and (scaled) output errors of one fully connected layer.

    Rows ``row .. row + n`` of ``acts`` ([k, n_in]) and ``errs`` ([k, n_out]) receive examples
    ``0 .. n`` of the training context's rows: the vectors Adam section 3.2.6 sends instead of
    the layer's M x N weight update. ``scale`` is the unit's gradient scale (1/n for a minibatch
    mean), folded into the errors so that the update is ``-lr * sum_b errs[b] acts[b]^T``.
    """
    s = np.float32(scale)
    for b in range(n):
        acts[row + b, :] = act[b, x_off : x_off + n_in]
        e = errs[row + b]
        src = dact[b, y_off : y_off + n_out]
        for o in range(n_out):
            e[o] = src[o] * s


@njit(cache=True, nogil=True, fastmath=True)
def apply_vectors(weights, acts, errs, k, lr, decay, gradient):
    """``W = (1 - decay) * W - lr * errs[:k]^T acts[:k]`` for one fully connected layer.

    ``weights`` is the layer's [n_out, n_in] view (PyTorch layout), ``gradient`` an [n_out, n_in]
    scratch matrix: the k outer products are one sgemm, then one pass over W applies them (the
    parameter server's side of Adam section 3.2.6).
    """
    np.dot(errs[:k].T, acts[:k], gradient)
    keep = np.float32(1.0 - decay)
    step = np.float32(lr)
    w = weights.reshape(weights.size)
    g = gradient.reshape(gradient.size)
    for i in range(w.shape[0]):
        w[i] = w[i] * keep - step * g[i]
