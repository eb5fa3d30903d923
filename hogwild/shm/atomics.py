"""Atomic operations on elements of numpy integer arrays, for numba code and for Python.

Everything lock-free in hogwild (the buffer pools, the MPMC queue) is built on the handful of
operations here. Each is a numba ``intrinsic`` that emits the LLVM instruction directly
(``cmpxchg``, ``atomicrmw``, ``load atomic``, ``store atomic``) on the address of one element of
a one-dimensional array whose dtype is int32, uint32, int64 or uint64. The array may live in
process-private memory or in a POSIX shared-memory segment mapped by several processes: the
hardware makes the operation atomic across processes as long as the element is naturally
aligned, which every numpy array of these dtypes is.

Two faces:

- ``atomic_*``: ``@njit(cache=True, nogil=True)`` wrappers that check the index against the
  array's length (``IndexError`` rather than touch memory outside it), callable from Python (one
  numba dispatch) and from numba code (one call);
- ``raw_*``: the intrinsics themselves, for numba code only, with no bounds check. They are
  code-generated into the caller, so each is exactly one instruction there, whatever numba's
  cache holds. Besides an array they accept a plain integer *base address*, and then act on the
  int64 word ``idx`` at ``base + 8 * idx``. Hot paths (:mod:`hogwild.shm.pool_kernels`,
  :mod:`hogwild.shm.queue`) pass addresses: an array handed from one njit function to another
  costs reference-count updates (atomic increments, calls) that numba cannot always prune, and
  that cost several times the atomic operation itself; an integer costs nothing.

Memory orderings: read-modify-write operations are sequentially consistent; ``atomic_load`` is an
acquire load, ``atomic_store`` a release store; the ``_relaxed`` variants are monotonic (atomic but
unordered), for statistics and for links that a later acquire/release pair publishes.

Adam (§3.3.1) uses lock-free queues and allocators on its parameter servers' hot paths built on
the Windows interlocked primitives; these are their equivalents on LLVM's memory model.
"""

from __future__ import annotations

import platform

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

__all__ = [
    "ATOMIC_DTYPES",
    "raw_add",
    "raw_cas",
    "raw_load",
    "raw_load_relaxed",
    "raw_max",
    "raw_relax",
    "raw_store",
    "raw_store_relaxed",
    "atomic_add",
    "atomic_cas",
    "atomic_load",
    "atomic_load_relaxed",
    "atomic_max",
    "atomic_store",
    "atomic_store_relaxed",
    "cpu_relax",
]

#: The numpy dtypes whose elements the operations here accept.
ATOMIC_DTYPES = (np.dtype(np.int32), np.dtype(np.uint32), np.dtype(np.int64), np.dtype(np.uint64))

_NUMBA_DTYPES = (types.int32, types.uint32, types.int64, types.uint64)


def _check_array(aryty: types.Type, what: str, address_ok: bool = False) -> None:
    if address_ok and isinstance(aryty, types.Integer):
        return
    if not isinstance(aryty, types.Array) or aryty.ndim != 1:
        raise TypingError(f"{what}: expected a 1-D numpy array, got {aryty}")
    if aryty.dtype not in _NUMBA_DTYPES:
        raise TypingError(f"{what}: expected an int32/uint32/int64/uint64 array, got {aryty.dtype}")
    if not aryty.mutable:
        raise TypingError(f"{what}: the array is read-only")


def _dtype(aryty: types.Type) -> types.Type:
    """Element type: the array's, or int64 for a base address."""
    return types.int64 if isinstance(aryty, types.Integer) else aryty.dtype


def _element_pointer(context, builder, aryty, ary, idx, idxty):
    """The address of ``ary[idx]``, or of int64 word ``idx`` from base address ``ary``.

    No bounds check: the njit wrappers do it for arrays; addresses are the caller's business.
    """
    index = context.cast(builder, idx, idxty, types.intp)
    if isinstance(aryty, types.Integer):
        base = context.cast(builder, ary, aryty, types.intp)
        addr = builder.add(base, builder.shl(index, ir.Constant(index.type, 3)))
        return builder.inttoptr(addr, ir.IntType(64).as_pointer())
    array = context.make_array(aryty)(context, builder, ary)
    return cgutils.get_item_pointer(context, builder, aryty, array, [index], wraparound=False)


def _alignment(aryty) -> int:
    return _dtype(aryty).bitwidth // 8


@intrinsic
def raw_cas(typingctx, ary, idx, expected, new):
    """``atomic_cas`` without the bounds check, for numba code only."""
    _check_array(ary, "atomic_cas", address_ok=True)
    dt = _dtype(ary)
    sig = dt(ary, types.intp, dt, dt)

    def codegen(context, builder, signature, args):
        a, i, e, n = args
        ptr = _element_pointer(context, builder, signature.args[0], a, i, types.intp)
        pair = builder.cmpxchg(ptr, e, n, "seq_cst", "seq_cst")
        return builder.extract_value(pair, 0)

    return sig, codegen


