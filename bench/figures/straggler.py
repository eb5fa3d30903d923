"""A slow replica: an epoch handed out in portions on demand against one fixed shard per replica.

DistBelief (section 4.2) and Adam (section 3.2.5) both meet the straggler: a replica slower than
the others (its machine busier, its core shared) holds up every epoch that waits for its share.
``hogwild cluster`` hands each epoch out in portions on demand (``cluster.split = "portions"``,
:mod:`hogwild.cluster.coordinator`) so a faster replica takes more; ``"shards"`` is Adam's one
fixed shard per replica. Here both train the same one-epoch job (2 replicas x 1 worker, 1
parameter server, Adam's MNIST model), interleaved, ``--repeats`` times each:

- **busy**: a busy process shares replica 1's CPU (the CPU its ready line names), from the moment
  the replica is up to the epoch's record, so replica 1 trains at about half speed;
- **quiet**: nothing else runs (the control: on a quiet host the two splits should be alike).

It prints one JSON line: ``{"benchmark": "straggler", "results": [{"split", "busy",
"examples_per_s", "samples", "per_replica_examples"}, ...], "portions_vs_shards": {"busy": ..,
"quiet": ..}, "machine": .., "versions": .., "source": ..}``. ``--quick``: a tiny budget (an epoch
of 1,000 examples), a smoke test of the script and not a measurement: portions with the busy
process and shards without it (no ratio: ``portions_vs_shards`` is null both ways).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.support.job import Job
from bench.support.machine import describe_machine, versions
from bench.support.paper_job import PAPER_JOB
from bench.support.paths import SHARED_MNIST
from bench.support.record import emit_record, fresh_numba_cache, stamp

SPLITS = ("portions", "shards")
# quick: each split once and each of busy and quiet once: every path of the script (the busy
# process found, started and stopped; the quiet run) and of the cluster's two splits, in two jobs
# of the four; no split is then measured both ways, so the quick run gives no ratio
QUICK_RUNS = [("portions", True), ("shards", False)]
READY = re.compile(r"serving replica 1 \(\d+ worker\(s\) on CPUs ([\d, ]+);")
START_S = 300.0  # a cold numba cache compiles every kernel before the first epoch


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python bench/figures/straggler.py", description=__doc__)
    add = parser.add_argument
    add("--examples", type=int, default=None, help="the epoch's examples (default 60000)")
    add("--repeats", type=int, default=None, help="runs of each (split, busy) (default 3)")
    add("--quick", action="store_true", help="a tiny budget: a smoke test, not a measurement")
    add("--data", metavar="DIR", help=f"MNIST idx files (default {SHARED_MNIST})")
    add("--out", metavar="FILE", help="also write the JSON line to this file")
    args = parser.parse_args(argv)
    if args.examples is None:
        args.examples = 1000 if args.quick else 60000  # quick: the least it takes
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if not 1000 <= args.examples <= 60000 or args.repeats < 1:
        parser.error("--examples must be in 1000..60000 and --repeats >= 1")
    args.data = args.data or str(SHARED_MNIST)
    return args


def busy_code(cpu: int) -> str:
    """The program of the busy process on ``cpu``: it spins until it is killed."""
    return f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True:\n    pass\n"


def busy_loop(cpu: int) -> subprocess.Popen:
    """A process spinning on ``cpu`` until it is killed."""
    return subprocess.Popen([sys.executable, "-c", busy_code(cpu)], start_new_session=True)


def run_job(args, split: str, busy: bool, folder: Path, name: str) -> dict:
    """One epoch through ``hogwild cluster``; with ``busy``, a busy process on replica 1's CPU
    from its ready line to the epoch's record."""
    run_dir = folder / name
    command = [sys.executable, "-m", "hogwild.cli", "cluster", "--data", args.data]
    command += ["--epochs", "1", "--replicas", "2", "--workers-per-replica", "1", "--ps", "1"]
    command += ["--no-progress", f"--train.subset={args.examples}", f"--cluster.split={split}"]
    command += ["--checkpoint-dir", str(run_dir), "--metrics", str(run_dir / "metrics.jsonl")]
    command += PAPER_JOB
    job = Job(command, folder, name)
    spinner, cpu = None, None
    try:
        log = run_dir / "logs" / "replica-1.log"
        deadline = time.monotonic() + START_S
        while busy and cpu is None and job.proc.poll() is None and time.monotonic() < deadline:
            found = READY.search(log.read_text(errors="replace")) if log.exists() else None
            if found:
                cpu = int(found.group(1).split(",")[0])
                spinner = busy_loop(cpu)
            else:
                time.sleep(0.01)
        if spinner is not None:
            # the epoch's record (its rate measured) ends the spinner's part: the job's final
            # evaluation and the roles' stop measure nothing, and spinning through them would
            # only take a core from whatever else runs here
            _until_epoch_recorded(job, run_dir, START_S + 600)
            spinner.kill()
            spinner.wait()
            spinner = None
        job.wait(START_S + 600)
        summary = job.summary()
    finally:
        job.stop()
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    if busy and cpu is None:
        raise RuntimeError(f"replica 1 never said which CPU it runs on ({log})")
    epoch = [r for r in _records(run_dir) if r.get("event") == "epoch"][-1]
    return {
        "examples_per_s": summary["examples_per_s"],
        "test_accuracy": summary["test_accuracy"],
        "per_replica_examples": epoch["per_replica_examples"],
        "busy_cpu": cpu,
    }


