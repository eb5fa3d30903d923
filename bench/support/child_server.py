"""A server function in a child process, as the parameter-server benchmark runs its servers.

:class:`ChildServer` runs ``target(pid, *args, conn)`` in a child process (the target pins itself to
the CPUs it is given), takes its address from the pipe as its first message, tells the CPU time the
process has used (from ``/proc``), and stops it on request (or kills it). The raw pyzmq yardstick
(:mod:`bench.peers.ps_raw_zmq`) and the parameter server of the loopback measurements
(:mod:`bench.figures.adam_fig9_ps`) both run this way, forked from :func:`warm_forkserver`'s server:
a spawned parameter server loads its kernels afresh (about 2 CPU-seconds; six such servers a run on
two cores), where a forked one finds them loaded (it says so: :attr:`ChildServer.warm`). Each child
watches the benchmark's pid and stops when it is gone. What a server measures is a difference of its
CPU time, which its start does not enter.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import time
from collections.abc import Iterator
from pathlib import Path

STOP_S = 10.0


@contextlib.contextmanager
def warm_forkserver(*modules: str) -> Iterator:
    """Multiprocessing's forkserver context while inside, its server started here having
    imported ``modules`` once before it forks any child (a module that loads kernels when
    imported loads them there); the server ended on the way out.

    The server starts with this process's ``sys.path`` (``PYTHONPATH``, and ``PYTHONSAFEPATH``
    so that the working directory shadows nothing), as :mod:`hogwild.training.zygote` starts
    its own: Python 3.11's forkserver ignores the ``sys_path`` multiprocessing hands it, and a
    preload it cannot import is skipped silently (a server then starts cold). Numba starts no
    thread; numpy's OpenBLAS pool is ended by its own atfork handler at each fork.
    """
    from multiprocessing import forkserver

    from hogwild.training.zygote import server_import_path, stop_server

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(modules))
    try:
        with server_import_path():
            forkserver.ensure_running()
        yield ctx
    finally:
        stop_server()  # its children are gone by now: the ChildServers stopped them


class ChildServer:
    """``target(watched, *args, conn)`` in a child process of ``context`` (default: spawned),
    ``watched`` this process's pid (a forked child's parent is the forkserver: it watches this
    one, and stops when it is gone); :attr:`address` is its first message, and :attr:`warm`
    whether it found its kernels loaded, where it says (its first message
    ``(address, warm)``)."""

    def __init__(self, target, *args, timeout: float = 120.0, context=None) -> None:
        ctx = context or mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=target, args=(os.getpid(), *args, child), daemon=True)
        self.process.start()
        deadline = time.monotonic() + timeout
        while not self._conn.poll(0.1):
            if not self.process.is_alive() or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"{target.__name__} did not start (exit code {self.process.exitcode})"
                )
        first = self._conn.recv()
        self.address, self.warm = first if isinstance(first, tuple) else (first, None)

    def cpu_seconds(self) -> float:
        """CPU time the server process has used so far, every thread's, user and system."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self):
        """Ask it to stop; its last message (a status, or None)."""
        answer = None
        try:
            self._conn.send("stop")
            if self._conn.poll(STOP_S):
                answer = self._conn.recv()
        except (OSError, EOFError):
            pass
        self.process.join(STOP_S)
        self.kill()
        return answer

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()

    def __enter__(self) -> ChildServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def alive(pid: int) -> bool:
    """Whether process ``pid`` (the benchmark a server was started by) still runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of another user took the pid: ours is gone
        return False
    return True
