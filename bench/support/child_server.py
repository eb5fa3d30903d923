"""A server function in a spawned process, as the parameter-server benchmark runs its servers.

:class:`ChildServer` runs ``target(*args, conn)`` in a spawned process (the target pins itself to
the CPUs it is given), takes its address from the pipe as its first message, tells the CPU time
the process has used (from ``/proc``), and stops it on request (or kills it). The raw pyzmq
yardstick (:mod:`bench.peers.ps_raw_zmq`) and the parameter server of the loopback measurements
(:mod:`bench.figures.adam_fig9_ps`) both run this way.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path

STOP_S = 10.0


class ChildServer:
    """``target(*args, conn)`` in a spawned process; :attr:`address` is its first message."""

    def __init__(self, target, *args, timeout: float = 120.0) -> None:
        ctx = mp.get_context("spawn")
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
