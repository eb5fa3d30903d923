"""A synchronous group's replicas as processes against the same replicas as threads: batch passes/s.

``hogwild cluster``'s Sandblaster, AllReduce and hybrid groups run each replica as a process of its
own (``hogwild cluster member``), which asks its coordinator for portions as control messages
(:mod:`hogwild_plugins.ps.sandblaster.board_service`); the threads of one process they replaced
called the board directly. Both are run here side by side on the same parts: two parameter
servers (the group's shards), the coordinator's :class:`~hogwild_plugins.ps.sandblaster.batch.
BatchObjective` (a whole-gradient pass over a batch, gathered on the shards), ``--workers``
replicas, a 784-64-10 perceptron and the first ``--examples`` MNIST images, interleaved,
``--repeats`` times each:

- **threads** (the control): :class:`~hogwild_plugins.ps.sandblaster.replica.SandblasterReplica`
  threads on the coordinator's in-process board;
- **processes**: the same loop in ``hogwild cluster member`` processes, through the board service
  on a control server.

It prints one JSON line: ``{"benchmark": "sandblaster_members", "results": [{"mode", "passes",
"seconds", "passes_per_s", "examples_per_s", "portions"}, ...], "processes_vs_threads": ...}``
(the best run's passes/s of each, processes over threads: what the messages cost against direct
calls, as the portion size sets it). ``--quick``: a tiny budget, a smoke test of the script and
not a measurement.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from contextlib import ExitStack
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

import numpy as np

from bench.support.machine import describe_machine, versions
from bench.support.paths import SHARED_MNIST
from bench.support.record import emit_record, fresh_numba_cache, stamp

JOB = "members-bench"
LAYERS = [{"type": "fc", "units": 64}, {"type": "relu"}, {"type": "fc", "units": 10},
          {"type": "softmax"}]  # fmt: skip
START_S = 300.0  # a member compiles (or loads) its kernel before its ready line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bench/figures/sandblaster_members.py", description=__doc__
    )
    add = parser.add_argument
    add("--examples", type=int, default=None, help="the batch's examples (default 10000)")
    add("--workers", type=int, default=2, help="replicas of the group (default 2)")
    add("--passes", type=int, default=None, help="batch passes per run (default 20)")
    add("--repeats", type=int, default=None, help="runs of each mode (default 3)")
    add("--quick", action="store_true", help="a tiny budget: a smoke test, not a measurement")
    add("--data", metavar="DIR", help=f"MNIST idx files (default {SHARED_MNIST})")
    add("--out", metavar="FILE", help="also write the JSON line to this file")
    args = parser.parse_args(argv)
    args.examples = args.examples or (500 if args.quick else 10_000)
    args.passes = args.passes or (2 if args.quick else 20)
    args.repeats = args.repeats or (1 if args.quick else 3)
    if not 100 <= args.examples <= 60_000 or args.workers < 1 or args.passes < 1:
        parser.error("--examples must be in 100..60000, --workers and --passes >= 1")
    args.data = args.data or str(SHARED_MNIST)
    return args


def start_members(args, servers: list[str], address: str, folder: Path) -> list:
    """``--workers`` member processes of group 0, told the coordinator at ``address``; once
    every one said ready."""
    from hogwild.cluster.roles import spawn_role, tee_stderr
    from hogwild.config import config_from_dict

    config = config_from_dict({
        "model": {"input": [1, 28, 28], "layers": LAYERS},
        "ps": {"servers": servers, "job": JOB},
        "cluster": {"framework": "sandblaster", "replicas": 1,
                    "workers_per_replica": args.workers},
    })  # fmt: skip
    config_file = folder / "job.json"
    config_file.write_text(json.dumps(config.to_dict()))
    members = []
    for i in range(args.workers):
        argv = ("cluster", "--config", str(config_file), "--data", args.data, "member",
                "--index", str(i), "--coordinator", address)  # fmt: skip
        process = spawn_role(argv)
        ready, lines = threading.Event(), deque(maxlen=20)
        reader = tee_stderr(process, folder / f"member-{i}.log", lines, lambda _a, r=ready: r.set())
        members.append((process, reader, ready, lines))
    deadline = time.monotonic() + START_S
    for process, _, ready, lines in members:
        while not ready.wait(0.05):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"a member did not start: {' | '.join(lines)}")
    return members


def stop_members(members: list) -> None:
    for process, reader, _, _ in members:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        reader.join(5)
        process.stderr.close()


def stop_threads(board, threads: list[threading.Thread]) -> None:
    """Close the board, which ends the replica threads' loops, then join them (before their
    clients close)."""
    board.close()
    for thread in threads:
        thread.join(20)


def run(args, mode: str, images, labels, network, folder: Path) -> dict:
    """``--passes`` batch passes of the coordinator over ``--workers`` replicas in ``mode``."""
    from hogwild_plugins.ps.client import PSClient
    from hogwild_plugins.ps.layout import ModelGeometry
    from hogwild_plugins.ps.sandblaster.batch import BatchObjective, Board
    from hogwild_plugins.ps.sandblaster.board_service import BoardService
    from hogwild_plugins.ps.sandblaster.group import PUSH_EVERY, portion_size
    from hogwild_plugins.ps.sandblaster.portions import PortionScheduler
    from hogwild_plugins.ps.sandblaster.replica import (
        Examples,
        PortionGradient,
        SandblasterReplica,
    )
    from hogwild_plugins.ps.sandblaster.vectors import ShardVectors
    from hogwild_plugins.ps.serving.launch import local_server

    from hogwild.net.control import ControlServer
    from hogwild.net.ports import free_ports

    order = np.arange(args.examples)
    portion = portion_size(args.examples, args.workers)
    servers = [f"127.0.0.1:{port}" for port in free_ports(2)]
    with ExitStack() as stack:
        for i in range(2):
            stack.enter_context(local_server(ModelGeometry(network.n_params), job=JOB,
                                             servers=servers, index=i, threads=1))  # fmt: skip
        client = stack.enter_context(PSClient(servers, JOB, client_id=1))
        board = Board(PortionScheduler(push_every=PUSH_EVERY, max_copies=2), timeout_s=120.0)
        stack.callback(board.close)
        if mode == "threads":
            threads = []
            for i in range(args.workers):
                rc = stack.enter_context(PSClient(servers, JOB, client_id=10 + i))
                examples = Examples(images, labels, order, portion)
                replica = SandblasterReplica(i, rc, board, PortionGradient(network, examples))
                threads.append(threading.Thread(target=replica.run, daemon=True))
                threads[-1].start()
            stack.callback(stop_threads, board, threads)
        else:
            service = BoardService(range(args.workers), silence_s=120.0)
            control = ControlServer("127.0.0.1:0", JOB, service.answer)
            address = control.start()
            stack.callback(control.stop)
            members = start_members(args, servers, address, folder)
            stack.callback(stop_members, members)
            stack.callback(service.close)
            service.install(board, order, portion)
        objective = BatchObjective(ShardVectors(client), board, args.examples, portion)
        objective()  # the first pass: every replica joined and fetched once
        began = time.perf_counter()
        for _ in range(args.passes):
            objective()
        seconds = time.perf_counter() - began
    return {
        "mode": mode,
        "passes": args.passes,
        "seconds": round(seconds, 3),
        "passes_per_s": round(args.passes / seconds, 3),
        "examples_per_s": round(args.passes * args.examples / seconds, 1),
        "portions": objective.n_portions,
    }


def measure(args) -> dict:
    from hogwild.config import config_from_dict
    from hogwild.data.mnist import load_mnist
    from hogwild.model.loops import LABEL_DTYPE
    from hogwild.model.network import build_network

    data = load_mnist(args.data, download=False, progress=False)
    images = np.ascontiguousarray(data.train_images[: args.examples].reshape(args.examples, -1))
    labels = data.train_labels[: args.examples].astype(LABEL_DTYPE)  # the jobs' kernels'
    network = build_network(config_from_dict({"model": {"input": [1, 28, 28],
                                                          "layers": LAYERS}}).model)  # fmt: skip
    results = []
    with tempfile.TemporaryDirectory(prefix="hogwild-members-bench-") as folder:
        for repeat in range(args.repeats):
            for mode in ("threads", "processes"):  # interleaved: the machine's drift shared
                result = run(args, mode, images, labels, network, Path(folder))
                print(f"{mode} ({repeat + 1}/{args.repeats}): {result}", file=sys.stderr)
                results.append(result)
    best = {m: max(r["passes_per_s"] for r in results if r["mode"] == m)
            for m in ("threads", "processes")}  # fmt: skip
    return {
        "benchmark": "sandblaster_members",
        "examples": args.examples,
        "workers": args.workers,
        "results": results,
        "processes_vs_threads": round(best["processes"] / best["threads"], 3),
        "machine": describe_machine(),
        "versions": versions(),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    started = time.perf_counter()
    with fresh_numba_cache():
        try:
            record = measure(args)
        except (RuntimeError, OSError, ValueError) as exc:
            print(f"python bench/figures/sandblaster_members.py: error: {exc}", file=sys.stderr)
            return 2
    emit_record(stamp(record, __file__, argv, started), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
