"""One BLAS thread per calling thread: limit the OpenBLAS libraries already loaded.

Threads of one process that each run sgemm (numba's ``np.dot``, through SciPy's OpenBLAS) at
once: the parameter server's update threads (API (b)), the cluster driver's evaluation threads.
An OpenBLAS left at its default of one thread per core then runs each call on all cores and
serialises concurrent callers on its thread pool: two update threads were slower than one, and
two evaluation threads no faster than one.
Environment variables (``OPENBLAS_NUM_THREADS``) act only before the library loads, which a
server started from the ``hogwild`` command or a test cannot guarantee, so this module calls the
libraries' own ``*_set_num_threads`` on every OpenBLAS mapped into the process (found in
``/proc/self/maps``, as threadpoolctl does), numpy's and SciPy's alike.
"""

from __future__ import annotations

import ctypes

__all__ = ["limit_blas_threads"]

SETTERS = (
    "openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "scipy_openblas_set_num_threads64_",
)


def limit_blas_threads(n: int = 1) -> list[str]:
    """Set every loaded OpenBLAS to ``n`` threads; the libraries changed (empty off Linux)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:
        return []
    changed = []
    for path in sorted(p for p in paths if p.endswith(".so") or ".so." in p):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter.argtypes, setter.restype = [ctypes.c_int], None
                setter(n)
                changed.append(path)
                break
    return changed
