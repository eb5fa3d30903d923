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
  inside :func:`starting` (which limits BLAS to one thread there, under its lock, and hashes one
  snapshot of the environment): when they differ from the running server's (a variable set
  since, a different ``NUMBA_CACHE_DIR``), a fresh server is started in its place. Only
  ``PYTEST_CURRENT_TEST`` is left out of the key: pytest changes it at every test phase and
  nothing in hogwild reads it. A server that still has children (another job's workers) is not
  replaced under them, so such a start uses spawn instead: slower, never stale. So does one
  where the server cannot start (its socket lives under ``TMPDIR``, and a socket's path is
  limited to 107 bytes), and one on a kernel without pidfds. Each reason is told once, on
  stderr and in the log.
- The parent. A forked worker's parent is the server, not the trainer: the kernel's
  parent-death signal follows the server, so the worker also watches the trainer itself
  (:func:`hogwild.signals.die_with_process`, which needs a pidfd).

The server is multiprocessing's singleton, one per process, shared with whatever else in the
process uses the forkserver method (this module sets its preload list, and may replace a server
the caller started). It ignores Ctrl-C (its children's owner stops them) and ends when the
process that started it ends, or closes its end of the "alive" pipe, and none of its children is
left: at the interpreter's exit (``hogwild train``, a notebook, a test worker)
:func:`stop_server` ends it (SIGTERM, then SIGKILL, within a bound: a plain-forked child of the
process holds a copy of the pipe and would keep it alive) when it has no child left; a process
killed outright leaves it to end by itself once its workers, which watch their trainer, have
ended.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import inspect
import logging
import multiprocessing as mp
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import multiprocessing.util
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator

import psutil

from hogwild.blas import one_blas_thread_and_no_pool
from hogwild.process_title import set_title
from hogwild.runtime import environment_set, single_threaded_blas

PRELOAD = ("hogwild.training.preload",)
WORKER_IMPORTS = "hogwild.training.worker_imports"  # what PRELOAD imports, signals left alone
IGNORED_VARIABLES = frozenset({"PYTEST_CURRENT_TEST"})

_lock = threading.RLock()
_server: tuple[int, str] | None = None  # (pid, key) of the server this module started
_exit_hook = False
_pidfd: bool | None = None  # whether pidfd_open works here, once probed
_said: set[str] = set()  # the reasons for using spawn already told
logger = logging.getLogger(__name__)

END_TIMEOUT_S = 2.0  # a server told to end with SIGTERM, before SIGKILL
EXIT_LOCK_TIMEOUT_S = 5.0  # at exit, for a thread still inside starting()


def environment_key(environment: dict[str, str]) -> str:
    """A digest of what a forked child takes from its server: ``environment`` (one snapshot of
    ``os.environ``, but ``PYTEST_CURRENT_TEST``) and the CPU affinity of the calling thread."""
    digest = hashlib.sha256()
    for name in sorted(set(environment) - IGNORED_VARIABLES):
        digest.update(f"{name}={environment[name]}\0".encode())
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

    Inside, BLAS is limited to one thread in this process's environment (a worker's parallelism
    comes from the workers), under the module's lock, so that overlapping jobs in threads of one
    process neither see each other's limit come and go nor leave it set. ``"spawn"`` is
    multiprocessing's. ``"forkserver"`` is the preloaded server's, started (or replaced, see the
    module docstring) for the environment and affinity the caller has now; while inside, no
    other thread of this process replaces it, so the workers started here all come from the same
    server. Where it cannot be used (it still has children, it cannot start, or this kernel has
    no pidfd for a forked worker to watch its trainer with) the context is spawn's.
    """
    with _lock, single_threaded_blas():
        if start_method != "forkserver":
            yield mp.get_context(start_method)
            return
        reason = _ensure_server()
        if reason is not None:
            _say_once(reason)
        yield mp.get_context("forkserver" if reason is None else "spawn")


def fork_server(owner: str) -> str | None:
    """Start this process's forkserver now as a fork of this process; None once it runs, else
    why not (the server is then started the usual way, as a fresh interpreter, when a gang
    first needs it).

    For a process that has imported :data:`WORKER_IMPORTS` already and runs one thread (counted
    in ``/proc/self/task``, native threads included, once OpenBLAS's pool is ended as each fork
    ends it): a cluster replica forked from the job's role server, before its first thread;
    ``hogwild train``, which imports them first (:func:`import_and_fork_server`). The fork
    begins where a fresh server is only after its imports (the interpreter's start, numba's,
    numba's target), about a second and a half of CPU per replica. It is keyed as
    :func:`starting` keys a server it starts (the environment with BLAS limited to one thread,
    the CPU affinity), so that the first gang reuses it, and a changed environment replaces it
    as it would any other. What a fresh server would not have it gives up in the fork: every
    fd but stdio, its socket and its "alive" pipe; every signal handler (what is ignored stays
    ignored, as across an exec; SIGINT is ignored, as :mod:`hogwild.training.preload` ignores
    it); the locks this module and multiprocessing's server hold around the fork; its command
    line, which would name the role (:data:`FORKED_TITLE` and ``owner``, which should name the
    process and the job's run directory, instead); BLAS threads beyond one (limited in the
    parent before the fork, see :func:`hogwild.blas.one_blas_thread_and_no_pool`).

    It fills multiprocessing's private record of its server, so it refuses where that record
    is not the one it was written for (CPython 3.11 to 3.13): 3.14's server, for one,
    authenticates every client with a key a forked server would not have. A refusal's reason
    is also logged (debug).
    """
    reason = _fork_server(owner)
    if reason is not None:
        logger.debug("hogwild: the workers' forkserver is not forked from this process: %s", reason)
    return reason


def _fork_server(owner: str) -> str | None:
    global _server, _exit_hook
    with _lock, single_threaded_blas():
        server = _forkserver()
        reason = _unforkable(server)
        if reason is not None:
            return reason
        key = environment_key(dict(os.environ))
        with server._lock:
            multiprocessing.resource_tracker.ensure_running()  # as ensure_running does first
            listener = socket.socket(socket.AF_UNIX)
            try:
                with one_blas_thread_and_no_pool():
                    threads = _threads()
                    if threads != 1:
                        return f"this process runs {threads} threads, which a fork would not copy"
                    address = multiprocessing.connection.arbitrary_address("AF_UNIX")
                    listener.bind(address)
                    if not mp.util.is_abstract_socket_namespace(address):
                        os.chmod(address, 0o600)
                    listener.listen()
                    forked = _fork(listener.fileno(), owner)
            except OSError as error:  # its socket's path too long, no process or fd left
                return f"the server could not be forked ({error})"
            finally:
                listener.close()
            pid, alive_w = forked
            server._forkserver_address = address
            server._forkserver_alive_fd = alive_w
            server._forkserver_pid = pid
            server._preload_modules = list(PRELOAD)
        _server = (pid, key)
        if not _exit_hook:
            atexit.register(stop_server)
            _exit_hook = True
    return None


def import_and_fork_server(owner: str) -> str | None:
    """:func:`fork_server`, once this process has imported :data:`WORKER_IMPORTS` (which it
    does now): for a job's parent that will start workers from a forkserver and runs one
    thread yet. Its imports are paid once, here, instead of once here and once in a fresh
    server (the parent loads numba for its evaluation and its merges anyway)."""
    import importlib

    importlib.import_module(WORKER_IMPORTS)
    return fork_server(owner)


FORKED_TITLE = "from multiprocessing.forkserver import main  # hogwild workers' server, forked"
"""The process title of a forked server (and of the workers it forks until they name themselves),
followed by its owner: it says what the process is and whose, never the role it was forked
from."""

SERVER_FIELDS = (
    "_lock",
    "_forkserver_address",
    "_forkserver_alive_fd",
    "_forkserver_pid",
    "_preload_modules",
)  # multiprocessing's private record of its server (3.11 to 3.13), which a fork fills
SERVER_MAIN = ("listener_fd", "alive_r", "preload", "main_path", "sys_path")


def _unforkable(server) -> str | None:
    """Why this process cannot fork its forkserver now; None if it can (but for its threads,
    which are counted only once BLAS's pool has ended)."""
    missing = [name for name in SERVER_FIELDS if not hasattr(server, name)]
    if missing:
        return f"multiprocessing's forkserver has no {', '.join(missing)} for a fork to fill"
    if hasattr(server, "_forkserver_authkey"):
        return "multiprocessing's forkserver authenticates its clients, which a fork cannot"
    parameters = tuple(inspect.signature(multiprocessing.forkserver.main).parameters)
    if parameters != SERVER_MAIN:
        return f"multiprocessing's forkserver.main{parameters} is not {SERVER_MAIN}"
    if WORKER_IMPORTS not in sys.modules:
        return f"this process has not imported {WORKER_IMPORTS}"
    if not pidfd_supported():
        return "this kernel has no pidfd, by which a forked worker watches its trainer"
    if server_pid() is not None:
        return "this process has a forkserver already"
    return None


def _threads() -> int:
    """The threads this process runs, native ones included (``/proc/self/task``)."""
    return len(os.listdir("/proc/self/task"))


def _fork(listener: int, owner: str) -> tuple[int, int]:
    """Fork the server serving ``listener``: (its pid, the write end of its "alive" pipe).

    Stdio is flushed first (what is buffered would be written again by every worker), and every
    signal is blocked across the fork, so that none runs the parent's handlers in the child
    before it has reset them; each side unblocks them itself.
    """
    alive_r, alive_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        pid = os.fork()
        if pid == 0:
            _be_forked_server(listener, alive_r, owner)  # never returns
    except BaseException:
        os.close(alive_w)
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # the parent's (the child never returns)
        os.close(alive_r)
    return pid, alive_w


def _be_forked_server(listener: int, alive_r: int, owner: str) -> None:
    """In the forked child: become what a fresh server is after its imports, then serve until
    the "alive" pipe closes; never returns."""
    global _lock
    code = 1
    try:
        # the fork copied these held by the thread that forked, which the child is not: free
        # ones, so that a worker can start processes of its own
        _lock = threading.RLock()
        _forkserver()._lock = threading.Lock()
        kept = sorted({0, 1, 2, listener, alive_r})
        for low, high in zip(kept, [*kept[1:], os.sysconf("SC_OPEN_MAX")], strict=True):
            os.closerange(low + 1, high)  # a fresh server inherits only its socket and pipe
        for signum in signal.valid_signals():
            # an exec resets what a handler catches and keeps what is ignored (SIGPIPE, as
            # Python ignores it, or SIGHUP under nohup)
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                if callable(signal.getsignal(signum)):
                    signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the preload does in a fresh server
        signal.pthread_sigmask(signal.SIG_SETMASK, [])  # blocked across the fork
        set_title(f"{sys.executable} -c {FORKED_TITLE}, for {owner}")
        multiprocessing.forkserver.main(listener, alive_r, [])
        code = 0
    except SystemExit:  # the "alive" pipe closed: every client has ended
        code = 0
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def pidfd_supported() -> bool:
    """Whether this kernel lets a process watch another through a pidfd (Linux 5.3 and later,
    not refused by a seccomp filter); probed once."""
    global _pidfd
    if _pidfd is None:
        try:
            os.close(os.pidfd_open(os.getpid()))
            _pidfd = True
        except (AttributeError, OSError):
            _pidfd = False
    return _pidfd


def _say_once(reason: str) -> None:
    if reason not in _said:
        _said.add(reason)
        message = f"hogwild: workers start with spawn, not the forkserver: {reason}"
        logger.warning(message)
        print(message, file=sys.stderr, flush=True)


def _ensure_server() -> str | None:
    """Have the preloaded forkserver for this process's environment running; else why not (the
    running one differs and still has children, or none can start or be used here)."""
    global _server, _exit_hook
    if not pidfd_supported():
        return "this kernel has no pidfd, by which a forked worker watches its trainer"
    key = environment_key(dict(os.environ))
    running = server_pid()
    if running is not None and _server == (running, key):
        return None
    if running is not None:
        if server_children(running):
            return "the running server, started for another environment, still has workers"
        _end_server()
    # (a server that ended is reaped, and started again, by ensure_running)
    server = _forkserver()
    server.set_forkserver_preload(list(PRELOAD))
    try:
        with server_import_path():
            server.ensure_running()
    except OSError as error:  # its socket's path too long (a deep TMPDIR): spawn has no socket
        return f"the server could not start ({error})"
    _server = (server._forkserver_pid, key)
    if not _exit_hook:
        atexit.register(stop_server)
        _exit_hook = True
    return None


@contextlib.contextmanager
def server_import_path() -> Iterator[None]:
    """While a forkserver starts: it imports the preload with this process's ``sys.path``, not
    with ``python -c``'s (whose first entry, the working directory, could shadow hogwild; Python
    3.11's forkserver ignores the ``sys_path`` multiprocessing hands it). This module's server
    and the benchmarks' (``bench/support/child_server.py``) start this way."""
    path = os.pathsep.join(entry for entry in sys.path if entry)
    with environment_set({"PYTHONSAFEPATH": "1", "PYTHONPATH": path}):
        yield


def stop_server(timeout_s: float = EXIT_LOCK_TIMEOUT_S) -> bool:
    """End this process's forkserver now if it has no child left; True when none is left
    running.

    One with children is left to end with them (its "alive" pipe closes when this process
    exits and the last child has ended). At the interpreter's exit a thread still inside
    :func:`starting` is waited for at most ``timeout_s`` seconds (False after that).
    """
    global _server
    if not _lock.acquire(timeout=timeout_s):
        return False
    try:
        pid = server_pid()
        if pid is not None and server_children(pid):
            return False
        _end_server()
        _server = None
        return True
    finally:
        _lock.release()


def _end_server() -> None:
    """End multiprocessing's forkserver (running, or ended and not yet reaped) within a bound,
    and forget it, so that the next start makes a fresh one.

    multiprocessing's own stop closes the "alive" pipe and waits without limit for the server,
    which ends only once every copy of that pipe is closed, a plain-forked child's (a user's
    fork Pool) included. This closes it too, then ends the server with SIGTERM (it has no
    handler for it) and, where that is not enough in ``END_TIMEOUT_S``, SIGKILL.
    """
    server = _forkserver()
    with server._lock:
        pid, alive, address = (
            server._forkserver_pid,
            server._forkserver_alive_fd,
            server._forkserver_address,
        )
        server._forkserver_pid = server._forkserver_alive_fd = None
        server._forkserver_address = None
        if alive is not None:
            with contextlib.suppress(OSError):
                os.close(alive)
        if pid is not None:
            _end_process(pid)
        if address is not None and not mp.util.is_abstract_socket_namespace(address):
            with contextlib.suppress(OSError):
                os.unlink(address)


def _end_process(pid: int) -> None:
    """SIGTERM our child ``pid``, reap it within ``END_TIMEOUT_S``, else SIGKILL and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + END_TIMEOUT_S
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # reaped already
            return
        if done:
            return
        if time.monotonic() >= deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            return
        time.sleep(0.01)


def _forkserver():
    return multiprocessing.forkserver._forkserver
