"""DistBelief's Fig. 4 on MNIST: test accuracy against wall time, one line per training framework.

DistBelief (Dean et al., NIPS 2012, section 5, Fig. 4) trains one model with single-replica SGD,
Downpour SGD with a fixed learning rate, Downpour with Adagrad and Sandblaster L-BFGS, and plots
accuracy against time on the same machines; SINGA (Wang et al., 2015, section 5.2) adds AllReduce,
distributed Hogwild and the hybrid. Here every contender is a real ``hogwild cluster`` job on this
machine's cores, the same data (all 60,000 MNIST training images unless ``--subset``; the 10,000
test images), the same model (Adam's MNIST CNN without dropout, :mod:`bench.support.paper_job`), the
same seed (``train.seed`` = 1) and the same wall-clock budget:

==================  ===========================================================================
sgd                 ``--cluster.framework=downpour --cluster.worker_groups=1`` (one replica), sgd
downpour-sgd        downpour, 2 replicas (worker groups of one Hogwild worker), sgd on the server
downpour-adagrad    downpour, 2 replicas, Adagrad on the server (``ps.lr`` = 0.01, the default)
sandblaster-lbfgs   sandblaster: one group of 2 member processes, the L-BFGS coordinator, after
                    a warm start of synchronous SGD steps (``--lbfgs-warm-start``)
sandblaster-cold    the same L-BFGS from the initial parameters (no warm start): the control
allreduce-sgd       allreduce: one group of 2 synchronous workers, a server per worker
hybrid-sgd          hybrid: 2 asynchronous groups of 2 synchronous workers, one server group
hogwild-sgd         distributed Hogwild: 2 replicas, each on its own server group, synchronised
                    every ``cluster.sync_every`` examples (10,000, the default)
hybrid-sgd-2sg      the hybrid on 2 server groups, a group each, synchronised every
                    ``cluster.sync_every`` examples (10,000, the default)
==================  ===========================================================================

Every job trains Adam's model without dropout on the schedule of :mod:`bench.support.paper_job` (the
default before Table 1's); every SGD contender keeps its learning rate and step schedule (halved
every 3 epochs); "fixed rate" is DistBelief's name for plain SGD on the server, as against Adagrad.
**Sandblaster** runs mini-batch L-BFGS (Ngiam et al., ICML 2011; DistBelief's "large
batches"): each epoch's shuffled training set in batches of ``--lbfgs-batch`` examples
(``cluster.lbfgs_batch``, 5,000), ``--lbfgs-per-batch`` iterations on each
(``cluster.lbfgs_iterations``, 3), the L-BFGS history carried from batch to batch; each iteration's
line search may take more than one pass over its batch (docs/benchmarks.md compares batch
sizes). ``--lbfgs-batch 0`` is the full batch (an epoch is one iteration over the whole training
set). Its epochs are capped by ``--lbfgs-iterations``, not ``--epochs``. Its **warm start**
(``cluster.lbfgs_warm_start``, ``--lbfgs-warm-start`` examples, 60,000: the first epoch) trains
the job's first examples with synchronous SGD steps as AllReduce takes them (``--sync-batch`` at
``--sync-lr``) through the same servers, then L-BFGS begins from those parameters
(Friedlander & Schmidt, 2012: stochastic steps far from the minimum, batch steps near it);
``sandblaster-cold`` is the same L-BFGS without it, measured in the same run. To run the two
alone: ``--only sandblaster-lbfgs,sandblaster-cold``. ``--lbfgs-batch-growth G``
(``cluster.lbfgs_batch_growth``, 1.0: off) grows both contenders' batches by G every epoch.
**AllReduce and the hybrid** step once per batch of ``train.batch`` examples on the batch's
mean gradient, so they need a batch and a rate of their own: ``--sync-batch`` 100 at
``--sync-lr`` 0.05 (on this machine, 2 epochs of AllReduce: lr 0.3 diverged, 0.1 reached
97.8 % and 97.4 %, 0.05 98.0 % and 98.2 %; batch 200 at 0.1 ran 20 % more examples/s to much the
same accuracy per second). A contender that ``hogwild cluster`` refuses ("does not run it yet")
is recorded as skipped with the refusal's message, so that it joins the figure once built.

Each job runs as ``python -m hogwild.cli cluster ... --metrics FILE``
(:class:`bench.support.cluster_run.ClusterRun`, which also counts what it left behind); at every
epoch end the driver pulls the model and writes an ``epoch`` record carrying ``wall_s`` (seconds
since training began, taken when the model was pulled) and that model's ``test_accuracy``: the
curve. A job still running ``--budget-s`` seconds after its start record appeared (role start-up is
not charged) is sent SIGTERM (its process group; the driver stops its roles) and keeps the curve
written so far. ``time_to_target_s`` is the first ``wall_s`` at which the test accuracy reached
``--target`` (98.5 %), null if it did not within the budget.

Run: ``python bench/figures/distbelief_fig4_frameworks.py --out bench/results/frameworks.json
--plot bench/results/fig4.png`` (``--quick``: 500 examples, 1 epoch of SGD or 2 of L-BFGS on
batches of 250, a few seconds each: a smoke test). It prints one JSON line; progress goes to
stderr. Run it alone on the machine: the contenders run one after another and each is timed
against the wall clock.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.support.cluster_run import ClusterRun
from bench.support.job import STOP_S
from bench.support.machine import describe_machine, versions
from bench.support.paper_job import PAPER_JOB
from bench.support.paths import SHARED_MNIST
from bench.support.record import emit_record, measured

REFUSED = "does not run it yet"  # hogwild cluster's words for a topology not built
POLL_S = 0.5
SETTINGS_KEPT = ("cluster", "train", "optim", "ps")


@dataclass(frozen=True)
class Contender:
    """One line of the figure: a framework, its optimizer and its ``[cluster]`` keys."""

    name: str
    label: str
    framework: str
    optimizer: str
    keys: tuple[tuple[str, str], ...]
    synchronous: bool = False  # steps on a batch's mean gradient: --sync-batch, --sync-lr
    warm_start: bool = False  # L-BFGS after --lbfgs-warm-start examples of synchronous SGD

    def overrides(self, args) -> list[str]:
        keys = [("cluster.framework", self.framework), ("cluster.optimizer", self.optimizer)]
        keys += list(self.keys)
        warm = self.warm_start and args.lbfgs_warm_start > 0
        if self.synchronous or warm:  # the warm start's steps are AllReduce's
            keys += [("train.batch", str(args.sync_batch)), ("optim.lr", str(args.sync_lr))]
        if self.optimizer == "lbfgs":
            keys += [("cluster.lbfgs_batch", str(args.lbfgs_batch)),
                     ("cluster.lbfgs_iterations", str(args.lbfgs_per_batch))]  # fmt: skip
        if warm:
            keys.append(("cluster.lbfgs_warm_start", str(args.lbfgs_warm_start)))
        if self.optimizer == "lbfgs" and args.lbfgs_batch_growth != 1.0:
            keys.append(("cluster.lbfgs_batch_growth", str(args.lbfgs_batch_growth)))
        if args.subset:
            keys.append(("train.subset", str(args.subset)))
        return [f"--{key}={value}" for key, value in keys]


CONTENDERS = (
    Contender("sgd", "SGD, 1 replica", "downpour", "sgd", (("cluster.worker_groups", "1"),)),
    Contender("downpour-sgd", "Downpour SGD, 2 replicas", "downpour", "sgd",
              (("cluster.worker_groups", "2"),)),
    Contender("downpour-adagrad", "Downpour Adagrad, 2 replicas", "downpour", "adagrad",
              (("cluster.worker_groups", "2"),)),
    Contender("sandblaster-lbfgs", "Sandblaster L-BFGS after an SGD warm start, 2 workers",
              "sandblaster", "lbfgs", (("cluster.workers_per_group", "2"),), warm_start=True),
    Contender("sandblaster-cold", "Sandblaster L-BFGS, no warm start, 2 workers", "sandblaster",
              "lbfgs", (("cluster.workers_per_group", "2"),)),
    Contender("allreduce-sgd", "AllReduce SGD, 2 workers, 2 servers", "allreduce", "sgd",
              (("cluster.workers_per_group", "2"),), synchronous=True),
    Contender("hybrid-sgd", "hybrid SGD, 2 groups x 2 workers", "hybrid", "sgd",
              (("cluster.worker_groups", "2"), ("cluster.workers_per_group", "2")),
              synchronous=True),
    Contender("hogwild-sgd", "distributed Hogwild, 2 replicas, 2 server groups", "hogwild",
              "sgd", (("cluster.worker_groups", "2"), ("cluster.server_groups", "2"))),
    Contender("hybrid-sgd-2sg", "hybrid SGD, 2 groups x 2 workers, 2 server groups", "hybrid",
              "sgd", (("cluster.worker_groups", "2"), ("cluster.workers_per_group", "2"),
                      ("cluster.server_groups", "2")), synchronous=True),
)  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bench/figures/distbelief_fig4_frameworks.py", description=__doc__
    )
    add = parser.add_argument
    add("--budget-s", type=float, default=None, help="training seconds per run (240)")
    add("--epochs", type=int, default=None, help="epochs at most of the SGD runs (12)")
    add("--lbfgs-iterations", type=int, default=None, help="Sandblaster's epochs at most (100)")
    add(
        "--lbfgs-batch",
        type=int,
        default=None,
        help="Sandblaster: cluster.lbfgs_batch, examples per L-BFGS batch (5000; 0: full batch)",
    )
    add(
        "--lbfgs-per-batch",
        type=int,
        default=None,
        help="Sandblaster: cluster.lbfgs_iterations, L-BFGS iterations per batch (3)",
    )
    add(
        "--lbfgs-warm-start",
        type=int,
        default=None,
        help="Sandblaster: cluster.lbfgs_warm_start, the job's first examples trained by "
        "synchronous SGD (--sync-batch at --sync-lr) before L-BFGS (60000; 0: none)",
    )
    add(
        "--lbfgs-batch-growth",
        type=float,
        default=1.0,
        help="Sandblaster: cluster.lbfgs_batch_growth, the batch's factor from epoch to epoch "
        "(1.0: fixed)",
    )
    add("--subset", type=int, default=None, help="train on the first N examples (0: all)")
    add(
        "--sync-batch",
        type=int,
        default=None,
        help="AllReduce, hybrid and Sandblaster's warm start: train.batch (100; --quick 50)",
    )
    add(
        "--sync-lr",
        type=float,
        default=0.05,
        help="AllReduce, hybrid and Sandblaster's warm start: optim.lr (0.05)",
    )
    add("--target", type=float, default=0.985, help="test accuracy to reach (0.985)")
    add("--only", metavar="NAMES", help="comma-separated contenders (default: all)")
    add("--quick", action="store_true", help="a tiny run: a smoke test, not a measurement")
    add("--data", metavar="DIR", help="MNIST idx files (default $HOGWILD_TEST_DATA or the shared)")
    add("--out", metavar="FILE", help="also write the JSON line to this file")
    add("--plot", metavar="PNG", help="draw the figure into this file")
    args = parser.parse_args(argv)
    quick = {
        "budget_s": 15.0,
        "epochs": 1,  # the SGD runs' (one point of a curve); Sandblaster's: lbfgs_iterations
        "lbfgs_iterations": 2,
        "subset": 500,
        "lbfgs_batch": 250,
        "lbfgs_per_batch": 2,
        "lbfgs_warm_start": 250,
        "sync_batch": 50,  # the warm start's 250 examples: 5 steps, as the full run's has many
    }
    full = {
        "budget_s": 240.0,
        "epochs": 12,
        "lbfgs_iterations": 100,
        "subset": 0,
        "lbfgs_batch": 5000,
        "lbfgs_per_batch": 3,
        "lbfgs_warm_start": 60000,
        "sync_batch": 100,
    }
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    names = [c.name for c in CONTENDERS]
    args.only = args.only.split(",") if args.only else names
    unknown = sorted(set(args.only) - set(names))
    if unknown:
        parser.error(f"--only: unknown contender(s) {', '.join(unknown)}; known: {names}")
    if args.budget_s <= 0 or args.epochs < 1 or args.lbfgs_iterations < 1 or args.subset < 0:
        parser.error("--budget-s must be > 0, --epochs and --lbfgs-iterations >= 1, --subset >= 0")
    if args.lbfgs_batch_growth < 1.0 or (args.lbfgs_batch_growth != 1.0 and not args.lbfgs_batch):
        parser.error("--lbfgs-batch-growth must be >= 1 and needs --lbfgs-batch > 0")
    if args.lbfgs_batch < 0 or args.lbfgs_per_batch < 1 or args.lbfgs_warm_start < 0:
        parser.error(
            "--lbfgs-batch must be >= 0 (0: the full batch), --lbfgs-per-batch >= 1, "
            "--lbfgs-warm-start >= 0 (0: none)"
        )
    if not 0 < args.target <= 1:
        parser.error(f"--target is a test accuracy in (0, 1], got {args.target}")
    args.data = args.data or os.environ.get("HOGWILD_TEST_DATA") or str(SHARED_MNIST)
    if not Path(args.data).is_dir():
        parser.error(f"--data {args.data}: not a directory of MNIST idx files")
    return args


def _log(text: str) -> None:
    print(f"frameworks: {text}", file=sys.stderr, flush=True)


def job_args(args, contender: Contender) -> list[str]:
    """``hogwild``'s arguments for ``contender`` (the run directory and metrics added per run)."""
    epochs = args.lbfgs_iterations if contender.optimizer == "lbfgs" else args.epochs
    out = ["cluster", "--data", args.data, "--no-progress", "--epochs", str(epochs)]
    return [*out, *PAPER_JOB, *contender.overrides(args)]  # the contender's settings win


