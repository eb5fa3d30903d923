"""Starting parameter servers: as a child process (``hogwild ps serve``) or in this process.

:class:`ServeProcess` runs ``hogwild ps serve ...`` as a child, reads its stderr from a thread,
and returns from :meth:`~ServeProcess.start` once the child printed its ready line
(``hogwild ps: serving ... on HOST:PORT``), with the address it serves on; a child that exits or
stays silent past the timeout is an error quoting its last lines. :meth:`~ServeProcess.stop`
sends SIGTERM (a final flush, exit 143) and kills it if it does not exit in time. Launchers, tests
and benchmarks use it; the child is always reaped.

The child is forked from the owner's role server (:mod:`hogwild.cluster.role_server`): one per
owning process, started at its first :class:`ServeProcess` and shared by every later one, which
has imported numba, numpy, ZeroMQ and the parameter server once. A fresh interpreter pays that
(about a CPU-second) for each server before it serves; a test that starts and kills a dozen
servers paid it a dozen times. The forked child is the same ``hogwild ps serve`` run as the
shim runs it (its own session, stdin and stdout on ``/dev/null``, stderr piped here, SIGTERM
when the owner dies); where the role server cannot be used (another environment than the one
it started with, no pidfd, a server that failed), the child is a fresh interpreter through
:data:`hogwild.cluster.roles.SHIM`, in a session of its own too, and the reason is told once on
stderr (with what the role server said on its stderr, kept in an unnamed temporary file, where
it failed). The role server ends once its owner has ended and its last child has (it serves the
owner's whole life: :func:`role_server_pid` names it, so that a leak check can tell it from a
server left running). A SIGTERM of the role server is passed on to its servers (each flushes
and exits 143); a SIGKILL of it (the OOM killer's) SIGKILLs them, unflushed (exit code -9).

:func:`local_server` serves a model from this process (threads, no child), on a free loopback
port by default: what unit-level tests and the benchmark's in-process measurements need.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from hogwild.cluster.role_server import ForkedRole, RoleServer
from hogwild.cluster.roles import READY
from hogwild.errors import HogwildError

__all__ = ["ServeProcess", "local_server", "role_server_pid"]

ROLE_SERVER_START_S = 120.0  # for the role server's imports, at the first server it forks

_role_server: tuple[int, RoleServer] | None = None  # (the owning pid, its role server)
_role_server_lock = threading.Lock()


def _owners_role_server() -> RoleServer:
    """This process's role server for its parameter servers, made at the first call.

    Keyed by pid: a process forked from the owner (a multiprocessing worker) inherits the
    owner's object, whose control socket is the owner's, and makes its own instead.
    """
    global _role_server
    with _role_server_lock:
        if _role_server is None or _role_server[0] != os.getpid():
            title = f"hogwild role server of the parameter servers of pid {os.getpid()}"
            # Its own stderr (never a server's: each has its pipe) has no run directory to go
            # to: an unnamed file, quoted in the reason told where the role server failed.
            server = RoleServer(title, ROLE_SERVER_START_S, None, roles="parameter servers")
            _role_server = (os.getpid(), server)
        return _role_server[1]


def role_server_pid() -> int | None:
    """The pid of this process's role server for :class:`ServeProcess`, while one is running
    (None once it has ended): it lives as long as this process, and is no server left behind."""
    with _role_server_lock:
        if _role_server is None or _role_server[0] != os.getpid():
            return None
        return _role_server[1].pid


class ServeProcess:
    """``hogwild ps serve ARGS`` as a child process, stopped (SIGTERM) when its owner dies, even by
    SIGKILL: a forked child watches its owner through a pidfd; a fresh interpreter has the
    kernel's death signal, which follows the thread that called :meth:`start`.

    Args:
        args: Arguments after ``hogwild ps serve``.
        env: Extra environment variables for the child.
    """

    def __init__(self, args: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.args = list(args)
        self.env = {**os.environ, **(env or {})}
        # Forked from the role server, or a fresh interpreter where it could not be used.
        self.process: ForkedRole | subprocess.Popen | None = None
        self.lines: deque[str] = deque(maxlen=200)
        self.address: str | None = None
        self._ready = threading.Event()
        self._reader: threading.Thread | None = None

    def start(self, timeout: float = 120.0) -> str:
        """Start the child and wait for its ready line; the ``HOST:PORT`` it serves on. The
        first start in a process (its role server's) may wait first, outside ``timeout``, for
        up to ``ROLE_SERVER_START_S`` while that server imports what servers import.

        Raises:
            HogwildError: It exited, or printed no ready line within ``timeout`` (it is killed).
        """
        self.launch()
        return self.wait_ready(timeout)

    def launch(self) -> None:
        """Start the child without waiting for it: several servers start side by side, each
        then waited for with :meth:`wait_ready`. The first launch in a process waits for its
        role server's preload (up to ``ROLE_SERVER_START_S``), and launches in other threads
        meanwhile wait behind it."""
        from hogwild.cluster.roles import SHIM  # SIGTERM when this process dies, even by SIGKILL

        argv = ["ps", "serve", *self.args]
        # A ForkedRole (Popen's poll, wait, send_signal, stderr, returncode), or None: spawn.
        self.process = _owners_role_server().start_role(argv, env=self.env)
        if self.process is None:
            command = [sys.executable, "-c", SHIM, str(os.getpid()), *argv]
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                            text=True, env=self.env,
                                            start_new_session=True)  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def wait_ready(self, timeout: float = 120.0) -> str:
        """Wait for the launched child's ready line; the ``HOST:PORT`` it serves on.

        Raises:
            HogwildError: It exited, or printed no ready line within ``timeout`` (it is killed).
        """
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if self.process.poll() is not None or time.monotonic() > deadline:
                code = self.process.poll()
                self.kill()
                said = " | ".join(list(self.lines)[-5:]) or "nothing"
                why = f"exited with {code}" if code is not None else f"not ready in {timeout} s"
                raise HogwildError(f"hogwild ps serve {' '.join(self.args)} {why}: {said}")
        return self.address

    def _read(self) -> None:
        for line in self.process.stderr:
            line = line.rstrip("\n")
            self.lines.append(line)
            match = READY.match(line)
            if match and not self._ready.is_set():
                self.address = match.group(1)
                self._ready.set()

    def send_signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Send ``signum`` and wait for the exit (killing it after ``timeout``); the exit code."""
        if self.process is None:
            return 0
        self.send_signal(signum)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.process.returncode
        self._join()
        return code

    def kill(self) -> None:
        """SIGKILL and reap (no flush)."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGKILL)
            self.process.wait()
            self._join()

    def _join(self) -> None:
        if self._reader is not None:
            self._reader.join(5.0)
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


@contextmanager
def local_server(
    geometry, *, job: str = "test", initial: np.ndarray | None = None, cpus=None, **options
) -> Iterator:
    """A :class:`~hogwild_plugins.ps.serving.server.ParameterServer` in this process, stopped on
    exit.

    ``options`` are :class:`~hogwild_plugins.ps.serving.options.ServerOptions` fields;
    ``servers`` defaults to one server on a free port of 127.0.0.1.
    """
    from hogwild_plugins.ps.serving.options import ServerOptions
    from hogwild_plugins.ps.serving.server import ParameterServer

    options.setdefault("servers", ("127.0.0.1:0",))
    server = ParameterServer(geometry, ServerOptions(job=job, **options), initial)
    server.start(cpus)
    try:
        yield server
    finally:
        server.stop()
