"""A resumable search for Adam's Table 1 recipe: MNIST without transformations, the same model.

Adam (OSDI 2014, section 4.3.3) reports 99.63 % asynchronously and 99.39 % synchronously on
MNIST with no transformation of the training data, and credits asynchrony's noise for the gap.
This script tries recipes the paper's setting allows (the same architecture, no augmentation):
dropout placement and rates, weight decay, the learning rate and its schedule's length, the
initialisation, the fully connected update interval, the worker count, the parameter store, the
parameter server's rule and staleness through ``hogwild cluster``, and more epochs; and the
synchronous twin, to see whether asynchrony is ahead at equal epochs.

Every (recipe, seed, epochs) run is one JSON line appended to ``--log`` as soon as it ends
(failed runs too, with their error); a rerun skips what the log already holds (a run is the same
when its recipe's name, arguments, seed, epochs and the caller's extra arguments are), so an
interrupted search continues where it stopped and a reader can rerun any part of it. Every
recipe tried stays in the log, the ones that did not help included.

``--epochs E`` scales the search down for screening: each recipe trains ``E`` epochs (times its
own factor: ``epochs-x2`` trains ``2E``) on the same cosine schedule compressed to that length.
Without it a recipe trains its full length (the config's 60 epochs, times its factor). At the
end the script prints one JSON line: per recipe and length, the runs' mean test accuracy and
its difference from the default recipe's at the same length over the seeds both have.

    python bench/figures/table1_search.py --data ../shared/datasets/mnist --epochs 8 \\
        --seeds 1 --log bench/results/table1_search.jsonl --metrics-dir /tmp/table1_search
    python bench/figures/table1_search.py --data ../shared/datasets/mnist --recipes \\
        --log bench/results/table1_search.jsonl --markdown bench/results/table1_search.md
    python bench/figures/table1_search.py --list                # the recipes and why each

Extra ``--section.key=value`` arguments go to every run, after the recipe's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

import hogwild
from bench.support.machine import describe_machine, versions
from bench.support.record import command_line, emit_record, source
from bench.support.table1_run import Job, JobFailed, read_run_log, run_job

DEFAULT_RECIPE = "default"


@dataclass(frozen=True)
class Recipe:
    """One setting to try: the command (``train`` or ``cluster``), its arguments after the
    config, the factor on the search's epochs, and why it might help (from the papers)."""

    name: str
    command: str
    args: tuple[str, ...]
    why: str
    epochs_factor: float = 1.0


def _layers(changes: dict[int, float], dropout_after: int | None = None, p: float = 0.0) -> str:
    """The bundled layer stack as one TOML inline array, with dropout rates changed
    (``{layer index: p}``) and, if ``dropout_after`` is given, a dropout layer of rate ``p``
    inserted after that layer."""
    layers = [layer.to_dict() for layer in hogwild.load_config().model.layers]
    for index, rate in changes.items():
        if layers[index]["type"] != "dropout":
            raise ValueError(f"layer {index} is a {layers[index]['type']}, not a dropout")
        layers[index]["p"] = rate
    if dropout_after is not None:
        layers.insert(dropout_after + 1, {"type": "dropout", "p": p})
    tables = []
    for layer in layers:
        keys = ", ".join(f"{k} = {json.dumps(v)}" for k, v in layer.items())
        tables.append("{" + keys + "}")
    return "--model.layers=[" + ", ".join(tables) + "]"


def _dropout_indices() -> list[int]:
    """Indices of the bundled stack's dropout layers: after the second pooling, then after each
    hidden fully connected layer."""
    layers = hogwild.load_config().model.layers
    return [i for i, layer in enumerate(layers) if layer.type == "dropout"]


def _first_pool() -> int:
    layers = hogwild.load_config().model.layers
    return next(i for i, layer in enumerate(layers) if layer.type == "maxpool")