# -- one run ------------------------------------------------------------------------------------


def run_contender(args, contender: Contender, folder: Path) -> dict:
    """``contender``'s job within the budget: its curve and figures (or why it did not run)."""
    command = job_args(args, contender)
    row = {
        "name": contender.name,
        "label": contender.label,
        "framework": contender.framework,
        "optimizer": contender.optimizer,
        "command": shlex.join(["python", "-m", "hogwild.cli", *command]),
        "skipped": False,
        "refusal": None,
    }
    _log(f"{contender.name}: {row['command']}")
    run = ClusterRun(command, folder, contender.name)
    stopped, start_seen = False, None
    try:
        try:
            run.wait_started()
        except RuntimeError as exc:  # it ended (or hung) before training: refused, or failed
            _, _, leaked = run.finish(STOP_S)
            refusal = _refusal(run.job.err_tail())
            _log(f"{contender.name}: " + (f"skipped: {refusal}" if refusal else f"FAILED: {exc}"))
            return {**row, "skipped": refusal is not None, "refusal": refusal,
                    "error": None if refusal else str(exc), "leaked": leaked,
                    **_figures(args, [], run, time.monotonic())}  # fmt: skip
        start_seen = time.monotonic()
        startup_s = time.time() - run.started
        deadline = start_seen + args.budget_s
        while run.running() and time.monotonic() < deadline:
            time.sleep(POLL_S)
            run.records()  # notes when each epoch record is first seen
        if run.running():
            stopped = True
            _stop_group(run)
        trained_s = time.monotonic() - start_seen
        summary, error, leaked = run.finish(STOP_S)
    finally:
        run.job.stop()
    records = run.records()
    start = next((r for r in records if r.get("event") == "start"), {})
    epochs = [r for r in records if r.get("event") == "epoch"]
    if error and not stopped:
        _log(f"{contender.name}: FAILED: {error}")
    return {**row, **_figures(args, epochs, run, start_seen), **{
        "replicas": start.get("replicas"),
        "workers_per_group": start.get("workers_per_replica"),
        "ps_servers": len(start.get("ps_servers", [])),
        "stopped_at_budget": stopped,
        "startup_s": round(startup_s, 1),
        "trained_s": round(trained_s, 1),
        "error": None if stopped else error,
        "summary_wall_s": (summary or {}).get("wall_s"),
        "leaked": leaked,
        "settings": {k: start["config"][k] for k in SETTINGS_KEPT} if start else None,
    }}  # fmt: skip


