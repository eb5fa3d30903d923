"""PyTorch's RPC parameter server (``torch.distributed.rpc``): a peer of Adam Fig. 9.

It stands beside ``bench/figures/adam_fig9_ps.py``.

The pattern of PyTorch's parameter-server tutorial: rank 0 holds the parameters and serves
remote calls; every other rank is a client that calls ``rpc_async("ps", apply_delta,
args=(delta,))`` and waits for the returned future. TensorPipe carries the tensors (it picks its
fastest transport for processes on one host). Here ``clients`` client ranks each push a float32
delta of ``floats`` values (1 MiB by default) synchronously, one at a time, for ``seconds`` from
a common start; the server adds each into its vector under a lock and returns a version number.
An update is one parameter changed by one delta, as Adam counts.

``--transport``: ``default`` lets TensorPipe choose, which for processes on one host means
shared memory (naming its ``shm`` transport and ``cma`` channel measures the same here); ``tcp``
restricts it
to its TCP transport (``uv``) and in-band channel (``basic``): the tensors cross the same
loopback as ours.

Run: ``python bench/peers/ps_torch_rpc.py [--floats 262144] [--clients 2] [--seconds 3]
[--transport default|tcp]``; prints one JSON line ``{"updates_per_s", "pushes_per_s", "gb_s",
"clients", "transport", "torch"}``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import threading
import time

_params = None
_lock = threading.Lock()
_version = 0


def apply_delta(delta):
    """Runs on the server rank: add ``delta`` into the parameters; the new version."""
    global _version
    with _lock:
        _params.add_(delta)
        _version += 1
        return _version


TCP_ONLY = {"_transports": ["uv"], "_channels": ["basic"]}  # TensorPipe's names


def _rank(rank: int, world: int, port: int, floats: int, windows: list, transport: str, out):
    import torch
    import torch.distributed.rpc as rpc

    global _params
    torch.set_num_threads(1)
    options = rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=8,
        init_method=f"tcp://127.0.0.1:{port}",
        rpc_timeout=120,
        **(TCP_ONLY if transport == "tcp" else {}),
    )
    if rank == 0:
        _params = torch.zeros(floats, dtype=torch.float32)
    rpc.init_rpc(
        "ps" if rank == 0 else f"client{rank}",
        rank=rank,
        world_size=world,
        rpc_backend_options=options,
    )
    counts = [0] * len(windows)
    if rank > 0:
        delta = torch.ones(floats, dtype=torch.float32)
        for _ in range(5):  # warm-up
            rpc.rpc_async("ps", apply_delta, args=(delta,)).wait()
        for i, (start, end) in enumerate(windows):
            time.sleep(max(0.0, start - time.time()))
            while time.time() < end:
                rpc.rpc_async("ps", apply_delta, args=(delta,)).wait()
                counts[i] += 1
    rpc.shutdown()  # waits for every rank
    out.put((rank, counts))


def measure(
    floats: int, clients: int, seconds: float, repeats: int = 1, transport: str = "default"
) -> dict:
    import torch

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    world = clients + 1
    start = time.time() + 20.0  # spawn, import torch, rendezvous
    windows = [
        (start + i * (seconds + 0.5), start + i * (seconds + 0.5) + seconds) for i in range(repeats)
    ]
    procs = [
        ctx.Process(target=_rank, args=(r, world, port, floats, windows, transport, out))
        for r in range(world)
    ]
    for proc in procs:
        proc.start()
    try:
        counts = dict(out.get(timeout=120 + repeats * (seconds + 0.5)) for _ in range(world))
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join()
    per_window = [sum(c[i] for c in counts.values()) / seconds for i in range(repeats)]
    pushes = statistics.median(per_window)
    return {
        "updates_per_s": pushes * floats,
        "pushes_per_s": pushes,
        "gb_s": pushes * floats * 4 / 1e9,
        "clients": clients,
        "windows_pushes_per_s": per_window,
        "transport": transport,
        "torch": torch.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--floats", type=int, default=262_144)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=1, help="timed windows (their median)")
    parser.add_argument("--transport", choices=("default", "tcp"), default="default")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rates = measure(args.floats, args.clients, args.seconds, args.repeats, args.transport)
    print(json.dumps(rates), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
