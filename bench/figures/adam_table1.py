"""Adam's Table 1 on this machine: asynchronous against synchronous training, several seeds.

Runs ``hogwild train`` on the job config once per seed and mode, interleaved (async seed 1, sync
seed 1, async seed 2, ...) so that a slow spell of the machine falls on both modes: asynchronous
with the config's workers (Hogwild, lock-free), synchronous with ``--sync`` (one worker), the same
schedule and the same number of examples. Each run's per-epoch metrics go to
``--metrics-dir``; the final test accuracies are summarised per mode (mean, sample standard
deviation, range), printed as one JSON line (and written to ``--out``), and drawn up as the
markdown table of ``--markdown``.

    python bench/figures/adam_table1.py --data ../shared/datasets/mnist --seeds 1 2 3 \\
        --out bench/results/table1.json --markdown bench/results/table1.md \\
        --metrics-dir bench/results/table1

Extra ``--section.key=value`` arguments go to every run, after the config.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.support.machine import describe_machine, versions
from bench.support.record import command_line, emit_record, source

MODES = {"async": [], "sync": ["--sync"]}
RUN_TIMEOUT_S = 3600.0


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="", help="job config (default: the bundled one)")
    parser.add_argument("--data", required=True, help="MNIST idx directory or LMDB cache")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--modes", nargs="+", choices=sorted(MODES), default=["async", "sync"])
    parser.add_argument("--metrics-dir", required=True, help="per-run JSON-lines metrics")
    parser.add_argument("--out", default="", help="write the JSON line here too")
    parser.add_argument("--markdown", default="", help="write the table here")
    parser.add_argument("--notes", default="", help="markdown appended to the table's page")
    return parser.parse_known_args(argv)


def train_once(args, mode: str, seed: int, overrides: list[str]) -> dict:
    """One ``hogwild train`` run; its final summary and per-epoch test accuracies."""
    metrics = Path(args.metrics_dir) / f"{mode}_seed{seed}.jsonl"
    metrics.parent.mkdir(parents=True, exist_ok=True)
    metrics.unlink(missing_ok=True)  # the trainer appends: a rerun must not mix in the last one
    command = [sys.executable, "-m", "hogwild.cli", "train", "--data", args.data]
    command += ["--metrics", str(metrics)]
    if args.config:
        command += ["--config", args.config]
    command += [f"--train.seed={seed}", "--output.progress=false", *overrides, *MODES[mode]]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    wall_s = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} exited with {done.returncode}:\n{done.stderr[-4000:]}"
        )
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    epochs = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines()]
    accuracies = [r["test_accuracy"] for r in epochs if r.get("event") == "epoch"]
    return {
        "mode": mode,
        "seed": seed,
        "test_accuracy": summary["test_accuracy"],
        "best_test_accuracy": max(accuracies) if accuracies else None,
        "epochs": len(accuracies),
        "wall_s": round(wall_s, 1),
        "examples_per_s": summary.get("examples_per_s"),
        "per_epoch": accuracies,
        "metrics": str(metrics),
        "command": shlex.join(["hogwild", *command[3:]]),
    }


def summarise(runs: list[dict]) -> dict:
    """Mean, sample standard deviation and range of the final test accuracies."""
    values = [r["test_accuracy"] for r in runs]
    return {
        "runs": len(values),
        "mean": statistics.fmean(values),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
        "wall_s_median": statistics.median(r["wall_s"] for r in runs),
    }


def markdown(record: dict, notes: str) -> str:
    machine, ver = record["machine"], record["versions"]
    lines = [
        "# Adam's Table 1 on this machine: asynchronous against synchronous training",
        "",
        f"Made by `{record['command']}` on {machine.get('cpu_model')} "
        f"({machine.get('usable_cores')} usable cores, {machine.get('memory_gib')} GiB); Python "
        f"{ver.get('python')}, numba {ver.get('numba')}; commit {record['source']['commit']}.",
        "",
        "| mode | seeds | mean test accuracy | spread (sd) | range | median wall time |",
        "|---|---|---|---|---|---|",
    ]
    for mode, s in record["summary"].items():
        lines.append(
            f"| {mode} | {s['runs']} | **{100 * s['mean']:.2f} %** | ±{100 * s['stdev']:.2f} | "
            f"{100 * s['min']:.2f}–{100 * s['max']:.2f} % | {s['wall_s_median']:.0f} s |"
        )
    lines += ["| Adam (OSDI 2014) | | 99.63 % async, 99.39 % sync | | | |", ""]
    lines += ["Every run (final epoch's test accuracy; best epoch beside it):", ""]
    lines += ["| mode | seed | test accuracy | best epoch | epochs | wall time | examples/s |"]
    lines += ["|---|---|---|---|---|---|---|"]
    for r in record["results"]:
        lines.append(
            f"| {r['mode']} | {r['seed']} | {100 * r['test_accuracy']:.2f} % | "
            f"{100 * (r['best_test_accuracy'] or 0):.2f} % | {r['epochs']} | {r['wall_s']:.0f} s | "
            f"{r['examples_per_s'] or 0:,.0f} |"
        )
    if notes:
        lines += ["", notes.rstrip()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args, overrides = parse_args(argv)
    measured_on = source()  # before the runs: the tree they train with
    results = []
    for seed in args.seeds:
        for mode in args.modes:
            run = train_once(args, mode, seed, overrides)
            print(
                f"{mode} seed {seed}: {100 * run['test_accuracy']:.2f} % in {run['wall_s']:.0f} s",
                file=sys.stderr,
                flush=True,
            )
            results.append(run)
    summary = {m: summarise([r for r in results if r["mode"] == m]) for m in args.modes}
    record = {
        "benchmark": "table1",
        "results": results,
        "summary": summary,
        "overrides": overrides,
        "machine": describe_machine(),
        "versions": versions(),
        "source": measured_on,
        "command": command_line(__file__, argv or sys.argv[1:]),
    }
    emit_record(record, args.out)
    if args.markdown:
        notes = Path(args.notes).read_text(encoding="utf-8") if args.notes else ""
        Path(args.markdown).write_text(markdown(record, notes), encoding="utf-8")


if __name__ == "__main__":
    main()
