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

import contextlib
import ctypes
from collections.abc import Iterator

__all__ = ["limit_blas_threads", "one_blas_thread_and_no_pool"]

SETTERS = (
    "openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "scipy_openblas_set_num_threads64_",
)

GETTERS = tuple(name.replace("_set_", "_get_") for name in SETTERS)
POOL_SHUTDOWN = "blas_thread_shutdown_"  # what OpenBLAS's own pthread_atfork handler calls


def limit_blas_threads(n: int = 1) -> list[str]:
    """Set every loaded OpenBLAS to ``n`` threads; the libraries changed (empty off Linux)."""
    changed = []
    for path, lib in _loaded_openblas():
        setter = _function(lib, SETTERS, [ctypes.c_int], None)
        if setter is not None:
            setter(n)
            changed.append(path)
    return changed


@contextlib.contextmanager
def one_blas_thread_and_no_pool() -> Iterator[None]:
    """While inside: every loaded OpenBLAS set to one thread and its thread pool ended; each
    one's own number of threads back after (its pool then starts again at its next call).

    For a fork that must copy one thread and nothing else (a forkserver forked from its
    client): the child inherits one BLAS thread and no pool, as a process that loaded OpenBLAS
    with ``OPENBLAS_NUM_THREADS=1`` has. The limit is set here, in the parent, while its pool
    is still running: OpenBLAS starts its pool afresh when its number of threads is set after
    a fork (the child would then run a pool again). The pool is ended as OpenBLAS's own
    ``pthread_atfork`` handler ends it at every fork, only before the caller counts its threads
    rather than after (where a library does not export that, its pool stays, and is counted).
    """
    restore = []
    try:
        for _, lib in _loaded_openblas():
            getter = _function(lib, GETTERS, [], ctypes.c_int)
            setter = _function(lib, SETTERS, [ctypes.c_int], None)
            if getter is None or setter is None:
                continue
            restore.append((setter, getter()))
            setter(1)
            shutdown = _function(lib, (POOL_SHUTDOWN,), [], ctypes.c_int)
            if shutdown is not None:
                shutdown()
        yield
    finally:
        for setter, threads in restore:
            setter(threads)


def _loaded_openblas() -> list[tuple[str, ctypes.CDLL]]:
    """Every OpenBLAS mapped into this process (``/proc/self/maps``), opened: (path, library)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:
        return []
    loaded = []
    for path in sorted(p for p in paths if p.endswith(".so") or ".so." in p):
        with contextlib.suppress(OSError):
            loaded.append((path, ctypes.CDLL(path)))
    return loaded


def _function(lib: ctypes.CDLL, names: tuple[str, ...], argtypes: list, restype):
    """The first of ``names`` that ``lib`` exports, typed; None if it exports none."""
    for name in names:
        function = getattr(lib, name, None)
        if function is not None:
            function.argtypes, function.restype = argtypes, restype
            return function
    return None