def _refusal(stderr: str) -> str | None:
    """The line of ``hogwild cluster``'s stderr that refuses a topology not built, if any."""
    for line in stderr.splitlines():
        if REFUSED in line:
            return line.strip()
    return None


def _stop_group(run: ClusterRun) -> None:
    """SIGTERM to the job's process group (the driver stops its roles), then a bounded wait,
    then SIGKILL to the group."""
    proc = run.job.proc
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(STOP_S)
    except ProcessLookupError:
        return
    except Exception:  # noqa: BLE001 - TimeoutExpired: it lingers
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        proc.wait(5)


def _figures(args, epochs: list[dict], run: ClusterRun, start_seen: float) -> dict:
    """The curve and what it says: accuracy against the driver's wall_s (or, from a driver
    that does not write it, the time this script first saw the record)."""
    curve, clock = [], "driver"
    started_wall = time.time() - (time.monotonic() - start_seen)
    for r in epochs:
        if r.get("test_accuracy") is None:
            continue
        wall = r.get("wall_s")
        if wall is None:
            clock = "observed"
            wall = run.epoch_seen[r["epoch"]] - started_wall
        curve.append([round(float(wall), 2), float(r["test_accuracy"])])
    within = [(w, a) for w, a in curve if w <= args.budget_s]
    hit = next((w for w, a in within if a >= args.target), None)
    examples = sum(r.get("examples", 0) for r in epochs)
    seconds = sum(r.get("train_s", 0.0) for r in epochs)
    last = epochs[-1] if epochs else {}
    return {
        "curve": curve,
        "clock": clock,
        "time_to_target_s": hit,
        "reached_target": hit is not None,
        "final_test_accuracy": curve[-1][1] if curve else None,
        "best_test_accuracy": max((a for _, a in curve), default=None),
        "epochs_done": len(epochs),
        "examples": examples,
        "examples_per_s": round(examples / seconds, 1) if seconds else None,
        "train_loss": last.get("train_loss"),
        "sandblaster": last.get("sandblaster"),  # a coordinated group's counters, if any
        "group_syncs": last.get("group_syncs"),
    }


