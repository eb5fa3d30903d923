"""Process-wide settings that must be in place before numba is imported.

hogwild compiles its kernels once, in the parent, with ``cache=True`` (or finds them compiled
there before); worker processes then load the compiled code from the same on-disk cache instead of
compiling again. That only works if every
process agrees on ``NUMBA_CACHE_DIR`` before numba is first imported, so the package sets it (unless
the user already has) the moment ``hogwild`` is imported. Worker processes are started with spawn or
forkserver and inherit the environment, so they see the same value.
"""

import contextlib
import gc
import hashlib
import os
from pathlib import Path

KERNEL_PACKAGES = ("model", "optim", "shm", "data")
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def user_cache_dir() -> Path:
    """The directory hogwild caches into: ``$XDG_CACHE_HOME/hogwild`` or ``~/.cache/hogwild``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hogwild"


def kernel_source_digest() -> str:
    """A digest of every module that holds numba kernels.

    numba invalidates a cached function when its own file changes, but not when a kernel it
    calls in another file does; keying the cache directory by all kernel sources means an edited
    or upgraded hogwild never runs stale machine code. A forced SIMD width
    (``HOGWILD_SIMD_BYTES``, see :mod:`hogwild.model.simd`) compiles other code from the same
    sources, so it is part of the key.
    """
    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    digest.update(os.environ.get("HOGWILD_SIMD_BYTES", "").encode())
    for folder in KERNEL_PACKAGES:
        for source in sorted((package / folder).glob("*.py")):
            digest.update(source.name.encode())
            digest.update(source.read_bytes())
    for source in _plugin_kernel_sources():
        digest.update(source.name.encode())
        with contextlib.suppress(OSError):  # removed meanwhile
            digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def _plugin_kernel_sources() -> list[Path]:
    """Every module of the installed plugins (the packages registering the engine's entry
    points, found without importing them), as every module of the engine's kernel folders: a
    plugin's kernels compile in constants of its other modules (a parameter server's operation
    numbers), and numba would not see those change. Read once per command: the processes it
    starts inherit ``NUMBA_CACHE_DIR``."""
    from hogwild.entry_points import plugin_packages

    return [source for package in plugin_packages() for source in sorted(package.rglob("*.py"))]


def configure_numba_environment() -> None:
    """Point numba's cache at hogwild's cache directory and keep numba single-threaded."""
    if "NUMBA_CACHE_DIR" not in os.environ:  # the digest reads every kernel source: only if used
        os.environ["NUMBA_CACHE_DIR"] = str(user_cache_dir() / "numba" / kernel_source_digest())
    # One numba thread per worker process: parallelism comes from processes, not threads.
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")


configure_numba_environment()


@contextlib.contextmanager
def environment_set(values: dict[str, str]):
    """``os.environ`` with ``values`` set while inside (for the processes started there), each
    variable given back its own value (or removed) afterwards."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def single_threaded_blas():
    """Start processes with BLAS limited to one thread: parallelism comes from the workers.

    A spawned process inherits the environment at its start, before anything loads BLAS; the
    parent's own setting is restored afterwards.
    """
    with environment_set({name: "1" for name in BLAS_THREAD_VARIABLES}):
        yield


def collect_garbage_less_often() -> None:
    """Let the cyclic garbage collector start after 50,000 new objects instead of Python's 700.

    For a process of its own (the ``hogwild`` program, a worker), called first. Starting one
    imports numpy and numba and loads the kernels: hundreds of thousands of objects that live as
    long as the process, which the collector otherwise walks again and again while they are made
    (a noticeable part of a parameter server's start).
    The loops after that allocate little and free it by reference counting.
    """
    gc.set_threshold(50_000, *gc.get_threshold()[1:])
