"""What starting a job's workers costs: forked from the preloaded forkserver, against spawn.

``train.start_method = "forkserver"`` forks every worker from one server that imported numba and
the worker's modules once (:mod:`hogwild.training.zygote`); ``"spawn"``, the control, starts each
worker as a fresh interpreter. Two scenarios, each a tiny job (``--subset`` examples, one epoch)
so that the start is most of what is measured:

- ``cli``: one ``hogwild train`` process per job (the server is started, and ended, by each);
- ``in_process``: ``--jobs`` calls of :func:`hogwild.train` in one Python process (a notebook, a
  test worker: later jobs reuse the server).

The measure is CPU seconds (user + system) of the job's whole process tree, from the rusage of
the children this script waited for: the trainer waits for its forkserver at its exit, and the
server for its workers, so every process is counted, whoever started it. Trials alternate the
two methods, ``--repeats`` each. ``python bench/figures/worker_start.py --workers 2 --repeats 5
--out bench/results/worker_start.json`` prints one JSON line: the medians per scenario and
method, their ratio, every trial, the machine and the versions.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.support.record import measured_and_emitted

METHODS = ("forkserver", "spawn")
CHILD_TIMEOUT_S = 1800.0

IN_PROCESS = """
import sys
import hogwild
if __name__ == "__main__":
    data, workers, subset, jobs, method = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \\
        int(sys.argv[4]), sys.argv[5]
    for _ in range(jobs):
        hogwild.train(data=data, workers=workers, epochs=1, subset=subset, progress=False,
                      overrides={"train.start_method": method})
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bench/figures/worker_start.py", description=__doc__
    )
    add = parser.add_argument
    add("--data", default=os.environ.get("HOGWILD_DATA", "mnist"), help="MNIST's directory")
    add("--workers", type=int, default=2, help="workers per job (default 2)")
    add("--subset", type=int, default=200, help="training examples per job (default 200)")
    add("--jobs", type=int, default=4, help="jobs in the in_process scenario (default 4)")
    add("--repeats", type=int, default=3, help="trials of each method (default 3)")
    add("--quick", action="store_true", help="one trial, two jobs in process: a smoke run")
    add("--out", metavar="FILE", help="also write the JSON line to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.jobs = 1, 2
    if min(args.workers, args.subset, args.jobs, args.repeats) < 1:
        parser.error("--workers, --subset, --jobs and --repeats must be at least 1")
    return args


def cpu_of(command: list[str]) -> float:
    """CPU seconds (user + system) of ``command``'s whole process tree."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{command[:4]} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def commands(args, method: str) -> dict[str, list[str]]:
    cli = [sys.executable, "-m", "hogwild.cli", "train", "--data", args.data, "--no-progress"]
    cli += ["--workers", str(args.workers), "--epochs", "1", "--subset", str(args.subset)]
    cli += [f"--train.start_method={method}"]
    in_process = [sys.executable, "-c", IN_PROCESS, args.data, str(args.workers)]
    in_process += [str(args.subset), str(args.jobs), method]
    return {"cli": cli, "in_process": in_process}


def measure(args) -> dict:
    scenarios = ("cli", "in_process")
    trials = {s: {m: [] for m in METHODS} for s in scenarios}
    cpu_of(commands(args, "spawn")["cli"])  # numba's cache filled before the first trial
    for _ in range(args.repeats):
        for method in METHODS:
            for scenario, command in commands(args, method).items():
                cpu = cpu_of(command)
                per_job = cpu / (args.jobs if scenario == "in_process" else 1)
                trials[scenario][method].append(round(per_job, 3))
                print(f"worker_start: {scenario} {method}: {per_job:.2f} CPU-s a job",
                      file=sys.stderr, flush=True)  # fmt: skip
    medians = {s: {m: statistics.median(trials[s][m]) for m in METHODS} for s in scenarios}
    return {
        "benchmark": "worker_start",
        "workers": args.workers,
        "subset": args.subset,
        "jobs_in_process": args.jobs,
        "cpu_s_per_job": medians,
        "spawn_over_forkserver": {
            s: round(medians[s]["spawn"] / medians[s]["forkserver"], 2) for s in scenarios
        },
        "trials": trials,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    return measured_and_emitted(__file__, argv, lambda: measure(args), args.out)


if __name__ == "__main__":
    sys.exit(main())
