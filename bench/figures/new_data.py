"""The cluster's defaults on data nobody tuned them for: `hogwild cluster` against `train`.

``hogwild cluster``'s defaults (Downpour, Adagrad on the servers, an exchange every 512 examples)
and the single-node job's were tuned on MNIST. This script runs, on each dataset, the bundled job
for ``--epochs`` epochs (12) both ways, with nothing set but the data and the epochs (and, for a
variant of the cluster's defaults, ``--cluster-args``, given to every cluster job):

* ``single``: ``python -m hogwild.cli train --data DIR --epochs E``;
* ``cluster``: ``python -m hogwild.cli cluster --data DIR --epochs E`` (2 replicas, 1 server);

once per seed of ``--seeds`` (1, 2, 3), and reports each job's final test accuracy, each kind's
mean over the seeds and ``gap_points`` = mean single - mean cluster, in points, against
``--target`` (1 point); asynchronous jobs differ from run to run, and on the digits one test
image is 0.22 points, hence the seeds. The datasets (``--datasets``):

* ``digits``: scikit-learn's handwritten digits (shipped in its wheel), 1,347 training and 450
  test images, each 8x8 pixel made a 3x3 block and padded to 28x28
  (:mod:`bench.support.digits`): a dataset of MNIST's shape nobody tuned for, and 45 times smaller;
* ``mnist``: the MNIST idx files of ``--data`` (the shared ones by default), the row that says
  nothing regressed where the defaults were tuned (``--mnist-subset N``: its first N training
  examples, for a shorter run).

Run alone on the machine (the jobs run one after another, on every core):
``python bench/figures/new_data.py --out bench/results/new_data.json`` (``--quick``: 2 epochs,
digits only, a smoke test). It prints one JSON line; progress goes to stderr. Needs
scikit-learn (``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from scipy import stats

from bench.support.digits import write_digits
from bench.support.job import Job
from bench.support.machine import describe_machine, versions
from bench.support.paths import SHARED_MNIST
from bench.support.record import emit_record, measured

DATASETS = ("digits", "mnist")
JOB_TIMEOUT_S = 7200.0
DIGITS_SPLIT_SEED = 0  # the digits' test set: one split for every seed's jobs
# flags the script sets on every job, which --cluster-args may not set again
RESERVED = ("--data", "--seed", "--epochs", "--metrics", "--checkpoint-dir", "--train.seed",
            "--train.epochs", "--train.subset", "--data.source", "--output.metrics",
            "--output.checkpoint_dir")  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python bench/figures/new_data.py", description=__doc__)
    add = parser.add_argument
    add("--datasets", default=None, help="comma-separated, of digits,mnist (default: both)")
    add("--epochs", type=int, default=None, help="epochs of every job (12)")
    add(
        "--seeds",
        default=None,
        help="comma-separated train.seed values, a pair of jobs each (1,2,3; quick: 1)",
    )
    add("--target", type=float, default=1.0, help="largest gap, in points, that passes (1.0)")
    add("--mnist-subset", type=int, default=0, help="MNIST: first N training examples (0: all)")
    add("--data", metavar="DIR", help="MNIST idx files (default $HOGWILD_TEST_DATA or the shared)")
    add(
        "--cluster-args",
        default="",
        help="more arguments for every cluster job, one string written with '=' (e.g. "
        "--cluster-args='--ps.rule=sgd --train.n_push=32'): a variant of the defaults, beside the "
        "same single-node jobs; the data, seed, epochs and files stay the script's",
    )
    add("--quick", action="store_true", help="2 epochs on the digits only: a smoke test")
    add("--out", metavar="FILE", help="also write the JSON line to this file")
    args = parser.parse_args(argv)
    if args.datasets is None:
        args.datasets = "digits" if args.quick else ",".join(DATASETS)
    args.datasets = args.datasets.split(",")
    unknown = sorted(set(args.datasets) - set(DATASETS))
    if unknown:
        parser.error(f"--datasets: unknown {', '.join(unknown)}; known: {', '.join(DATASETS)}")
    if args.epochs is None:
        args.epochs = 2 if args.quick else 12
    try:
        args.seeds = [int(x) for x in (args.seeds or ("1" if args.quick else "1,2,3")).split(",")]
    except ValueError:
        parser.error(f"--seeds: comma-separated integers, got {args.seeds!r}")
    if args.epochs < 1 or args.mnist_subset < 0 or args.target < 0:
        parser.error("--epochs must be >= 1, --mnist-subset >= 0 and --target >= 0")
    args.cluster_args = shlex.split(args.cluster_args)
    if args.cluster_args and not args.cluster_args[0].startswith("--"):
        parser.error(f"--cluster-args {args.cluster_args}: expected hogwild cluster's flags")
    taken = [a for a in args.cluster_args if a.split("=", 1)[0] in RESERVED]
    if taken:  # a second --seed or --epochs would win: the pairs would no longer match
        parser.error(
            f"--cluster-args: {', '.join(taken)} is the script's to set (every job of a seed "
            f"pair trains the same data, seed and epochs); not one of {', '.join(RESERVED)}"
        )
    args.data = args.data or os.environ.get("HOGWILD_TEST_DATA") or str(SHARED_MNIST)
    if "mnist" in args.datasets and not Path(args.data).is_dir():
        parser.error(f"--data {args.data}: not a directory of MNIST idx files")
    return args


def _log(text: str) -> None:
    print(f"new_data: {text}", file=sys.stderr, flush=True)


def run_job(kind: str, data: str, seed: int, args, extra: list[str], folder: Path) -> dict:
    """One ``hogwild train`` or ``hogwild cluster`` job: its summary and epoch curve."""
    metrics = folder / f"{kind}-{seed}.jsonl"
    argv = [kind, "--data", data, "--no-progress", "--epochs", str(args.epochs), "--seed",
            str(seed), "--metrics", str(metrics), *extra]  # fmt: skip
    if kind == "cluster":
        argv += ["--checkpoint-dir", str(folder / f"run-{seed}")]
    command = [sys.executable, "-m", "hogwild.cli", *argv]
    _log(" ".join(command[1:]))
    began = time.perf_counter()
    job = Job(command, folder, f"{kind}-{seed}")
    try:
        job.wait(JOB_TIMEOUT_S)
        summary = job.summary()
    finally:
        job.stop()
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    curve = [r.get("test_accuracy") for r in records if r.get("event") == "epoch"]
    accuracy = summary.get("test_accuracy")
    _log(f"{kind}, seed {seed}: test accuracy {accuracy}")
    # as it could be rerun: the run's temporary folder, gone by then, written TMP
    written = shlex.join(["hogwild", *(a.replace(str(folder.parent), "TMP") for a in argv)])
    return {"test_accuracy": accuracy, "curve": curve, "train_loss": summary.get("train_loss"),
            "wall_s": round(time.perf_counter() - began, 1), "command": written}  # fmt: skip


def _row(name: str, described: dict, runs: list[dict], target: float) -> dict:
    """One dataset's figures: the seeds' runs, each kind's mean accuracy and sample standard
    deviation, and the gap in points with its spread over the seeds: the paired differences'
    standard deviation and a 95 % confidence interval of their mean (Student's t; one test
    image of the digits is 0.22 points, and an asynchronous job differs from run to run)."""

    def mean(kind: str) -> float | None:
        values = [r[kind]["test_accuracy"] for r in runs]
        return None if None in values else round(statistics.fmean(values), 4)

    def sd(values: list[float]) -> float | None:
        return round(statistics.stdev(values), 2) if len(values) > 1 else None

    single, cluster = mean("single"), mean("cluster")
    gap = None
    spread: dict = {"single_sd_points": None, "cluster_sd_points": None, "gap_sd_points": None,
                    "gap_ci95_points": None}  # fmt: skip
    if single is not None and cluster is not None:
        points = {k: [100.0 * r[k]["test_accuracy"] for r in runs] for k in ("single", "cluster")}
        gaps = [a - b for a, b in zip(points["single"], points["cluster"], strict=True)]
        exact = statistics.fmean(gaps)  # rounded once, here, from the runs' own accuracies
        gap = round(exact, 2)
        spread["single_sd_points"] = sd(points["single"])
        spread["cluster_sd_points"] = sd(points["cluster"])
        spread["gap_sd_points"] = sd(gaps)
        if len(gaps) > 1:
            t = float(stats.t.ppf(0.975, len(gaps) - 1))
            half = t * statistics.stdev(gaps) / len(gaps) ** 0.5
            spread["gap_ci95_points"] = [round(exact - half, 2), round(exact + half, 2)]
    return {"dataset": name, "data": described, "runs": runs, "single_mean": single,
            "cluster_mean": cluster, "gap_points": gap, **spread,
            "met": gap is not None and gap <= target}  # fmt: skip


def measure(args) -> dict:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-new-data-") as tmp:
        for name in args.datasets:
            folder = Path(tmp) / name
            folder.mkdir()
            extra: list[str] = []
            if name == "digits":
                data = str(folder / "data")
                described = write_digits(data, seed=DIGITS_SPLIT_SEED)
            else:
                data = args.data
                described = {"subset": args.mnist_subset}
                if args.mnist_subset:
                    extra.append(f"--train.subset={args.mnist_subset}")
            runs = []
            for seed in args.seeds:
                single = run_job("train", data, seed, args, extra, folder)
                cluster_extra = [*extra, *args.cluster_args]
                cluster = run_job("cluster", data, seed, args, cluster_extra, folder)
                runs.append({"seed": seed, "single": single, "cluster": cluster})
            rows.append(_row(name, described, runs, args.target))
            _log(f"{name}: mean single {rows[-1]['single_mean']}, cluster "
                 f"{rows[-1]['cluster_mean']}, gap {rows[-1]['gap_points']} points (95 % "
                 f"interval {rows[-1]['gap_ci95_points']})")  # fmt: skip
    return {
        "benchmark": "new_data",
        "question": "the 12-epoch hogwild cluster job against hogwild train, on data the "
        "defaults were not tuned on",
        "target_gap_points": args.target,
        "results": rows,
        "met": all(r["met"] for r in rows),
        "settings": {
            "epochs": args.epochs,
            "seeds": args.seeds,
            "digits_split_seed": DIGITS_SPLIT_SEED,
            "quick": args.quick,
            "mnist_subset": args.mnist_subset,
            "job": "the bundled defaults"
            + (", the cluster's jobs with cluster_args" if args.cluster_args else ""),
            "cluster_args": args.cluster_args,
        },  # fmt: skip
        "machine": describe_machine(),
        "versions": versions(),
    }


def main(argv: list[str] | None = None) -> int:
    from hogwild.signals import terminate_as_interrupt

    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    # SIGTERM: the running job is stopped on the way out
    record = measured(__file__, argv, lambda: measure(args), terminate_as_interrupt())
    if record is None:
        return 2
    emit_record(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
