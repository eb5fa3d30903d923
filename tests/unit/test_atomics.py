"""Atomics: behaviour of every operation from Python and from numba (one process)."""

import platform

import numpy as np
import pytest
from numba import njit
from numba.core.errors import TypingError

from hogwild.shm.atomics import (
    atomic_add,
    atomic_cas,
    atomic_load,
    atomic_load_relaxed,
    atomic_max,
    atomic_store,
    atomic_store_relaxed,
    cpu_relax,
)

DTYPES = [np.int32, np.uint32, np.int64, np.uint64]


@pytest.mark.parametrize("dtype", DTYPES)
def test_python_calls_on_every_dtype(dtype):
    a = np.zeros(4, dtype=dtype)
    assert atomic_add(a, 1, 5) == 0 and a[1] == 5
    assert atomic_cas(a, 1, 5, 7) == 5 and a[1] == 7
    assert atomic_cas(a, 1, 5, 9) == 7 and a[1] == 7  # failed swap leaves it
    assert atomic_max(a, 2, 11) == 0 and a[2] == 11
    assert atomic_max(a, 2, 3) == 11 and a[2] == 11
    assert atomic_max(a, 2, 13) == 11 and a[2] == 13
    atomic_store(a, 3, 21)
    assert atomic_load(a, 3) == 21
    atomic_store_relaxed(a, 0, 4)
    assert atomic_load_relaxed(a, 0) == 4
    cpu_relax()


def test_add_wraps_and_negative_values():
    a = np.array([np.iinfo(np.int64).max, -5], dtype=np.int64)
    atomic_add(a, 0, 1)
    assert a[0] == np.iinfo(np.int64).min
    assert atomic_add(a, 1, -3) == -5 and a[1] == -8
    assert atomic_max(a, 1, -10) == -8 and a[1] == -8  # signed comparison


def test_unsigned_max_compares_unsigned():
    a = np.array([1], dtype=np.uint64)
    atomic_max(a, 0, np.uint64(2**63 + 1))
    assert a[0] == 2**63 + 1


def test_out_of_bounds_index_raises():
    a = np.zeros(2, dtype=np.int64)
    for bad in (-1, 2):
        with pytest.raises(IndexError):
            atomic_add(a, bad, 1)
        with pytest.raises(IndexError):
            atomic_load(a, bad)


def test_rejects_float_2d_and_readonly_arrays():
    with pytest.raises(TypingError):
        atomic_add(np.zeros(2), 0, 1)
    with pytest.raises(TypingError):
        atomic_add(np.zeros((2, 2), dtype=np.int64), 0, 1)
    ro = np.zeros(2, dtype=np.int64)
    ro.flags.writeable = False
    with pytest.raises(TypingError):
        atomic_add(ro, 0, 1)


def test_works_on_views_into_a_larger_buffer():
    raw = np.zeros(64, dtype=np.uint8)
    words = raw[8:40].view(np.int64)
    atomic_add(words, 3, 7)
    assert raw[32] == 7


@njit(cache=True, nogil=True)
def _cas_increment(a, n):
    for _ in range(n):
        while True:
            old = atomic_load(a, 0)
            if atomic_cas(a, 0, old, old + 1) == old:
                break
    return atomic_load(a, 0)


@njit(cache=True, nogil=True)
def _add_increment(a, n):
    for _ in range(n):
        atomic_add(a, 1, 2)
    return a[1]


def test_usable_inside_numba_code():
    a = np.zeros(2, dtype=np.int64)
    assert _cas_increment(a, 1000) == 1000
    assert _add_increment(a, 1000) == 2000


def test_numba_emits_locked_instructions():
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("checks x86 assembly")
    fresh = njit(_add_increment.py_func)  # not from the cache, which keeps no assembly
    fresh(np.zeros(2, dtype=np.int64), 1)
    asm = fresh.inspect_asm(fresh.signatures[0])
    assert "lock" in asm