def recipes() -> dict[str, Recipe]:
    """Every recipe the search knows, by name; the first is the control (the default job)."""
    conv_drop, fc_drop1, fc_drop2 = _dropout_indices()
    found = [
        Recipe(DEFAULT_RECIPE, "train", (), "the control: the default job as it is"),
        Recipe("sync", "train", ("--sync",), "the synchronous twin: is asynchrony ahead?"),
        Recipe(
            "conv-dropout-0.4",
            "train",
            (_layers({conv_drop: 0.4}),),
            "dropout after the convolutions was what moved the test accuracy (table1_notes.md)",
        ),
        Recipe(
            "pool1-dropout-0.1",
            "train",
            (_layers({}, dropout_after=_first_pool(), p=0.1),),
            "dropout after the first pooling too: more regularisation of the convolutions",
        ),
        Recipe(
            "fc-dropout-0.3",
            "train",
            (_layers({fc_drop1: 0.3, fc_drop2: 0.3}),),
            "less fully connected dropout: the loss is still 0.02 at the end (underfits?)",
        ),
        Recipe("lr-0.01", "train", ("--optim.lr=0.01",), "a larger step: more SGD noise"),
        Recipe("lr-0.004", "train", ("--optim.lr=0.004",), "a smaller step"),
        Recipe("wd-0.0005", "train", ("--optim.weight_decay=0.0005",), "half the weight decay"),
        Recipe("init-xavier", "train", ("--model.init=xavier",), "another initialisation"),
        Recipe("init-torch", "train", ("--model.init=torch",), "PyTorch's initialisation"),
        Recipe(
            "init-xavier-sync",
            "train",
            ("--model.init=xavier", "--sync"),
            "init-xavier's synchronous twin: is asynchrony ahead with it?",
        ),
        Recipe(
            "update-every-1",
            "train",
            ("--train.update_every=1",),
            "per-example fully connected updates (Adam's SGD; less staleness)",
        ),
        Recipe(
            "update-every-32",
            "train",
            ("--train.update_every=32",),
            "fully connected updates every 32 examples: more staleness",
        ),
        Recipe(
            "workers-4",
            "train",
            ("--train.workers=4",),
            "more asynchrony: four workers (Adam credits asynchrony's noise)",
        ),
        Recipe(
            "store-shared",
            "train",
            ("--train.parameters=shared",),
            "Adam's one shared copy written by every worker without locks",
        ),
        Recipe(
            "push-256",
            "train",
            ("--train.n_push=256", "--train.n_fetch=256"),
            "copies exchange with the home copy every 256 examples: more staleness",
        ),
        Recipe(
            "epochs-x2",
            "train",
            (),
            "twice the epochs on the same cosine schedule: Adam trained 'to convergence'",
            epochs_factor=2.0,
        ),
        Recipe(
            "cluster-2-adagrad",
            "cluster",
            ("--cluster.replicas=2",),
            "Downpour: 2 replicas through a parameter server applying Adagrad (the default)",
        ),
        Recipe(
            "cluster-2-sgd",
            "cluster",
            ("--cluster.replicas=2", "--ps.rule=sgd"),
            "2 replicas through a parameter server applying the pushed deltas (Adam's rule)",
        ),
        Recipe(
            "cluster-2-sgd-512",
            "cluster",
            ("--cluster.replicas=2", "--ps.rule=sgd", "--train.n_push=512", "--train.n_fetch=512"),
            "Adam's own cluster (3.2.6): the pushed deltas applied as they are, an exchange every "
            "512 examples (as fast as Adagrad's)",
        ),
        Recipe(
            "cluster-4-sgd",
            "cluster",
            ("--cluster.replicas=4", "--ps.rule=sgd"),
            "4 replicas through the parameter server: more asynchrony",
        ),
        Recipe(
            "cluster-2-staleness",
            "cluster",
            ("--cluster.replicas=2", "--ps.rule=staleness"),
            "Chan & Lane's staleness-aware server rule (momentum, stale gradients decayed)",
        ),
    ]
    return {r.name: r for r in found}


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="MNIST idx directory or LMDB cache")
    parser.add_argument("--config", default="", help="job config (default: the bundled one)")
    parser.add_argument(
        "--recipes",
        nargs="*",
        help="recipes to run, in order (default: all; none: only summarise the log)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument(
        "--epochs", type=int, default=0, help="screening length per recipe (0: the full length)"
    )
    parser.add_argument("--log", default="bench/results/table1_search.jsonl")
    parser.add_argument("--metrics-dir", default="", help="per-run metrics (default: beside log)")
    parser.add_argument("--out", default="", help="write the summary's JSON line here too")
    parser.add_argument("--markdown", default="", help="write the log as a table here")
    parser.add_argument("--list", action="store_true", help="print the recipes and stop")
    args, extra = parser.parse_known_args(argv)
    known = recipes()
    for name in args.recipes or []:
        if name not in known:
            parser.error(f"--recipes: unknown recipe {name!r}; known: {', '.join(known)}")
    if args.epochs < 0:
        parser.error(f"--epochs {args.epochs}: expected 0 (full length) or a positive count")
    if not args.list and args.recipes != [] and not args.data:
        parser.error("--data is required (unless --list, or --recipes names none)")
    bad = [a for a in extra if not a.startswith("--")]
    if bad:
        parser.error(f"unexpected arguments {bad}: extra arguments are --section.key=value")
    return args, extra


def run_key(line: dict) -> tuple:
    """What makes two runs the same run (the log's resume key)."""
    return (line["recipe"], tuple(line["args"]), line["seed"], line["epochs"], tuple(line["extra"]))


def read_log(path: Path) -> list[dict]:
    """The log's runs (:func:`~bench.support.table1_run.read_run_log`)."""
    return read_run_log(path, run_key, "search run")


def full_epochs(config: str) -> int:
    return hogwild.load_config(config or None).train.epochs


