"""Adam's Table 1 on this machine: asynchronous against synchronous training, several seeds.

Runs the job config once per seed and mode, interleaved (seed 1 in every mode, then seed 2, ...)
so that a slow spell of the machine falls on every mode: ``async`` is ``hogwild train`` with the
config's workers (Hogwild, lock-free), ``sync`` is ``hogwild train --sync`` (one worker), and
``cluster2`` and ``cluster4`` are ``hogwild cluster`` with 2 and 4 model replicas exchanging
through a parameter server (Adam's own asynchrony, Downpour with the cluster's defaults); every
mode has the same schedule and the same number of examples. Each run's per-epoch metrics go to
``--metrics-dir``; the final test accuracies are summarised per mode (mean, sample standard
deviation, range), and each asynchronous mode is compared with ``sync`` seed by seed: the mean
paired difference and a paired t-test (SciPy's ``ttest_rel``) with its one-sided p-value (is
asynchrony ahead?) and its two-sided one. All printed as one JSON line (and written to
``--out``), and drawn up as the markdown table of ``--markdown``.

    python bench/figures/adam_table1.py --data ../shared/datasets/mnist --seeds 1 2 3 4 5 \\
        --out bench/results/table1.json --markdown bench/results/table1.md \\
        --metrics-dir bench/results/table1

Extra ``--section.key=value`` arguments go to every run, after the config.

With ``--log FILE`` the table is resumable, as the recipe search is: every run is one JSON line
appended to the log as soon as it ends (with the commit it trained, the files it changed and the
data it read), and a run the log already holds (the same mode, seed, config and extra arguments)
is taken from it instead of trained again. Five seeds of a mode are 30 (async) to 55 (sync)
minutes on two cores; a rerun with more seeds trains only what is missing, and the page names
each run's commit.

    python bench/figures/adam_table1.py --data ../shared/datasets/mnist --modes async sync \\
        --seeds 1 2 3 4 5 --log bench/results/table1_runs.jsonl --out bench/results/table1.json \\
        --markdown bench/results/table1.md --metrics-dir bench/results/table1 \\
        --notes bench/results/table1_notes.md
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from scipy import stats

from bench.support.machine import describe_machine, versions
from bench.support.record import command_line, emit_record, source
from bench.support.table1_run import Job, read_run_log, run_job

# mode: (hogwild command, its arguments after the config)
MODES = {
    "async": ("train", ()),
    "sync": ("train", ("--sync",)),
    "cluster2": ("cluster", ("--cluster.replicas=2",)),
    "cluster4": ("cluster", ("--cluster.replicas=4",)),
}
CONTROL = "sync"  # what each asynchronous mode is compared with, seed by seed
ADAM = {"async": 0.9963, "sync": 0.9939}  # Table 1 of the paper
GOODFELLOW = 0.9955  # maxout networks, the record Adam's Table 1 stands beside


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="", help="job config (default: the bundled one)")
    parser.add_argument("--data", required=True, help="MNIST idx directory or LMDB cache")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--metrics-dir", required=True, help="per-run JSON-lines metrics")
    parser.add_argument("--out", default="", help="write the JSON line here too")
    parser.add_argument("--markdown", default="", help="write the table here")
    parser.add_argument("--notes", default="", help="markdown appended to the table's page")
    parser.add_argument(
        "--log", default="", help="JSON-lines log of runs: resume from it, append to it"
    )
    args, overrides = parser.parse_known_args(argv)
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds {args.seeds}: each seed once (the comparison pairs by seed)")
    return args, overrides


def train_once(args, mode: str, seed: int, overrides: list[str]) -> dict:
    """One run of ``mode``: its final and per-epoch test accuracies, wall time, command."""
    command, mode_args = MODES[mode]
    job = Job(command, seed, mode_args, config=args.config, extra=tuple(overrides))
    metrics = Path(args.metrics_dir) / metrics_name(mode, seed, args, overrides)
    run = run_job(job, args.data, metrics)
    return {"mode": mode, "seed": seed} | run


def metrics_name(mode: str, seed: int, args, overrides: list[str]) -> str:
    """A run's metrics file: ``MODE_seedS.jsonl`` for the bundled job as it is, with a digest
    of the config and the extra arguments otherwise, so that a run of other settings never
    writes over the file a logged run points to."""
    if not args.config and not overrides:
        return f"{mode}_seed{seed}.jsonl"
    settings = json.dumps([args.config, overrides]).encode()
    return f"{mode}_seed{seed}_{hashlib.sha256(settings).hexdigest()[:8]}.jsonl"


def run_key(run: dict) -> tuple:
    """What makes two runs the same run (the log's resume key)."""
    return (run["mode"], run["seed"], run["config"], tuple(run["overrides"]))


def read_log(path: Path) -> dict[tuple, dict]:
    """The log's finished runs by :func:`run_key` (a later line of the same run wins; a line
    that is not a run is an error: :func:`~bench.support.table1_run.read_run_log`)."""

    def check(run: dict) -> None:
        run_key(run), float(run["test_accuracy"])

    return {run_key(run): run for run in read_run_log(path, check, "Table 1 run")}


def paired(runs: list[dict], mode: str, control: str = CONTROL) -> dict | None:
    """``mode`` against ``control`` over the seeds both ran: the mean difference of the final
    test accuracies (positive: ``mode`` ahead), its sample standard deviation, and the paired
    t-test's statistic with its one-sided p-value (``mode`` ahead) and two-sided one. None
    without two shared seeds; the p-values are None when every difference is the same."""
    by_seed = {
        m: {r["seed"]: r["test_accuracy"] for r in runs if r["mode"] == m} for m in (mode, control)
    }
    seeds = sorted(set(by_seed[mode]) & set(by_seed[control]))
    if len(seeds) < 2:
        return None
    ahead = [by_seed[mode][s] for s in seeds]
    behind = [by_seed[control][s] for s in seeds]
    differences = [a - b for a, b in zip(ahead, behind, strict=True)]
    spread = statistics.stdev(differences)
    result = {
        "against": control,
        "seeds": seeds,
        "mean_difference": statistics.fmean(differences),
        "stdev_difference": spread,
        "ahead_in": sum(d > 0 for d in differences),
        "t": None,
        "p_ahead": None,
        "p_two_sided": None,
    }
    if spread > 0:  # equal differences: no spread to test against (SciPy would give nan)
        ahead_test = stats.ttest_rel(ahead, behind, alternative="greater")
        result["t"] = float(ahead_test.statistic)
        result["p_ahead"] = float(ahead_test.pvalue)
        result["p_two_sided"] = float(stats.ttest_rel(ahead, behind).pvalue)
    return result


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


def _logged_commits(record: dict) -> str:
    """The commits the runs trained at, where one came from the log at another commit."""
    now = record["source"]["commit"] or "?"
    others = sorted({r.get("commit") or "?" for r in record["results"]} - {now})
    if not others:
        return ""
    shown = ", ".join(c[:7] for c in others)
    return f"; runs taken from the log trained at {shown} (each row says which)"


def markdown(record: dict, notes: str) -> str:
    machine, ver = record["machine"], record["versions"]
    lines = [
        "# Adam's Table 1 on this machine: asynchronous against synchronous training",
        "",
        f"Made by `{record['command']}` on {machine.get('cpu_model')} "
        f"({machine.get('usable_cores')} usable cores, {machine.get('memory_gib')} GiB); Python "
        f"{ver.get('python')}, numba {ver.get('numba')}; commit {record['source']['commit']}"
        f"{_logged_commits(record)}.",
        "",
        "| mode | seeds | mean test accuracy | spread (sd) | range | median wall time |",
        "|---|---|---|---|---|---|",
    ]
    for mode, s in record["summary"].items():
        lines.append(
            f"| {mode} | {s['runs']} | **{100 * s['mean']:.2f} %** | ±{100 * s['stdev']:.2f} | "
            f"{100 * s['min']:.2f}–{100 * s['max']:.2f} % | {s['wall_s_median']:.0f} s |"
        )
    lines += [
        f"| Adam (OSDI 2014) | | {100 * ADAM['async']:.2f} % async, "
        f"{100 * ADAM['sync']:.2f} % sync | | | |",
        f"| Goodfellow et al. (maxout) | | {100 * GOODFELLOW:.2f} % | | | |",
        "",
    ]
    if record["paired"]:
        lines += [
            f"Each asynchronous mode against `{CONTROL}`, seed by seed (paired t-test; one-sided "
            "p: is it ahead?):",
            "",
            "| mode | seeds | mean difference | sd of differences | ahead in | t | p (ahead) "
            "| p (two-sided) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for mode, c in record["paired"].items():
            if c is None:
                lines.append(f"| {mode} | fewer than 2 shared seeds | | | | | | |")
                continue
            t, p1, p2 = (
                "–" if c[k] is None else f"{c[k]:.3g}" for k in ("t", "p_ahead", "p_two_sided")
            )
            lines.append(
                f"| {mode} | {len(c['seeds'])} | {100 * c['mean_difference']:+.2f} points | "
                f"{100 * c['stdev_difference']:.2f} | {c['ahead_in']} of {len(c['seeds'])} | "
                f"{t} | {p1} | {p2} |"
            )
        lines.append("")
    lines += ["Every run (final epoch's test accuracy; best epoch beside it):", ""]
    lines += [
        "| mode | seed | test accuracy | best epoch | epochs | wall time | examples/s | commit |"
    ]
    lines += ["|---|---|---|---|---|---|---|---|"]
    for r in record["results"]:
        lines.append(
            f"| {r['mode']} | {r['seed']} | {100 * r['test_accuracy']:.2f} % | "
            f"{100 * (r['best_test_accuracy'] or 0):.2f} % | {r['epochs']} | {r['wall_s']:.0f} s | "
            f"{r['examples_per_s'] or 0:,.0f} | {(r.get('commit') or '')[:7]} |"
        )
    if notes:
        lines += ["", notes.rstrip()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args, overrides = parse_args(argv)
    measured_on = source()  # before the runs: the tree they train with
    log = Path(args.log) if args.log else None
    logged = read_log(log) if log else {}  # before any run: a torn log fails first
    if log:  # ... and so does a log that cannot be written, not after the first run
        log.parent.mkdir(parents=True, exist_ok=True)
        log.touch()
    results = []
    for seed in args.seeds:
        for mode in args.modes:
            wanted = {"mode": mode, "seed": seed, "config": args.config, "overrides": overrides}
            run = logged.get(run_key(wanted))
            if run is None:
                run = train_once(args, mode, seed, overrides)
                if run["test_accuracy"] is None:  # a table of test accuracies: say so, log none
                    raise SystemExit(f"{mode} seed {seed}: no test accuracy ({run['command']})")
                run |= {"config": args.config, "overrides": overrides, "data": args.data}
                run |= {"commit": measured_on["commit"], "modified": measured_on["modified"]}
                run |= {"finished": time.time()}
                if log:
                    with log.open("a", encoding="utf-8") as f:
                        f.write(json.dumps(run) + "\n")
                said = f"{100 * run['test_accuracy']:.2f} % in {run['wall_s']:.0f} s"
            else:
                said = f"{100 * run['test_accuracy']:.2f} %, in the log ({run.get('commit')})"
            print(f"{mode} seed {seed}: {said}", file=sys.stderr, flush=True)
            results.append(run)
    summary = {m: summarise([r for r in results if r["mode"] == m]) for m in args.modes}
    compared = [m for m in args.modes if m != CONTROL] if CONTROL in args.modes else []
    record = {
        "benchmark": "table1",
        "results": results,
        "summary": summary,
        "paired": {m: paired(results, m) for m in compared},
        "overrides": overrides,
        "machine": describe_machine(),
        "versions": versions(),
        "source": measured_on,
        "command": command_line(__file__, argv if argv is not None else sys.argv[1:]),
    }
    emit_record(record, args.out)
    if args.markdown:
        notes = Path(args.notes).read_text(encoding="utf-8") if args.notes else ""
        Path(args.markdown).write_text(markdown(record, notes), encoding="utf-8")


if __name__ == "__main__":
    main()
