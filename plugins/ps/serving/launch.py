"""Starting parameter servers: as a child process (``hogwild ps serve``) or in this process.

:class:`ServeProcess` runs ``hogwild ps serve ...`` as a child, reads its stderr from a thread,
and returns from :meth:`~ServeProcess.start` once the child printed its ready line
(``hogwild ps: serving ... on HOST:PORT``), with the address it serves on; a child that exits or
stays silent past the timeout is an error quoting its last lines. :meth:`~ServeProcess.stop`
sends SIGTERM (a final flush, exit 143) and kills it if it does not exit in time. Launchers, tests
and benchmarks use it; the child is always reaped.

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

from hogwild.cluster.roles import READY
from hogwild.errors import HogwildError

__all__ = ["ServeProcess", "local_server"]


class ServeProcess:
    """``hogwild ps serve ARGS`` as a child process, stopped (SIGTERM) when its owner dies, even by
    SIGKILL: the kernel's death signal follows the thread that called :meth:`start`.

    Args:
        args: Arguments after ``hogwild ps serve``.
        env: Extra environment variables for the child.
    """

    def __init__(self, args: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.args = list(args)
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen | None = None
        self.lines: deque[str] = deque(maxlen=200)
        self.address: str | None = None
        self._ready = threading.Event()
        self._reader: threading.Thread | None = None

    def start(self, timeout: float = 120.0) -> str:
        """Start the child and wait for its ready line; the ``HOST:PORT`` it serves on.

        Raises:
            HogwildError: It exited, or printed no ready line within ``timeout`` (it is killed).
        """
        self.launch()
        return self.wait_ready(timeout)

    def launch(self) -> None:
        """Start the child without waiting for it: several servers start side by side, each
        then waited for with :meth:`wait_ready`."""
        from hogwild.cluster.roles import SHIM  # SIGTERM when this process dies, even by SIGKILL

        command = [sys.executable, "-c", SHIM, str(os.getpid()), "ps", "serve", *self.args]
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        text=True, env=self.env)  # fmt: skip
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
                self.process.kill()
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