def summarise(runs: list[dict]) -> list[dict]:
    """Per recipe and length: the runs' mean, and the difference from the default's mean over
    the seeds both have (paired: the same seeds)."""
    done = [r for r in runs if r.get("test_accuracy") is not None]
    groups: dict[tuple[str, int], dict[int, float]] = {}
    for r in done:
        groups.setdefault((r["recipe"], r["epochs"]), {})[r["seed"]] = r["test_accuracy"]
    rows = []
    for (name, epochs), by_seed in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        row = {
            "recipe": name,
            "epochs": epochs,
            "seeds": sorted(by_seed),
            "mean": statistics.fmean(by_seed.values()),
        }
        control = groups.get((DEFAULT_RECIPE, epochs), {})
        shared = sorted(set(by_seed) & set(control))
        if name != DEFAULT_RECIPE and shared:
            row["vs_default"] = statistics.fmean(by_seed[s] - control[s] for s in shared)
            row["vs_default_seeds"] = shared
        rows.append(row)
    return rows


def markdown(runs: list[dict], rows: list[dict], command: str) -> str:
    """The log as a page: every run (failed ones too), then each recipe's mean against the
    default's at the same length."""
    known = recipes()
    lines = [
        "# Adam's Table 1: the recipe search's log",
        "",
        f"Drawn by `{command}` from the log (one JSON line per run; a rerun adds what it lacks).",
        "",
        "| recipe | epochs | seed | test accuracy | best epoch | last train loss | wall time "
        "| commit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        if r.get("test_accuracy") is None:
            error = r.get("error", "").strip().splitlines()[-1:] or ["?"]
            lines.append(
                f"| {r['recipe']} | {r['epochs']} | {r['seed']} | failed: "
                f"{error[0][:120]} | | | | |"
            )
            continue
        loss = r.get("train_loss")
        lines.append(
            f"| {r['recipe']} | {r['epochs']} | {r['seed']} | {100 * r['test_accuracy']:.2f} % | "
            f"{100 * r['best_test_accuracy']:.2f} % | {'' if loss is None else f'{loss:.4f}'} | "
            f"{r['wall_s']:.0f} s | {(r.get('commit') or '')[:7]} |"
        )
    lines += [
        "",
        "Each recipe's mean, and its difference from the default's at the same length over the "
        "seeds both ran:",
        "",
        "| recipe | epochs | seeds | mean | against the default | what it tries |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        versus = row.get("vs_default")
        shown = "" if versus is None else f"{100 * versus:+.2f} points"
        why = known[row["recipe"]].why if row["recipe"] in known else ""
        lines.append(
            f"| {row['recipe']} | {row['epochs']} | {len(row['seeds'])} | "
            f"{100 * row['mean']:.2f} % | {shown} | {why} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args, extra = parse_args(argv)
    known = recipes()
    if args.list:
        for recipe in known.values():
            factor = f" (x{recipe.epochs_factor:g} epochs)" if recipe.epochs_factor != 1 else ""
            print(f"{recipe.name}: hogwild {recipe.command} {' '.join(recipe.args)}{factor}")
            print(f"    {recipe.why}")
        return
    log = Path(args.log)
    metrics_dir = Path(args.metrics_dir) if args.metrics_dir else log.with_suffix("")
    base = args.epochs or full_epochs(args.config)  # before any run: a bad config fails first
    logged = {run_key(r) for r in read_log(log) if r.get("test_accuracy") is not None}
    measured_on = source()
    chosen = [known[name] for name in (known if args.recipes is None else args.recipes)]
    for seed in args.seeds:  # seed-major: a slow spell of the machine falls on every recipe
        for recipe in chosen:
            epochs = max(1, round(base * recipe.epochs_factor))
            line = {
                "recipe": recipe.name,
                "command": recipe.command,
                "args": list(recipe.args),
                "seed": seed,
                "epochs": epochs,
                "extra": extra,
            }
            if run_key(line) in logged:
                print(f"{recipe.name} seed {seed} {epochs} epochs: in the log", file=sys.stderr)
                continue
            job = Job(
                recipe.command,
                seed,
                (*recipe.args, f"--train.epochs={epochs}"),
                config=args.config,
                extra=tuple(extra),
            )
            metrics = metrics_dir / f"{recipe.name}_seed{seed}_e{epochs}.jsonl"
            try:
                line |= run_job(job, args.data, metrics)
                shown = f"{100 * line['test_accuracy']:.2f} % in {line['wall_s']:.0f} s"
            except JobFailed as exc:  # logged too: a recipe that breaks is a finding
                line |= {"test_accuracy": None, "error": str(exc)[-2000:]}
                shown = "failed"
            line |= {"commit": measured_on["commit"], "finished": time.time()}
            with log.open("a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")
            print(f"{recipe.name} seed {seed} {epochs} epochs: {shown}", file=sys.stderr)
    runs = read_log(log)
    shown_command = command_line(__file__, argv if argv is not None else sys.argv[1:])
    record = {
        "benchmark": "table1_search",
        "log": str(log),
        "summary": summarise(runs),
        "machine": describe_machine(),
        "versions": versions(),
        "source": measured_on,
        "command": shown_command,
    }
    emit_record(record, args.out)
    if args.markdown:
        page = markdown(runs, record["summary"], shown_command)
        Path(args.markdown).write_text(page, encoding="utf-8")


if __name__ == "__main__":
    main()
