"""Worker processes forked from a server that has already paid numba's start.

Every Python process that imports numba pays for it before any work: the import, then numba's
one-time initialisation of its target at the first compiled function the process loads. A
spawned worker pays it again, each time, for what is often a few tenths of a second of
training. multiprocessing's forkserver is one process, started once, that imports a list of
modules and then forks one child per request: :func:`starting` starts it with
:mod:`hogwild.training.preload` imported, so each worker begins where a spawned one would be
only after most of its start (``train.start_method = "forkserver"``; ``"spawn"`` starts
every worker afresh, as before).

A forked child inherits the server's state as it was when the server started, not its
caller's now. So that no worker ever sees a stale one:

- The environment and the CPU affinity. The server is keyed by both, taken as the caller's
  inside :func:`starting` (where the trainer has limited BLAS to one thread): when they
  differ from the running server's (a variable set since, a different ``NUMBA_CACHE_DIR``),
  a fresh server is started in its place. Only ``PYTEST_CURRENT_TEST`` is left out of the key:
  pytest changes it at every test phase and nothing in hogwild reads it. A server that still
  has children cannot be replaced (stopping it waits for them: each holds its "alive" pipe), so
  such a start uses spawn instead: slower, never stale. So does one where the server cannot
  start (its socket lives under ``TMPDIR``, and a socket's path is limited to 107 bytes).
- The parent. A forked worker's parent is the server, not the trainer: the kernel's
  parent-death signal follows the server, so the worker also watches the trainer itself
  (:func:`hogwild.signals.die_with_process`).

The server is multiprocessing's singleton, one per process, shared with whatever else in the
process uses the forkserver method. It ignores Ctrl-C (its children's owner stops them) and ends
when the process that started it ends, or closes its end of the "alive" pipe, and none of its
children is left: at the interpreter's exit (``hogwild train``, a notebook, a test worker)
:func:`stop_server` ends it and waits for it when it has no child left; a process killed
outright leaves it to end by itself once its workers, which watch their trainer, have ended.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import multiprocessing as mp
import multiprocessing.forkserver
import os
import threading
from collections.abc import Iterator

import psutil

PRELOAD = ("hogwild.training.preload",)
IGNORED_VARIABLES = frozenset({"PYTEST_CURRENT_TEST"})

_lock = threading.RLock()
_server: tuple[int, str] | None = None  # (pid, key) of the server this module started
_exit_hook = False


def environment_key() -> str:
    """A digest of what a forked child takes from its server: the environment (but
    ``PYTEST_CURRENT_TEST``) and the CPU affinity of the calling process."""
    digest = hashlib.sha256()
    for name in sorted(set(os.environ) - IGNORED_VARIABLES):
        digest.update(f"{name}={os.environ[name]}\0".encode())
    digest.update(repr(sorted(os.sched_getaffinity(0))).encode())
    return digest.hexdigest()


def server_pid() -> int | None:
    """The pid of this process's forkserver if one is running (whoever started it), else None.

    A server that ended is left for multiprocessing to reap (it waits for the pid it recorded).
    """
    pid = _forkserver()._forkserver_pid
    if pid is None:
        return None
    try:
        return None if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE else pid
    except psutil.Error:
        return None


def server_children(pid: int) -> list[psutil.Process]:
    """The live (not zombie) children of the forkserver ``pid``."""
    try:
        children = psutil.Process(pid).children()
    except psutil.Error:
        return []
    live = []
    for child in children:
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE:
                live.append(child)
    return live


@contextlib.contextmanager
def starting(start_method: str) -> Iterator[mp.context.BaseContext]:
    """The multiprocessing context to start a gang of workers with, while inside.

    ``"spawn"`` is multiprocessing's. ``"forkserver"`` is the preloaded server's, started (or
    replaced, see the module docstring) for the environment and affinity the caller has now;
    while inside, no other thread of this process replaces it, so the workers started here all
    come from the same server. Where it cannot be replaced (it still has children) the
    context is spawn's.
    """
    if start_method != "forkserver":
        yield mp.get_context(start_method)
        return
    with _lock:
        yield mp.get_context("forkserver" if _ensure_server() else "spawn")


def _ensure_server() -> bool:
    """Have the preloaded forkserver for this process's environment running; False where the
    running one differs and cannot be replaced now."""
    global _server, _exit_hook
    key = environment_key()
    running = server_pid()
    if running is not None and _server == (running, key):
        return True
    if running is not None:
        if server_children(running):
            return False
        _forkserver()._stop()
    # (a server that ended is reaped, and started again, by ensure_running)
    server = _forkserver()
    server.set_forkserver_preload(list(PRELOAD))
    try:
        server.ensure_running()
    except OSError:  # its socket's path too long (a deep TMPDIR): spawn has no socket
        return False
    _server = (server._forkserver_pid, key)
    if not _exit_hook:
        atexit.register(stop_server)
        _exit_hook = True
    return True


def stop_server() -> bool:
    """End this process's forkserver now if it has no child left, and wait for it; True when
    none is left running.

    One with children is left to end with them (its "alive" pipe closes when this process
    exits and the last child has ended): stopping it now would wait for them.
    """
    global _server
    with _lock:
        pid = server_pid()
        if pid is not None and server_children(pid):
            return False
        if _forkserver()._forkserver_pid is not None:  # running, or ended and not yet reaped
            _forkserver()._stop()  # closes its "alive" pipe, which ends it, and reaps it
        _server = None
        return True


def _forkserver():
    return multiprocessing.forkserver._forkserver
