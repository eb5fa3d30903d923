"""The yardstick of ``bench/figures/adam_fig9_ps.py``: raw pyzmq request/reply of 1 MiB frames.

:func:`raw_server` is the least a ZeroMQ server can do with a 1 MiB push: a ROUTER that
receives it without copying, adds it into a float32 vector with numpy (``add=True``: "the server
adding each into a float32 vector") or leaves it (``add=False``: the transport alone), and
answers two bytes; :func:`raw_client` is a DEALER sending one request at a time and waiting for
each answer. Their rate, with the same number of clients and the same transport, is what the
parameter server's push-and-acknowledge is measured against. The figure runs the raw server in a
:class:`bench.support.child_server.ChildServer`, as it runs the parameter server.
"""

from __future__ import annotations

import contextlib
import os
import time

import numpy as np

from bench.support.child_server import alive

WARMUP = 20  # requests before the clock starts


def raw_server(bench: int, cpus: list[int], transport: str, add: bool, conn) -> None:
    """A ROUTER answering every request with ``b"ok"`` until the benchmark (pid ``bench``) says
    stop or is gone; with ``add``,
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
    while not conn.poll(0) and alive(bench):
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
    with contextlib.suppress(BrokenPipeError):  # the benchmark gone
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
