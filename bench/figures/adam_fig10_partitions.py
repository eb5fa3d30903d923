"""Adam's Fig. 10 (model size a number of machines trains efficiently) with model partitions.

Project Adam (Chilimbi et al., OSDI 2014, section 4.2, Fig. 10) grows a model by its feature maps
and plots, per number of partitioned machines, the throughput against the model's size: the
largest model a configuration trains before its speed falls grows super-linearly with the
machines, because each partition's working set fits its cache. Here, on this machine's cores and
real MNIST, every figure comes from the real CLI, for each size (the bundled Adam MNIST model with
both convolutions' maps multiplied by a factor, to at least 500 million connections):

- **1 partition**: ``hogwild train --workers 1`` (the whole model in one process);
- **2 partitions**: ``hogwild train --partitions 2 --train.in_flight=N`` (one replica split over two
  processes by feature maps and units, N examples in flight);
- **control**: two concurrent ``hogwild train --workers 1`` processes, each its own model: what
  two cores give without partitioning (their examples/s summed).

Each run trains one epoch of the first ``--examples`` examples; its examples/s is the job's
(examples over the epoch's training seconds, evaluation excluded). Each size's records carry
``connections``, ``partitions``, ``examples_per_s``, ``ratio_to_control`` and
``bytes_per_example`` (what crosses between the partitions per example, from the plan).
``--repeats R`` runs the control and the 2 partitions R times per size, interleaved (each
2-partition run right after its control, so that a host whose speed drifts over minutes moves
both alike): the 2-partition row's ``runs`` lists each run's examples/s beside its control's, and
its ``examples_per_s``, ``control_examples_per_s`` and ``ratio_to_control`` are the medians (of an
even count the lower middle one, so each is a run's own; the ratio is the median of the runs'
own ratios, so with ``--repeats`` above 1 it need not be the quotient of the other two); its
``test_accuracy`` is its runs' lowest. The 1-partition row stays one run, set against the
median control;
``largest_efficient`` gives, per configuration, the largest size whose connections/s is still
within 10 % of its best (Adam's "before its speed falls"); ``targets`` the ratio of 2 partitions
to the control on models of at least 100 million connections (the target: >= 0.85).

**Only runs that learned count.** A run's speed means nothing if its weights diverged (a
diverged model predicts one class: about 0.1 test accuracy). Each row records its
``test_accuracy``, the control's (the lower of its two processes) and ``learned``: whether both
reached ``--learned-floor`` (``learned_floor`` in the JSON). ``largest_efficient`` and
``targets`` use learned rows only, and the target is not met while a 2-partition row (or its
control) of at least 100 million connections did not learn (``targets.not_learned`` lists them).

**The wide model** (``--wide-epochs`` > 0; the race's rules: ``bench/support/wide_race.py``): a
fully connected 784-4096-4096-10 model (``--wide-units``) trained by 2 partitions (``hogwild train
--partitions 2``) and by 2 data-parallel replicas through one parameter server (``hogwild cluster
--replicas 2 --workers-per-replica 1 --ps 1``), each for ``--wide-epochs`` short epochs over the
same ``--wide-examples`` examples (the race's seed picks them), at a constant learning rate, each as
its job trains by default: the 2 partitions per-example SGD at the paper job's rate divided by their
``--wide-in-flight`` examples in flight (default: ``train.in_flight``'s default, one: the paper
job's rate), the replicas as ``hogwild cluster`` trains 2 replicas (Downpour: each worker's
per-example SGD at the paper job's rate on its copy, the deltas pushed and the model fetched at the
store's cadence, the servers applying them by their own rule: Adagrad at its rate). Each run's entry
says what it trained with (``trained_as``: from its metrics' start record). The epochs are
evaluation points (and a reshuffle) and nothing else: each run's test accuracy after every epoch (on
``--wide-data``'s test set, default ``--data``'s) gives its learning curve (``curve``: the examples
and the training seconds so far, evaluation and start-up excluded, and the accuracy there).
``--wide-repeats`` races (default 4) run, each at its own seed (``--wide-seed``, then +1 and so on;
both contenders of a race at the same one), who runs first going A B B A
(``bench.support.wide_race.race_order``: over four races each starts first twice, so a steady drift
of the host's speed moves both alike); ``wide.races`` holds each, with its ``seed`` and who ran
``first``. In a race, the *common accuracy* is the lower of the two runs' best;
``seconds_to_common_accuracy`` is the training seconds at a run's first point at or above it, and
``below_common_accuracy_at_s`` those at its point before (it crossed in between; 0.0 for the first
point). A race's ``partitions_faster`` is true when the partitions had the common accuracy at a
point before the replicas' last point below it, false the other way round, and null when the two
intervals overlap. The common accuracy is the top of the lower run's plateau, where a point's noise
decides which run touched it first, so the same comparison at 99 % of it (``near_accuracy``;
``seconds_to_near_accuracy``, ``below_near_accuracy_at_s``) is ``partitions_faster_to_near``.
``wide.partitions_faster`` (the target) and ``wide.partitions_faster_to_near`` are the verdicts of
more than half of all the races (null without one; an undecided race counts against both),
``wide.tally`` (``tally_to_near``) how the races split, and
``wide.replicas_over_partitions_seconds`` (``..._to_near``) each race's paired ratio, the replicas'
seconds to the race's level over the partitions' (above 1: the partitions first), with their
``median_ratio`` (``median_ratio_to_near``). The replicas' driver evaluates between epochs while
they wait (``cluster.evaluate=between``), not beside their training, as the partitioned job's leader
does; both pull or gather the model for it outside the training seconds. What starting an epoch
costs each contender (portions handed out, examples loaded) is inside them, so very many, very short
epochs would charge it more often. ``--factors= --sweep=`` (both empty) runs the wide races alone
(no size rows: ``targets`` and ``largest_efficient`` are null, and there is no figure to plot).

**Examples in flight** (``--sweep``): 2 partitions on the size ``--sweep-factor`` with each
``train.in_flight`` of the list (the run of a size's row, where it is the same, is not made again);
``in_flight_sweep`` gives each one's examples/s (what the default ``train.in_flight`` should be
chosen from). The 2-partition rows and the sweep's runs train at the paper job's learning rate
divided by their examples in flight (stale gradients need the smaller step: docs/partitioning.md;
each row's ``lr`` says which), under which the x16 runs with 1, 2 and 4 in flight learned (above the
floor; their accuracies are not comparable across rates, and larger sizes were not checked: the
``learned`` gate says per row); ``--no-lr-over-in-flight`` trains them all at the paper job's rate
(the recipe under which 4 in flight diverged from 86 million connections up).

Run: ``python bench/figures/adam_fig10_partitions.py --out bench/results/fig10.json --plot
bench/results/fig10.png`` (``--quick`` for a tiny smoke run: the smallest size, few examples;
a size's 1-partition row is its control's first run, the same command, launched once:
``settings.one_partition_is_a_control_run``). It prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.support.grown_model import accuracy_of, grown_plan, one_epoch_command, run_jobs
from bench.support.machine import describe_machine, versions
from bench.support.paper_job import PAPER_JOB, PAPER_OVERRIDES
from bench.support.record import emit_record, fresh_numba_cache, stamp
from bench.support.wide_race import (
    PARTITIONS,
    REPLICAS,
    epochs_of,
    learning_curve,
    race,
    race_order,
    trained_as,
    verdict,
    wide_layers,
)
from hogwild.training.metrics import read_metrics

FACTORS = (1, 2, 4, 8, 16, 24, 32, 40)
# the test accuracy a run must reach to count: well above a diverged model's (one class, about
# 0.1), below what 400 examples reached at every size with one in flight (0.68 to 0.81)
LEARNED_FLOOR = 0.5
# quick: the smallest size alone; every size runs the same code, and a larger one only costs more
QUICK_FACTORS = (1,)
TARGET_CONNECTIONS = 100_000_000
TARGET_RATIO = 0.85


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="adam_fig10_partitions.py", description=__doc__)
    parser.add_argument(
        "--factors",
        default=",".join(map(str, FACTORS)),
        help="feature-map multipliers of the Adam MNIST model, comma separated",
    )
    parser.add_argument("--examples", type=int, default=2000, help="examples per run")
    parser.add_argument(
        "--in-flight",
        type=int,
        default=None,
        help="examples in flight (2 partitions); default: train.in_flight's default",
    )
    parser.add_argument(
        "--learned-floor",
        type=float,
        default=LEARNED_FLOOR,
        help="test accuracy a run must reach for its row to count",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="per size, the control and the 2-partition run this many times, interleaved; a "
        "row reports the medians (the ratio: the median of each run's over the control just "
        "before it)",
    )
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="bound on one run")
    parser.add_argument("--data", default="mnist", help="MNIST idx directory or 'mnist'")
    parser.add_argument(
        "--wide-epochs", type=int, default=12, help="wide model epochs, each evaluated (0: skip)"
    )
    parser.add_argument(
        "--wide-examples", type=int, default=2500, help="wide model examples (one epoch)"
    )
    parser.add_argument("--wide-units", type=int, default=4096, help="wide model hidden units")
    parser.add_argument(
        "--wide-in-flight",
        type=int,
        default=None,
        help="the wide model's 2 partitions' examples in flight; default: train.in_flight's "
        "default",
    )
    parser.add_argument(
        "--wide-repeats",
        type=int,
        default=None,
        help="races of the wide model (default 4; --quick: 1), each at its own seed, who runs "
        "first going A B B A (a multiple of 4 balances the order); the verdict is the "
        "majority's. Each race is two runs of --wide-epochs epochs: about 10 minutes on 2 cores",
    )
    parser.add_argument(
        "--wide-seed", type=int, default=1, help="the first wide race's seed (the next: +1, ...)"
    )
    parser.add_argument(
        "--wide-data", help="MNIST idx directory of the wide model's races; default: --data"
    )
    parser.add_argument("--sweep", default="1,2,4,8", help="train.in_flight values to compare")
    parser.add_argument(
        "--lr-over-in-flight",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="partitioned runs train at the paper job's learning rate / examples in flight "
        "(default; --no-lr-over-in-flight: at the paper job's rate whatever is in flight)",
    )
    parser.add_argument("--sweep-factor", type=int, default=8, help="the size they train")
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run")
    parser.add_argument("--out", help="write the JSON line here too")
    parser.add_argument("--plot", help="draw the figure into this PNG")
    args = parser.parse_args(argv)
    args.factors = [int(f) for f in args.factors.split(",") if f]
    if args.in_flight is None or args.wide_in_flight is None:
        from hogwild.config import load_config

        default = load_config(None).train.in_flight
        args.in_flight = default if args.in_flight is None else args.in_flight
        args.wide_in_flight = default if args.wide_in_flight is None else args.wide_in_flight
    args.wide_data = args.wide_data or args.data
    if args.quick:
        args.factors, args.examples = list(QUICK_FACTORS), 100
        args.wide_epochs, args.wide_examples, args.wide_units = 3, 100, 64
        args.wide_repeats = 1 if args.wide_repeats is None else args.wide_repeats
        # the size rows' in flight on the first size: the sweep takes that row's run
        args.sweep, args.sweep_factor = str(args.in_flight), 1
    args.wide_repeats = 4 if args.wide_repeats is None else args.wide_repeats
    if min(args.repeats, args.wide_repeats, args.wide_in_flight, args.in_flight) < 1:
        parser.error(
            "--repeats, --wide-repeats, --in-flight and --wide-in-flight must be at least 1"
        )
    if args.wide_epochs < 0 or args.wide_examples < 1 or args.wide_units < 1:
        parser.error(
            "--wide-epochs must be at least 0, --wide-examples and --wide-units at least 1"
        )
    args.sweep = [int(n) for n in args.sweep.split(",") if n]
    if any(n < 1 for n in args.sweep):
        parser.error("--sweep must list positive integers")
    if args.factors and min(args.factors) < 1:
        parser.error("--factors must be positive integers")
    if not (args.factors or args.sweep or args.wide_epochs):
        parser.error("nothing to measure: --factors and --sweep are empty, --wide-epochs is 0")
    return args


def _command(args, factor: int, extra: list[str]) -> list[str]:
    """A size's one-epoch run on ``--data``'s first ``--examples`` examples, ``extra`` last."""
    return one_epoch_command(args.data, args.examples, factor, extra)


def _run(args, commands: list[list[str]]) -> list[dict]:
    """``commands`` at once, each bounded by ``--timeout-s``; their summaries."""
    return run_jobs(commands, args.timeout_s)


def size_rows(args, factor: int, one: dict, controls: list, twos: list) -> tuple[list, dict]:
    """A size's rows (1 partition, 2 partitions) from its runs' summaries: ``one``, and each
    repeat's control pair and 2-partition run in the order they ran; also the median
    2-partition run (the lower middle one of an even count)."""
    connections, crossing = grown_plan(factor, 2)
    control_rates = [sum(c["examples_per_s"] for c in control) for control in controls]
    ratios = [
        t["examples_per_s"] / r if r else None for t, r in zip(twos, control_rates, strict=True)
    ]
    control_rate = statistics.median_low(control_rates)
    control_accuracy = min(accuracy_of(c) for control in controls for c in control)
    by_rate = sorted(twos, key=lambda t: t["examples_per_s"])
    two = by_rate[(len(by_rate) - 1) // 2]  # the median run (the lower middle one of an even count)
    two_accuracy = min(accuracy_of(t) for t in twos)
    rows = []
    rates = {1: float(PAPER_OVERRIDES["optim.lr"]), 2: partitioned_lr(args, args.in_flight)}
    for partitions, summary, bytes_crossing in ((1, one, 0), (2, two, crossing)):
        rate = summary["examples_per_s"]
        # quick: the 1-partition run ran beside the control's second, so it is half the
        # control's rate by construction and no ratio is reported for it
        beside = args.quick and partitions == 1
        ratio = rate / control_rate if control_rate and not beside else None
        accuracy = accuracy_of(summary)
        row = {"factor": factor, "connections": connections, "partitions": partitions}
        if partitions == 2:
            good = [r for r in ratios if r is not None]
            ratio = statistics.median_low(good) if good else None
            accuracy = two_accuracy  # the lowest of its runs: every one must have learned
            row["runs"] = [
                {"examples_per_s": t["examples_per_s"], "control_examples_per_s": c, "ratio": r}
                for t, c, r in zip(twos, control_rates, ratios, strict=True)
            ]
        row.update(
            {
                "examples_per_s": rate,
                "connections_per_s": rate * connections,
                "ratio_to_control": ratio,
                "bytes_per_example": bytes_crossing,
                "lr": rates[partitions],
                "control_examples_per_s": control_rate,
                "test_accuracy": accuracy,
                "control_test_accuracy": control_accuracy,
                "learned": learned(args, accuracy, control_accuracy),
            }
        )
        rows.append(row)
    return rows, two


def measure_size(args, factor: int, partitioned_runs: dict) -> list[dict]:
    """The size's rows; its 2-partition run's summary goes into ``partitioned_runs`` under
    (factor, examples in flight)."""
    seeds = [["--workers", "1", "--seed", str(s)] for s in (1, 2)]
    one, controls, twos = None, [], []
    for repeat in range(args.repeats):  # interleaved: each 2-partition run after its control
        if args.quick:  # the 1-partition run is the control's first (the same command: seed 1)
            control = _run(args, [_command(args, factor, s) for s in seeds])
            one = one or control[0]
        else:
            if repeat == 0:
                one = _run(args, [_command(args, factor, ["--workers", "1"])])[0]
            control = _run(args, [_command(args, factor, s) for s in seeds])
        controls.append(control)
        twos.append(_run(args, [_command(args, factor, partitioned(args, args.in_flight))])[0])
    rows, two = size_rows(args, factor, one, controls, twos)
    # the sweep's entry for this command: the median run, with its runs' lowest accuracy (the
    # row's own; the row's ``learned`` also asks the control to have learned, the sweep's not)
    partitioned_runs[(factor, args.in_flight)] = {**two, "test_accuracy": rows[1]["test_accuracy"]}
    first = rows[0]
    _log(
        f"x{factor}: {first['connections']:,} connections: 1 partition "
        f"{one['examples_per_s']:.1f}/s (accuracy {accuracy_of(one):.3f}), 2 partitions "
        f"{two['examples_per_s']:.1f}/s ({accuracy_of(two):.3f}; ratios "
        + ", ".join(f"{r['ratio']:.2f}" for r in rows[1]["runs"] if r["ratio"] is not None)
        + f"), control {first['control_examples_per_s']:.1f}/s "
        f"({first['control_test_accuracy']:.3f})"
    )
    return rows


def partitioned(args, in_flight: int) -> list[str]:
    """The options of a 2-partition run with ``in_flight`` examples in flight (and, unless
    ``--no-lr-over-in-flight``, the paper job's learning rate divided by them)."""
    return [
        "--partitions",
        "2",
        f"--train.in_flight={in_flight}",
        f"--optim.lr={partitioned_lr(args, in_flight):g}",
    ]


def partitioned_lr(args, in_flight: int) -> float:
    """The learning rate of a 2-partition run with ``in_flight`` examples in flight.

    With N in flight an example's update lands up to N - 1 other updates after the forward pass
    it came from: delayed SGD, whose largest stable step shrinks with the delay. At the paper
    job's rate the 86-million-connection model and up diverge with 4 in flight, partitioned or
    not (docs/partitioning.md), while the 1-partition run (``hogwild train --workers 1``: the
    Hogwild engine with one worker, not the partitioned runtime) is per-example SGD at that
    rate. lr / examples in flight (N = 1: the same rate) learned at x16; whether a row's run
    learned is its ``learned``, not this recipe's promise."""
    rate = float(PAPER_OVERRIDES["optim.lr"])
    return rate / in_flight if args.lr_over_in_flight else rate


def learned(args, *accuracies: float) -> bool:
    """Whether every run behind a row reached the floor (a diverged model sits near 0.1)."""
    return all(a >= args.learned_floor for a in accuracies)


def measure_wide(args, folder: Path) -> dict:
    """2 partitions against 2 data-parallel replicas through a parameter server, ``--wide-repeats``
    races: in each, each one's learning curve (the test accuracy after each of ``--wide-epochs``
    short epochs) and when each first reached the accuracy both reach and 99 % of it. Who runs
    first goes A B B A (:func:`~bench.support.wide_race.race_order`), so that over every four
    races each contender holds each position equally often."""
    common = [
        "--data",
        args.wide_data,
        "--epochs",
        str(args.wide_epochs),
        "--no-progress",
        *PAPER_JOB,
        wide_layers(args.wide_units),
        # the epochs are evaluation points, nothing else: the rate does not step at their ends
        "--optim.schedule=constant",
        "--train.evaluate_every=1",
    ]
    contenders = wide_runs(args)
    races = []
    for repeat in range(args.wide_repeats):
        seed = args.wide_seed + repeat  # both contenders of a race: the same seed
        found = {}
        for name in race_order(repeat):
            run = contenders[name]
            metrics = folder / f"wide-{name}-{repeat}.jsonl"
            command = [sys.executable, "-m", "hogwild.cli", *run["head"], *common, *run["tail"]]
            command += ["--seed", str(seed), "--metrics", str(metrics)]
            summary = _run(args, [command])[0]
            records = read_metrics(metrics)
            curve = learning_curve(epochs_of(records))
            found[name] = {
                "lr": run["lr"],
                "in_flight": run["in_flight"],
                "trained_as": trained_as(records),
                "examples_per_s": summary["examples_per_s"],
                "curve": curve,
                "test_accuracy": [p["test_accuracy"] for p in curve],
            }
            _log(
                f"wide race {repeat + 1} {name}: {summary['examples_per_s']:.1f} examples/s, "
                f"accuracy {found[name]['test_accuracy']}"
            )
        races.append(
            {
                "seed": seed,
                "first": race_order(repeat)[0],
                **race({n: found[n] for n in contenders}),
            }
        )
        _log(
            f"wide race {repeat + 1}: partitions faster to {races[-1]['common_accuracy']}: "
            f"{races[-1]['partitions_faster']}, to 99 % of it: "
            f"{races[-1]['partitions_faster_to_near']}"
        )
    return {
        "units": args.wide_units,
        "epochs": args.wide_epochs,
        "examples": args.wide_examples,
        "repeats": args.wide_repeats,
        "races": races,
        **verdict(races),
    }


def wide_runs(args) -> dict[str, dict]:
    """The wide comparison's two contenders: each one's command ``head`` (before the shared
    options), ``tail`` (after them, so that they win over the paper job's), and the ``lr`` and
    ``in_flight`` it trains with. The 2 partitions train with ``--wide-in-flight`` examples in
    flight (default: ``train.in_flight``'s default, one) at the rate the 2-partition rows would
    have with as many (:func:`partitioned`: lr / examples in flight unless
    ``--no-lr-over-in-flight``; with one in flight the paper job's); each replica is one worker's
    per-example SGD at the paper job's rate on its copy (None in flight: not a partitioned run),
    through ``hogwild cluster``'s servers, which apply the pushed deltas by their own rule (the
    run's ``trained_as`` records it)."""
    return {
        PARTITIONS: {
            "head": ["train", "--subset", str(args.wide_examples)],
            "tail": partitioned(args, args.wide_in_flight),
            "lr": partitioned_lr(args, args.wide_in_flight),
            "in_flight": args.wide_in_flight,
        },
        REPLICAS: {
            "head": ["cluster", "--replicas", "2", "--workers-per-replica", "1", "--ps", "1"],
            "tail": [
                f"--train.subset={args.wide_examples}",
                "--cluster.evaluate=between",  # the replicas wait: no evaluation beside training
            ],
            "lr": float(PAPER_OVERRIDES["optim.lr"]),
            "in_flight": None,
        },
    }


def measure_in_flight(args, partitioned_runs: dict) -> list[dict]:
    """2 partitions on one size with each number of examples in flight; a run a size's row made
    already (``partitioned_runs``: the same command) is not run again."""
    found = []
    for n in args.sweep:
        summary = partitioned_runs.get((args.sweep_factor, n))
        if summary is None:
            extra = partitioned(args, n)
            summary = _run(args, [_command(args, args.sweep_factor, extra)])[0]
        accuracy = accuracy_of(summary)
        found.append(
            {
                "in_flight": n,
                "lr": partitioned_lr(args, n),
                "examples_per_s": summary["examples_per_s"],
                "test_accuracy": accuracy,
                "learned": learned(args, accuracy),
            }
        )
        _log(f"in flight {n}: {summary['examples_per_s']:.1f} examples/s, accuracy {accuracy:.3f}")
    return found


def largest_efficient(rows: list[dict]) -> dict:
    """Per number of partitions, the largest size whose connections/s is within 10 % of the
    best that configuration reached, among the rows that learned (None: none did)."""
    found = {}
    for partitions in sorted({r["partitions"] for r in rows}):
        mine = sorted(
            (r for r in rows if r["partitions"] == partitions and r["learned"]),
            key=lambda r: r["connections"],
        )
        if not mine:
            found[str(partitions)] = None
            continue
        best = max(r["connections_per_s"] for r in mine)
        kept = [r["connections"] for r in mine if r["connections_per_s"] >= 0.9 * best]
        found[str(partitions)] = max(kept) if kept else None
    return found


def targets(rows: list[dict]) -> dict:
    """The 2-partition rows of at least 100 million connections against the target: only
    those that learned give a ratio, and any that did not keeps the target unmet."""
    big = [r for r in rows if r["partitions"] == 2 and r["connections"] >= TARGET_CONNECTIONS]
    counted = [r for r in big if r["learned"] and r["ratio_to_control"] is not None]
    ratios = [r["ratio_to_control"] for r in counted]
    not_learned = [r["factor"] for r in big if not r["learned"]]
    return {
        "two_partitions_over_control_at_100M": min(ratios) if ratios else None,
        "target": TARGET_RATIO,
        "rows_counted": len(counted),
        "not_learned": not_learned,
        "met": bool(ratios) and not not_learned and min(ratios) >= TARGET_RATIO,
    }


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    started = time.perf_counter()
    with fresh_numba_cache(), tempfile.TemporaryDirectory(prefix="bench-fig10-") as tmp:
        try:
            partitioned_runs: dict[tuple[int, int], dict] = {}
            rows = [row for f in args.factors for row in measure_size(args, f, partitioned_runs)]
            wide = measure_wide(args, Path(tmp)) if args.wide_epochs > 0 else None
            sweep = measure_in_flight(args, partitioned_runs)
        except (RuntimeError, OSError, json.JSONDecodeError) as exc:
            print(f"python bench/figures/adam_fig10_partitions.py: error: {exc}", file=sys.stderr)
            return 2
    record = {
        "benchmark": "partitions",
        "results": rows,
        "learned_floor": args.learned_floor,
        "largest_efficient": largest_efficient(rows) if rows else None,  # no size rows: none
        "targets": targets(rows) if rows else None,
        "wide": wide,
        "in_flight_sweep": sweep,
        "settings": {
            "factors": args.factors,
            "examples": args.examples,
            "in_flight": args.in_flight,
            "learned_floor": args.learned_floor,
            "lr_over_in_flight": args.lr_over_in_flight,
            "wide_epochs": args.wide_epochs,
            "wide_examples": args.wide_examples,
            "wide_units": args.wide_units,
            "wide_in_flight": args.wide_in_flight,
            "wide_repeats": args.wide_repeats,
            "wide_seed": args.wide_seed,
            "wide_data": args.wide_data,
            "sweep_factor": args.sweep_factor,
            "quick": args.quick,
            "repeats": args.repeats,
            "one_partition_is_a_control_run": args.quick,
            "data": args.data,
        },
        "machine": describe_machine(),
        "versions": versions(),
    }
    emit_record(stamp(record, __file__, argv, started), args.out)
    if args.plot and rows:
        from bench.support.plot_adam_fig10 import plot_fig10

        plot_fig10(record, args.plot)
    elif args.plot:
        _log(f"no size rows (--factors is empty): {args.plot} not drawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
