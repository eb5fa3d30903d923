"""A server function in a child process, as the parameter-server benchmark runs its servers.

:class:`ChildServer` runs ``target(*args, conn)`` in a child process (the target pins itself to the
CPUs it is given), takes its address from the pipe as its first message, tells the CPU time the
process has used (from ``/proc``), and stops it on request (or kills it). The raw pyzmq yardstick
(:mod:`bench.peers.ps_raw_zmq`) and the parameter server of the loopback measurements
(:mod:`bench.figures.adam_fig9_ps`) both run this way, forked from :func:`warm_forkserver`'s server:
a spawned child imports the benchmark afresh, and a spawned parameter server loads its kernels
afresh too (about 2 CPU-seconds; six such servers a run on two cores), where a forked one finds them
loaded. What a server measures is a difference of its CPU time, which its start does not enter.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path

STOP_S = 10.0


def warm_forkserver(*modules: str):
    """Multiprocessing's forkserver context, its server importing the main script and
    ``modules`` once before it forks any child (a module that loads kernels when imported loads
    them there). Nothing those imports start may be a thread: the server forks."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["__main__", *modules])
    return ctx


class ChildServer:
    """``target(*args, conn)`` in a child process of ``context`` (default: spawned);
    :attr:`address` is its first message."""

    def __init__(self, target, *args, timeout: float = 120.0, context=None) -> None:
        ctx = context or mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=target, args=(*args, child), daemon=True)
        self.process.start()
        deadline = time.monotonic() + timeout
        while not self._conn.poll(0.1):
            if not self.process.is_alive() or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"{target.__name__} did not start (exit code {self.process.exitcode})"
                )
        self.address = self._conn.recv()

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
