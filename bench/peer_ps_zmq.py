"""Yardstick for ``bench/ps.py``: raw pyzmq request/reply of 1 MiB frames, and the servers'
process wrappers the benchmark shares.

:func:`raw_server` is the least a ZeroMQ server can do with a 1 MiB push: a ROUTER that
receives it without copying, adds it into a float32 vector with numpy (``add=True``, the issue's
yardstick: "the server adding each into a float32 vector") or leaves it (``add=False``: the
transport alone), and answers two bytes; :func:`raw_client` is a DEALER sending one request at a
time and waiting for each answer. Their rate, with the same number of clients and the same
transport, is what the parameter server's push-and-acknowledge is measured against.

:class:`ChildServer` runs a server function in a spawned process pinned to some CPUs, reports
its address through a pipe, tells the CPU time it has used (from ``/proc``), and stops it on
request (or kills it): the raw server and the parameter server of the loopback measurements both
run this way.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import time
from pathlib import Path

import numpy as np

STOP_S = 10.0
WARMUP = 20  # requests before the clock starts


def raw_server(cpus: list[int], transport: str, add: bool, conn) -> None:
    """A ROUTER answering every request with ``b"ok"`` until the parent says stop; with ``add``,
    each request's frame is first added into a float32 vector of its size."""
    import zmq

    os.sched_setaffinity(0, cpus)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    if transport == "tcp":
        endpoint = f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}"
    else:
        endpoint = f"ipc:///tmp/hogwild-bench-raw-{os.getpid()}-{int(add)}.sock"
        sock.bind(endpoint)
    total = np.zeros(262_144, np.float32)
    conn.send(endpoint)
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    parent = os.getppid()
    while not conn.poll(0) and os.getppid() == parent:
        if poller.poll(100):
            parts = sock.recv_multipart(copy=False)
            if add:
                np.add(total, np.frombuffer(parts[-1].buffer, np.float32), out=total)
            sock.send_multipart([parts[0], b"ok"])
    sock.close(linger=0)
    ctx.term()
    if transport != "tcp":  # ZeroMQ leaves the endpoint's file behind
        with contextlib.suppress(FileNotFoundError):
            os.unlink(endpoint.removeprefix("ipc://"))
    conn.send(None)


def raw_client(endpoint: str, seconds: float, *, ready) -> tuple[float, int]:
    """Bytes per second of synchronous 1 MiB requests, and the requests sent (a Gang task)."""
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    payload = np.ones(262_144, np.float32)
    try:
        for _ in range(WARMUP):
            sock.send(payload, copy=False)
            sock.recv()
        ready()
        count, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            sock.send(payload, copy=False)
            if not sock.poll(30_000):
                raise TimeoutError(f"raw server {endpoint} stopped answering")
            sock.recv()
            count += 1
        return count * payload.nbytes / (time.perf_counter() - started), count + WARMUP
    finally:
        sock.close(linger=0)
        ctx.term()


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
