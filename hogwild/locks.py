"""Advisory locks shared by every hogwild job of one user on this host.

A step that two jobs (or two replicas of one job) must not take at the same time — planning
which cores their workers take and pinning them, or compiling the kernels into numba's cache —
runs inside :func:`machine_lock`: an ``flock`` on a file named after the step in the temporary
directory. The kernel drops the lock when its holder dies, so a killed job never leaves one
behind; a lock held for longer than ``timeout_s`` is given up on rather than waited for forever.
Lock files are left in place (removing one while another process may flock it would let two
holders in): a few small files per numba cache a user compiled into.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
import time
from pathlib import Path

LOCK_POLL_S = 0.05


def lock_path(step: str) -> Path:
    """The file of ``step``'s lock: one per user, in the temporary directory."""
    return Path(tempfile.gettempdir()) / f"hogwild-{step}-{os.getuid()}.lock"


@contextlib.contextmanager
def machine_lock(step: str, timeout_s: float = 300.0):
    """Hold ``step``'s lock while inside (proceed without it after ``timeout_s``).

    Yields:
        True if the lock is held, False if another job held it for longer than ``timeout_s``
        (the caller then goes on as it would without the lock).
    """
    try:
        fd = os.open(lock_path(step), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield False
        return
    held = False
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break
                time.sleep(LOCK_POLL_S)
        yield held
    finally:
        if held:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def numba_cache_key() -> str:
    """Which numba cache this process compiles into: ``NUMBA_CACHE_DIR``'s real path and this
    hogwild's source tree, hashed (numba keeps a cache's kernels in a folder per source folder,
    so two checkouts sharing a ``NUMBA_CACHE_DIR`` share nothing to load), or ``"sources"`` for
    numba's default, beside the source files."""
    cache = os.environ.get("NUMBA_CACHE_DIR")
    if not cache:
        return "sources"
    tree = Path(__file__).resolve().parent
    where = f"{os.path.realpath(cache)}\0{tree}"
    return hashlib.sha256(where.encode()).hexdigest()[:16]


def compile_lock(timeout_s: float = 300.0, kernels: str = "kernels"):
    """Hold the lock for compiling ``kernels`` (the engine's; ``"ps-kernels"``, the parameter
    servers'; ``"data-kernels"``, the data servers') into this process's numba cache while inside
    (see :func:`machine_lock`): jobs, or replicas, starting together compile one after the other,
    so the second loads what the first compiled. One lock per cache: jobs compiling into other
    caches share nothing to load, so none waits for another. Here, not beside the kernels: a
    process that finds them compiled takes the lock without loading numba."""
    return machine_lock(f"{kernels}-{numba_cache_key()}", timeout_s)
