"""Three hosts against one: the default cluster job spread over network-namespace hosts.

The job: Adam's MNIST model on the schedule of :mod:`bench.support.paper_job` through ``hogwild
cluster --launcher ray --ps 3 --replicas 2 --workers-per-replica 1 --data-servers 1``, with
``cluster.host`` its host's address (every role binds its node's address under the job's CURVE
keys), run in one invocation of this script as:

1. ``hosts1_copies1``: one host (:class:`tests.hosts.Hosts`), a one-node Ray cluster of 6 CPUs;
2. ``hosts3_copies1``: three hosts joined by a bridge, a Ray cluster of 2 CPUs on each (Ray
   spreads the servers, one per node; the replicas and the data server fill the rest);
3. ``hosts3_copies3``: the same with ``cluster.copies = 3`` under an etcd on host 1.

The driver runs in host 1 in every case. For each run: examples/s (the mean of its epochs'
``examples_per_s``), the final test accuracy, the race (seconds from the driver's launch until an
epoch's record with test accuracy >= ``--target`` appears in its metrics file, as this script
polls it), and the bytes each host sent on its link (``eth0``'s transmit counter before and after:
what crossed the network; loopback traffic within a host is not counted).

Keys: ``hosts3_vs_1`` (examples/s of 3 hosts over 1, copies = 1) and ``copies3_vs_1`` (copies = 3
over copies = 1, 3 hosts), each against its target in ``targets`` and ``met``. The namespaces
share the machine's cores, so three hosts have no more CPU than one: the ratio measures what the
spread costs (a veth hop, the bridge, CURVE between hosts), not what more machines give.

Needs root (network namespaces), Ray and etcd. Run: ``python bench/figures/hosts.py --out
bench/results/hosts.json`` (``--quick``: one epoch on a subset, a smoke run). It prints one
JSON line; progress goes to stderr.
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

from bench.support.machine import describe_machine, versions
from bench.support.paper_job import PAPER_JOB
from bench.support.paths import REPO, SHARED_MNIST
from bench.support.record import emit_record, stamp
from tests.hosts.harness import Hosts, unavailable
from tests.hosts.ray_nodes import LEAN_ENV, ray_env, start_etcd, start_ray

RUNS = (("hosts1_copies1", 1, 1), ("hosts3_copies1", 3, 1), ("hosts3_copies3", 3, 3))
ROLE_CPUS = 6  # 3 parameter servers, 1 data server, 2 one-worker replicas
TARGETS = {"hosts3_vs_1": 0.9, "copies3_vs_1": 0.8}
POLL_S = 0.2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python bench/figures/hosts.py", description=__doc__)
    add = parser.add_argument
    add("--out", help="also write the JSON line here")
    add("--data", default=None, help="the MNIST idx directory (default: the shared one)")
    add("--epochs", type=int, default=None, help="each job's epochs (default 3; --quick: 1)")
    add("--subset", type=int, default=0, help="train on N examples (0: all; --quick: 6000)")
    add("--target", type=float, default=0.985, help="the race's test accuracy (0.985)")
    add("--bound-s", type=float, default=1800.0, help="each job's time limit (1800 s)")
    add("--quick", action="store_true", help="a smoke run: one epoch of 6,000 examples")
    args = parser.parse_args(argv)
    args.epochs = args.epochs or (1 if args.quick else 3)
    if args.quick and not args.subset:
        args.subset = 6000
    args.data = args.data or os.environ.get("HOGWILD_TEST_DATA") or str(SHARED_MNIST)
    if args.epochs < 1 or not 0 <= args.subset <= 60000 or not 0 < args.target <= 1:
        parser.error("--epochs must be >= 1, --subset in 0..60000, --target in (0, 1]")
    return args


def _epochs_seen(metrics: Path, seen: dict[int, float]) -> list[dict]:
    """The metrics file's epoch records; the first time each was seen noted in ``seen``."""
    if not metrics.exists():
        return []
    records = []
    for line in metrics.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if record.get("event") == "epoch":
            seen.setdefault(record["epoch"], time.monotonic())
            records.append(record)
    return records