# -- the record ---------------------------------------------------------------------------------


def measure(args) -> dict:
    results = []
    chosen = [c for c in CONTENDERS if c.name in args.only]
    with tempfile.TemporaryDirectory(prefix="bench-frameworks-") as tmp:
        for contender in chosen:
            row = run_contender(args, contender, Path(tmp))
            if not row["skipped"]:
                acc = row["final_test_accuracy"]
                _log(
                    f"{contender.name}: {len(row['curve'])} points, final "
                    f"{'n/a' if acc is None else f'{acc:.4f}'}, target at "
                    f"{row['time_to_target_s']} s, {row['examples_per_s']} examples/s"
                )
            results.append(row)
    ran = [r for r in results if not r["skipped"] and not r["error"] and r["curve"]]
    reached = [r for r in ran if r["reached_target"]]
    fastest = min(reached, key=lambda r: r["time_to_target_s"], default=None)
    best = max(ran, key=lambda r: r["best_test_accuracy"], default=None)
    return {
        "benchmark": "frameworks",
        "figure": "DistBelief Fig. 4: test accuracy against wall time (MNIST, Adam's CNN)",
        "target": args.target,
        "budget_s": args.budget_s,
        "results": results,
        "fastest_to_target": fastest["name"] if fastest else None,
        "best_accuracy": best["name"] if best else None,
        "skipped": [r["name"] for r in results if r["skipped"]],
        "failed": [r["name"] for r in results if r["error"]],
        "settings": {
            "model": "Adam's MNIST model without dropout, bench/support/paper_job.py's schedule",
            "data": args.data,
            "subset": args.subset,
            "epochs": args.epochs,
            "lbfgs_iterations": args.lbfgs_iterations,
            "lbfgs_batch": args.lbfgs_batch,
            "lbfgs_per_batch": args.lbfgs_per_batch,
            "lbfgs_warm_start": args.lbfgs_warm_start,
            "lbfgs_batch_growth": args.lbfgs_batch_growth,
            "sync_batch": args.sync_batch,
            "sync_lr": args.sync_lr,
            "quick": args.quick,
            "clock": "wall_s since the driver began training (role start-up excluded); a run "
            "is sent SIGTERM budget_s after its start record appeared",
        },
        "machine": describe_machine(),
        "versions": versions(),
    }


def main(argv: list[str] | None = None) -> int:
    from hogwild.signals import terminate_as_interrupt

    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    # SIGTERM: every job is stopped on the way out
    record = measured(__file__, argv, lambda: measure(args), terminate_as_interrupt())
    if record is None:
        return 2
    emit_record(record, args.out)
    if args.plot:
        from bench.support.plot_distbelief_fig4 import plot_fig4

        plot_fig4(record, args.plot)
    return 1 if record["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
