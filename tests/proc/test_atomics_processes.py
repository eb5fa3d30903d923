"""Atomics under contention from several processes: N processes x M increments give N x M."""

import multiprocessing as mp

import numpy as np
import pytest
from numba import njit

from hogwild.shm.atomics import atomic_add, atomic_cas, atomic_load
from hogwild.shm.pool_segment import SharedSegment
from tests.proc.processes import compile_start_line, run_processes, start_context, start_line

pytestmark = pytest.mark.kernel_free

N_PROCS = 4
N_ITERS = 100_000
START_METHODS = ["spawn", "forkserver"]

# Word indices in the shared int64 array, each on its own cache line.
READY, ADD64, CAS64 = 0, 8, 16
ADD32 = 48  # int32 index (byte 192): the fourth cache line


def _context(method: str) -> mp.context.BaseContext:
    return start_context(method, "hogwild.shm.atomics")


@njit(cache=True, nogil=True)
def _hammer(words, words32, n):
    for _ in range(n):
        atomic_add(words, ADD64, 1)
        while True:
            old = atomic_load(words, CAS64)
            if atomic_cas(words, CAS64, old, old + 1) == old:
                break
        atomic_add(words32, ADD32, 1)


def _worker(name: str, n_procs: int, n_iters: int) -> None:
    seg = SharedSegment.attach(name)
    words = seg.array(0, np.int64, 32)
    words32 = seg.array(0, np.int32, 64)
    _hammer(words, words32, 1)  # compile or load before the start line
    start_line(words, READY, n_procs)
    _hammer(words, words32, n_iters - 1)
    seg.close()


@pytest.mark.parametrize("method", START_METHODS)
def test_n_processes_times_m_increments(method):
    with SharedSegment.create("test", 4096) as seg:
        words = seg.array(0, np.int64, 32)
        words32 = seg.array(0, np.int32, 64)
        # compiled here, once (no call changes anything: tests/proc/processes.py)
        compile_start_line(words)
        _hammer(words, words32, 0)
        codes = run_processes(_context(method), _worker, [(seg.name, N_PROCS, N_ITERS)] * N_PROCS)
        assert codes == [0] * N_PROCS
        assert words[ADD64] == N_PROCS * N_ITERS
        assert words[CAS64] == N_PROCS * N_ITERS
        assert words32[ADD32] == N_PROCS * N_ITERS
        del words, words32