def _until_epoch_recorded(job: Job, run_dir: Path, timeout: float) -> None:
    """Wait until the job's metrics file holds an epoch's record or the job has ended."""
    deadline = time.monotonic() + timeout
    path = run_dir / "metrics.jsonl"
    while job.proc.poll() is None and time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        complete = text[: text.rfind("\n") + 1]  # a line still being written is not read
        if any(json.loads(line).get("event") == "epoch" for line in complete.splitlines()):
            return
        time.sleep(0.05)


def _records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def measure(args) -> dict:
    runs = QUICK_RUNS if args.quick else [(s, b) for b in (True, False) for s in SPLITS]
    samples: dict[tuple, list[dict]] = {run: [] for run in runs}
    with tempfile.TemporaryDirectory(prefix="bench-straggler-") as tmp:
        for rep in range(args.repeats):
            for split, busy in runs[rep % len(runs) :] + runs[: rep % len(runs)]:
                name = f"{split}-{'busy' if busy else 'quiet'}-{rep}"
                answer = run_job(args, split, busy, Path(tmp), name)
                samples[(split, busy)].append(answer)
                print(
                    f"repeat {rep + 1}/{args.repeats}, {split}, {'busy' if busy else 'quiet'}: "
                    f"{answer['examples_per_s']:,.0f} examples/s, per replica "
                    f"{answer['per_replica_examples']}",
                    file=sys.stderr,
                    flush=True,
                )
    rows, rate = [], {}
    for split, busy in runs:
        found = samples[(split, busy)]
        rates = [s["examples_per_s"] for s in found]
        middle = sorted(found, key=lambda s: s["examples_per_s"])[len(found) // 2]
        rate[(split, busy)] = statistics.median(rates)
        rows.append(
            {
                "split": split,
                "busy": busy,
                "examples_per_s": rate[(split, busy)],
                "samples": rates,
                "test_accuracy": statistics.median(s["test_accuracy"] for s in found),
                "per_replica_examples": middle["per_replica_examples"],
                "busy_cpu": middle["busy_cpu"],
            }
        )
    ratio = {
        "busy" if busy else "quiet": rate[("portions", busy)] / rate[("shards", busy)]
        if ("portions", busy) in rate and ("shards", busy) in rate
        else None
        for busy in (True, False)
    }
    return {
        "benchmark": "straggler",
        "results": rows,
        "portions_vs_shards": ratio,
        "settings": {"examples": args.examples, "repeats": args.repeats, "quick": args.quick},
        "machine": describe_machine(),
        "versions": versions(),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    started = time.perf_counter()
    with fresh_numba_cache():  # every job compiles into one cache made for this run
        try:
            record = measure(args)
        except (RuntimeError, OSError, ValueError) as exc:
            print(f"python bench/figures/straggler.py: error: {exc}", file=sys.stderr)
            return 2
    emit_record(stamp(record, __file__, argv, started), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
