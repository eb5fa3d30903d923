"""Whether the default job's first epoch survives its copies: one-epoch runs, seeds, stores.

The default store gives every worker a copy of the weights that pushes its progress home every
64 examples and pulls the others' (``train.parameters = "replicate"``). Copies that start from the
same weights push deltas that agree, and home adds them up; with three or more copies this once
killed every unit of the second convolution in the first thousands of examples, leaving a
network at chance for the rest of the run. This benchmark trains the default job (Adam's MNIST
model, batch 1, the 60-epoch schedule's first epoch) for one epoch on real MNIST with
``--workers`` workers, per seed, for each contender, interleaved seed by seed:

* ``copies``: the default store as it is (since the cadence ramp, the copies exchange every
  example at first: ``Exchanger.cadences_now``);
* ``copies-unramped``: the same without the ramp (``train.cadence_ramp = 0``), as it was;
* ``copies-push8``: the same with its cadence capped at 8 examples (the ramp still climbs to
  it: 8 after 1,792 examples per copy at four copies);
* ``shared``: one copy every worker writes (``train.parameters = "shared"``), the control.

It prints one JSON line: per contender and worker count, each run's test accuracy, training
loss and training speed (examples/s of the epoch), the runs that died (test accuracy below 0.5;
a dead MNIST network scores 0.10-0.11), the median accuracy and the median speed. ``--out``
also writes it to a file.

    python bench/figures/copies_at_start.py --workers 2,4 --seeds 1-5 \\
        --out bench/results/copies_at_start.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.support.paths import SHARED_MNIST
from bench.support.record import measured_and_emitted

CONTENDERS = {
    "copies": [],
    "copies-unramped": ["--train.cadence_ramp=0"],
    "copies-push8": ["--train.n_push=8", "--train.n_fetch=8"],
    "shared": ["--train.parameters=shared"],
}
DEAD_BELOW = 0.5  # test accuracy: a dead network predicts one class (0.10-0.11 on MNIST)
RUN_TIMEOUT_S = 900


def _numbers(text: str) -> list[int]:
    """``"1-3,7"`` -> ``[1, 2, 3, 7]``."""
    out = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        out += range(int(low), int(high or low) + 1)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bench/figures/copies_at_start.py", description=__doc__.split("\n")[0]
    )
    add = parser.add_argument
    add(
        "--data",
        default=str(SHARED_MNIST) if SHARED_MNIST.exists() else None,
        help="MNIST directory (default: ../shared/datasets/mnist, else hogwild's download)",
    )
    add("--workers", type=_numbers, default=[4], help="worker counts, e.g. 2,4")
    add("--seeds", type=_numbers, default=[1, 2, 3, 4, 5], help="seeds, e.g. 1-5")
    known = ", ".join(CONTENDERS)
    add("--contenders", default="copies,copies-push8,shared", help=f"comma separated: {known}")
    add("--out", help="also write the JSON line here")
    args = parser.parse_args(argv)
    args.contenders = args.contenders.split(",")
    unknown = sorted(set(args.contenders) - set(CONTENDERS))
    if unknown:
        parser.error(f"--contenders: {', '.join(unknown)} unknown; known: {known}")
    if not args.data:
        parser.error("--data: no MNIST directory given and ../shared/datasets/mnist is absent")
    if min(args.workers) < 1 or min(args.seeds) < 0:
        parser.error("--workers must be positive and --seeds not negative")
    return args


def one_run(data: str, workers: int, seed: int, extra: list[str]) -> dict:
    """One epoch of the default job; its test accuracy, training loss and wall time."""
    with tempfile.TemporaryDirectory(prefix="hogwild-copies-") as scratch:
        metrics = Path(scratch) / "metrics.jsonl"
        argv = [
            sys.executable, "-m", "hogwild.cli", "train", "--data", data, "--epochs", "1",
            f"--train.workers={workers}", f"--train.seed={seed}", "--no-progress",
            "--metrics", str(metrics), *extra,
        ]  # fmt: skip
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        wall = time.perf_counter() - started
        if done.returncode:
            raise RuntimeError(f"{' '.join(argv)} exited with {done.returncode}: {done.stderr}")
        records = [json.loads(line) for line in metrics.read_text().splitlines()]
    epoch = [r for r in records if r["event"] == "epoch"][-1]
    return {
        "seed": seed,
        "test_accuracy": epoch["test_accuracy"],
        "train_loss": round(epoch["train_loss"], 4),
        "warned_at_chance": any(r["event"] == "at_chance" for r in records),
        "examples_per_s": round(epoch["examples_per_s"]),  # the epoch's training alone
        "wall_s": round(wall, 1),
    }


def measure(args: argparse.Namespace) -> dict:
    runs: dict[str, list[dict]] = {}
    for workers in args.workers:
        for seed in args.seeds:  # interleaved: a slow phase of the machine hits every contender
            for name in args.contenders:
                run = one_run(args.data, workers, seed, CONTENDERS[name])
                runs.setdefault(f"{name}/{workers}", []).append(run)
                print(json.dumps({"contender": name, "workers": workers, **run}), file=sys.stderr)
    summary = {}
    for key, rows in runs.items():
        accuracies = [r["test_accuracy"] for r in rows]
        summary[key] = {
            "runs": len(rows),
            "dead": sum(a < DEAD_BELOW for a in accuracies),
            "median_test_accuracy": statistics.median(accuracies),
            "min_test_accuracy": min(accuracies),
            "median_examples_per_s": statistics.median(r["examples_per_s"] for r in rows),
            "each": rows,
        }
    return {"benchmark": "copies_at_start", "dead_below": DEAD_BELOW, "results": summary}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return measured_and_emitted(__file__, sys.argv[1:] if argv is None else argv,
                                lambda: measure(args), args.out)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