def _rmw_intrinsic(op: str, name: str):
    @intrinsic
    def _rmw(typingctx, ary, idx, value):
        _check_array(ary, name, address_ok=True)
        dt = _dtype(ary)
        sig = dt(ary, types.intp, dt)
        llop = op
        if op == "max" and not dt.signed:
            llop = "umax"

        def codegen(context, builder, signature, args):
            a, i, v = args
            ptr = _element_pointer(context, builder, signature.args[0], a, i, types.intp)
            return builder.atomic_rmw(llop, ptr, v, "seq_cst")

        return sig, codegen

    return _rmw


# raw_X: atomic_X without the bounds check, for numba code only.
raw_add = _rmw_intrinsic("add", "atomic_add")
raw_max = _rmw_intrinsic("max", "atomic_max")


def _load_intrinsic(ordering: str, name: str):
    @intrinsic
    def _load(typingctx, ary, idx):
        _check_array(ary, name, address_ok=True)
        sig = _dtype(ary)(ary, types.intp)

        def codegen(context, builder, signature, args):
            a, i = args
            aryty = signature.args[0]
            ptr = _element_pointer(context, builder, aryty, a, i, types.intp)
            return builder.load_atomic(ptr, ordering, _alignment(aryty))

        return sig, codegen

    return _load


def _store_intrinsic(ordering: str, name: str):
    @intrinsic
    def _store(typingctx, ary, idx, value):
        _check_array(ary, name, address_ok=True)
        sig = types.void(ary, types.intp, _dtype(ary))

        def codegen(context, builder, signature, args):
            a, i, v = args
            aryty = signature.args[0]
            ptr = _element_pointer(context, builder, aryty, a, i, types.intp)
            builder.store_atomic(v, ptr, ordering, _alignment(aryty))
            return context.get_dummy_value()

        return sig, codegen

    return _store


raw_load = _load_intrinsic("acquire", "atomic_load")
raw_load_relaxed = _load_intrinsic("monotonic", "atomic_load_relaxed")
raw_store = _store_intrinsic("release", "atomic_store")
raw_store_relaxed = _store_intrinsic("monotonic", "atomic_store_relaxed")


_MACHINE = platform.machine().lower()


@intrinsic
def raw_relax(typingctx):
    """``cpu_relax``, for numba code only."""

    def codegen(context, builder, signature, args):
        if _MACHINE in ("x86_64", "amd64", "i686", "i386"):
            fnty = ir.FunctionType(ir.VoidType(), [])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.sse2.pause")
            builder.call(fn, [])
        elif _MACHINE in ("aarch64", "arm64"):
            fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(32)])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.aarch64.hint")
            builder.call(fn, [ir.Constant(ir.IntType(32), 1)])  # 1 = YIELD
        return context.get_dummy_value()

    return types.void(), codegen


@njit(cache=True, nogil=True)
def _check_index(ary, idx):
    if idx < 0 or idx >= ary.shape[0]:
        raise IndexError("atomic operation: index out of bounds")


@njit(cache=True, nogil=True)
def atomic_cas(ary, idx, expected, new):
    """Compare-and-swap ``ary[idx]``: store ``new`` if it equals ``expected`` (seq_cst).

    Args:
        ary: 1-D int32/uint32/int64/uint64 array (private or shared memory).
        idx: Element index.
        expected: The value the element must hold for the swap to happen.
        new: The value to store.

    Returns:
        The value the element held before; the swap happened iff it equals ``expected``.
    """
    _check_index(ary, idx)
    return raw_cas(ary, idx, expected, new)


@njit(cache=True, nogil=True)
def atomic_add(ary, idx, value):
    """Fetch-and-add ``value`` to ``ary[idx]`` (seq_cst, wrapping); returns the old value."""
    _check_index(ary, idx)
    return raw_add(ary, idx, value)


@njit(cache=True, nogil=True)
def atomic_max(ary, idx, value):
    """Raise ``ary[idx]`` to ``value`` if it is smaller (seq_cst); returns the old value."""
    _check_index(ary, idx)
    return raw_max(ary, idx, value)


@njit(cache=True, nogil=True)
def atomic_load(ary, idx):
    """Load ``ary[idx]`` with acquire ordering."""
    _check_index(ary, idx)
    return raw_load(ary, idx)


@njit(cache=True, nogil=True)
def atomic_load_relaxed(ary, idx):
    """Load ``ary[idx]`` atomically with no ordering (LLVM ``monotonic``)."""
    _check_index(ary, idx)
    return raw_load_relaxed(ary, idx)


@njit(cache=True, nogil=True)
def atomic_store(ary, idx, value):
    """Store ``value`` into ``ary[idx]`` with release ordering."""
    _check_index(ary, idx)
    raw_store(ary, idx, value)


@njit(cache=True, nogil=True)
def atomic_store_relaxed(ary, idx, value):
    """Store ``value`` into ``ary[idx]`` atomically with no ordering (LLVM ``monotonic``)."""
    _check_index(ary, idx)
    raw_store_relaxed(ary, idx, value)


@njit(cache=True, nogil=True)
def cpu_relax():
    """Hint to the CPU that the caller is spinning (x86 ``pause``, ARM ``yield``)."""
    raw_relax()
