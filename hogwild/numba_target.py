"""numba's CPU target, initialised in this process once, before it forks children that run kernels.

numba initialises its target (the typing and lowering registries of every module it ships, and
of the extensions imported so far) at the first compiled function a process loads or compiles,
cached or not: a large part of what a fresh process pays before its first kernel call. Importing
this module does it now, so that every child a server forks afterwards (a worker forkserver, a
test's forkserver) starts with it done instead of each child doing it again. Extensions imported
later are loaded by the next :func:`initialise` (or the next compiled function), the rest kept.
No thread is started and no file or socket is left open.
"""

from numba.core.registry import cpu_target


def initialise() -> None:
    """Load numba's CPU typing and lowering registries now (those not loaded yet)."""
    cpu_target.typing_context.refresh()
    cpu_target.target_context.refresh()


initialise()
