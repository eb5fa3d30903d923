"""What crossing hosts costs a partitioned replica: shared memory, frames on loopback, two hosts.

One replica of two partitions (``hogwild train --partitions 2``, one example in flight) trains
one epoch of the first ``--examples`` examples on the paper job's model grown by ``--factor``
(feature maps multiplied: ``bench/support/grown_model.py``) three ways, in the same run:

- ``shm``: both partitions on this host, exchanging through the shared arena (the control);
- ``frames``: the same two partitions as two host groups on loopback (``model.partition_hosts``
  with two ports, ``hogwild partition-host`` for partition 1): every block crosses as a ZeroMQ
  frame, nothing is shared; the cost of the frames alone;
- ``hosts2`` (root only; skipped with the reason elsewhere): partition 0 in one network-namespace
  host and partition 1 in another, under CURVE keys; the cost of the (virtual) network.

Each run records ``examples_per_s`` (the epoch's, training only), ``test_accuracy`` and, for
``hosts2``, the bytes host 2 sent per example beside the plan's ``bytes_per_example``. The
record's ``frames_vs_shm`` and ``hosts2_vs_shm`` are the ratios of examples/s. No target is set
by the issue; with one example in flight every boundary is a wait, so the ratios show how much
of each example's time the exchange takes at this size.

Run: ``python bench/figures/partition_hosts.py --factor 16 --examples 400 --out
bench/results/partition_hosts.json`` (``--quick``: a tiny smoke run). It prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.support.grown_model import one_epoch_command
from bench.support.machine import describe_machine, versions
from bench.support.paths import REPO, SHARED_MNIST
from bench.support.record import emit_record, stamp

PORT = 5711
BOUND_S = 3600.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="partition_hosts.py", description=__doc__)
    parser.add_argument("--factor", type=int, default=16, help="feature-map multiplier")
    parser.add_argument("--examples", type=int, default=400, help="training examples (1 epoch)")
    parser.add_argument(
        "--data",
        default=os.environ.get("HOGWILD_DATA", str(SHARED_MNIST)),
        help="MNIST idx directory (default: $HOGWILD_DATA, else the shared copy)",
    )
    parser.add_argument("--no-hosts", action="store_true", help="skip the namespace hosts run")
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run")
    parser.add_argument("--out", help="write the JSON line here too")
    args = parser.parse_args(argv)
    if args.quick:
        args.factor, args.examples = 1, 100
    if args.factor < 1 or args.examples < 1:
        parser.error("--factor and --examples must be positive")
    return args


def train_argv(args, metrics: Path, extra: list[str]) -> list[str]:
    options = ["--partitions", "2", "--metrics", str(metrics), *extra]
    return one_epoch_command(args.data, args.examples, args.factor, options)


def finish(name: str, process: subprocess.Popen) -> str:
    try:
        out, err = process.communicate(timeout=BOUND_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"{name}: exit {process.returncode}: {err[-3000:]}")
    return out


def figures(metrics: Path) -> dict:
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    epoch = next(r for r in records if r["event"] == "epoch")
    final = next(r for r in records if r["event"] == "final")
    return {
        "examples_per_s": round(epoch["examples_per_s"], 2),
        "test_accuracy": final["test_accuracy"],
        "connections": final["connections"],
        "bytes_per_example": final["bytes_per_example"],
    }


def run_here(name: str, args, work: Path, hosts: list[str] | None) -> dict:
    """``shm`` (no hosts) or ``frames`` (two loopback host groups) in this namespace."""
    metrics = work / f"{name}.jsonl"
    follower = None
    extra = []
    if hosts:
        extra = [f"--model.partition_hosts={','.join(hosts)}"]
        follower = subprocess.Popen(
            [sys.executable, "-m", "hogwild.cli", "partition-host", "--bind", hosts[1]],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
        )  # fmt: skip
    leader = subprocess.Popen(train_argv(args, metrics, extra), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=str(REPO))  # fmt: skip
    try:
        finish(name, leader)
        if follower is not None:
            finish(f"{name} (partition-host)", follower)
    finally:
        for process in (leader, follower):
            if process is not None and process.poll() is None:
                process.kill()
                process.communicate()
    return figures(metrics)


def run_on_hosts(args, work: Path) -> dict:
    """Partition 0 in namespace host 1, partition 1 in host 2, under CURVE keys."""
    from hogwild.net.auth import make_keys
    from tests.hosts.harness import Hosts

    keys = str(make_keys(work / "keys"))
    metrics = work / "hosts2.jsonl"
    with Hosts(2) as hosts:
        at = [f"{hosts.address(h)}:{PORT}" for h in (1, 2)]
        follower = hosts.run(
            2, [sys.executable, "-m", "hogwild.cli", "partition-host", "--bind", at[1],
                "--keys", keys],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
        )  # fmt: skip
        sent_before = hosts.sent_bytes(2)
        extra = [f"--model.partition_hosts={','.join(at)}", f"--cluster.keys={keys}"]
        leader = hosts.run(1, train_argv(args, metrics, extra), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, cwd=str(REPO))  # fmt: skip
        finish("hosts2", leader)
        finish("hosts2 (partition-host)", follower)
        sent = hosts.sent_bytes(2) - sent_before
    row = figures(metrics)
    row["host2_bytes_sent_per_example"] = round(sent / args.examples)
    return row


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    from tests.hosts.harness import unavailable

    started = time.perf_counter()
    from hogwild.net.ports import free_ports

    runs: dict[str, dict] = {}
    skipped = None
    with tempfile.TemporaryDirectory(prefix="hogwild-bench-partition-hosts-") as work:
        runs["shm"] = run_here("shm", args, Path(work), None)
        loopback = [f"127.0.0.1:{port}" for port in free_ports(2)]
        runs["frames"] = run_here("frames", args, Path(work), loopback)
        skipped = "--no-hosts" if args.no_hosts else unavailable()
        if skipped is None:
            runs["hosts2"] = run_on_hosts(args, Path(work))
    shm = runs["shm"]["examples_per_s"]
    record = {
        "benchmark": "partition_hosts",
        "frames_vs_shm": round(runs["frames"]["examples_per_s"] / shm, 3),
        "hosts2_vs_shm": round(runs["hosts2"]["examples_per_s"] / shm, 3)
        if "hosts2" in runs
        else None,
        "hosts2_skipped": skipped,
        "runs": runs,
        "factor": args.factor,
        "examples": args.examples,
        "in_flight": 1,
        "quick": args.quick,
        "machine": describe_machine(),
        "versions": versions(),
    }
    emit_record(stamp(record, __file__, argv, started), args.out)
    return record


if __name__ == "__main__":
    main()