def run_job(name: str, n_hosts: int, copies: int, args, work: Path) -> dict:
    """One job on ``n_hosts`` fresh hosts; its row (see the module docstring)."""
    print(f"hosts: {name}: {n_hosts} host(s), copies = {copies}", file=sys.stderr, flush=True)
    with Hosts(n_hosts) as hosts:
        nodes = list(range(1, n_hosts + 1))
        ray = start_ray(hosts, nodes, ROLE_CPUS // n_hosts)
        extra = [f"--cluster.copies={copies}"]
        if copies > 1:
            extra.append(f"--cluster.etcd={start_etcd(hosts, 1)}")
        if args.subset:
            extra.append(f"--train.subset={args.subset}")
        run_dir, metrics = work / name, work / f"{name}.jsonl"
        argv = [
            sys.executable, "-m", "hogwild.cli", "cluster", "--launcher", "ray",
            "--ray-address", ray, "--data", args.data, "--epochs", str(args.epochs),
            "--replicas", "2", "--workers-per-replica", "1", "--ps", "3", "--data-servers", "1",
            f"--cluster.host={hosts.address(1)}", "--checkpoint-dir", str(run_dir),
            "--metrics", str(metrics), "--no-progress", *PAPER_JOB, *extra,
        ]  # fmt: skip
        sent_before = [hosts.sent_bytes(h) for h in nodes]
        seen: dict[int, float] = {}
        launched = time.monotonic()
        driver = hosts.run(1, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=ray_env(hosts), cwd=str(REPO))  # fmt: skip
        try:
            while driver.poll() is None:
                if time.monotonic() - launched > args.bound_s:
                    raise TimeoutError(f"{name}: the job ran past --bound-s {args.bound_s:g}")
                _epochs_seen(metrics, seen)
                time.sleep(POLL_S)
            stdout, stderr = driver.communicate()
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.communicate()
        if driver.returncode != 0:
            raise RuntimeError(f"{name}: exit {driver.returncode}: {stderr[-3000:]}")
        epochs = _epochs_seen(metrics, seen)
        sent = [hosts.sent_bytes(h) - b for h, b in zip(nodes, sent_before, strict=True)]
    final = json.loads(stdout.strip().splitlines()[-1])
    reached = [r["epoch"] for r in epochs if (r.get("test_accuracy") or 0) >= args.target]
    return {
        "hosts": n_hosts,
        "copies": copies,
        "examples_per_s": sum(r["examples_per_s"] for r in epochs) / max(1, len(epochs)),
        "test_accuracy": final["test_accuracy"],
        "epoch_accuracy": [r.get("test_accuracy") for r in epochs],
        "seconds_to_target": round(seen[reached[0]] - launched, 1) if reached else None,
        "bytes_sent": {f"host{h}": b for h, b in zip(nodes, sent, strict=True)},
    }


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    why = unavailable()
    if why is not None:
        raise SystemExit(f"hosts: cannot make network-namespace hosts here: {why}")
    started = time.perf_counter()
    rows = {}
    with tempfile.TemporaryDirectory(prefix="hogwild-bench-hosts-") as work:
        for name, n_hosts, copies in RUNS:
            rows[name] = run_job(name, n_hosts, copies, args, Path(work))
    eps = {name: row["examples_per_s"] for name, row in rows.items()}
    ratios = {
        "hosts3_vs_1": eps["hosts3_copies1"] / eps["hosts1_copies1"],
        "copies3_vs_1": eps["hosts3_copies3"] / eps["hosts3_copies1"],
    }
    record = {
        "benchmark": "hosts",
        **{key: round(value, 3) for key, value in ratios.items()},
        "targets": TARGETS,
        "met": {key: ratios[key] >= target for key, target in TARGETS.items()},
        "runs": rows,
        "epochs": args.epochs,
        "subset": args.subset,
        "target_accuracy": args.target,
        "quick": args.quick,
        "ray_settings": LEAN_ENV,  # the nodes' and drivers' settings beyond Ray's defaults
        "machine": describe_machine(),
        "versions": versions(),
    }
    emit_record(stamp(record, __file__, argv, started), args.out)
    return record


if __name__ == "__main__":
    main()
