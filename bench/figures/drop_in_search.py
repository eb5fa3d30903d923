"""A resumable search for hogwild's recipe in ``drop_in.py``: the fewest training examples to
99.0 % test accuracy on pytorch/examples' MNIST network, and the speed each recipe trains at.

The example's own loop (Adadelta, batch 64) reaches 99.0 % after its fourth epoch (240,000
examples). hogwild's seconds to the target are its examples to the target over its examples/s,
so the ratio ``drop_in.py`` reports is, on a quiet machine,
``(240,000 / example's examples/s) / (hogwild's examples to target / hogwild's examples/s)``.
Speed alone cannot double it on two cores (both sides are near the core's arithmetic), so the
search looks for recipes that need fewer examples: rule, batch, learning rate, schedule
length, warm-up, momentum, weight decay, worker count.

A recipe is a list of ``drop_in.py`` flags, so any line of the log is rerun by
``python bench/figures/drop_in.py FLAGS --seed S``. Each (recipe, seed) trains hogwild only (the
full 60,000 training examples, tested on the 10,000 after every epoch) and is one JSON line
appended to ``--log`` as soon as it ends: the test accuracy per epoch, the examples to the target,
hogwild's examples/s, and as a control measured right after it in the same process the example's
own loop's examples/s on ``--control`` training examples (the machine may be shared: compare the
two rates, not either alone). Seconds are training only on both sides (tests not counted), as in
``drop_in.py``. A rerun skips the (recipe, seed) pairs the log holds.

    python bench/figures/drop_in_search.py --data ../shared/datasets/mnist \\
        --log bench/results/drop_in_search.jsonl --seeds 1 2 3 --recipes adam-b32-e1
    python bench/figures/drop_in_search.py --list
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.figures import drop_in
from bench.support.machine import versions
from bench.support.paths import SHARED_MNIST
from bench.support.record import JOB_ERRORS, source
from hogwild.errors import HogwildError

EXAMPLE_EXAMPLES_TO_TARGET = 240_000  # the example's 4 epochs (bench/results/drop_in.json)


def _recipe(rule: str, batch: int, lr: float, epochs: int, *extra: str) -> list[str]:
    return [
        "--rule", rule, "--batch", str(batch), "--lr", str(lr),
        "--hogwild-epochs", str(epochs), *extra,
    ]  # fmt: skip


LINEAR = ("--schedule", "linear", "--smooth")  # to zero by the run's end, step by step
COSINE = ("--schedule", "cosine", "--smooth")

RECIPES: dict[str, list[str]] = {
    # the two earlier defaults: per-example SGD on a cosine (4 epochs), Adam b16 (3 epochs)
    "sgd-b1-e4": _recipe("sgd", 1, 0.01, 4, "--schedule", "cosine"),
    "adam-b16-e3": _recipe("adam", 16, 0.002, 3, *LINEAR),
    # one epoch, the rate to zero within it: 99.0 % after 60,000 examples is a ratio of ~4
    # at equal speed, after 120,000 one of ~2
    "adam-b16-e1": _recipe("adam", 16, 0.002, 1, *LINEAR),
    "adam-b32-e1": _recipe("adam", 32, 0.003, 1, *LINEAR),
    "adam-b32-e1-lr2": _recipe("adam", 32, 0.002, 1, *LINEAR),
    "adam-b64-e1": _recipe("adam", 64, 0.004, 1, *LINEAR),
    "adam-b8-e1": _recipe("adam", 8, 0.0015, 1, *LINEAR),
    "adamw-b32-e1": _recipe("adamw", 32, 0.003, 1, *LINEAR, "--weight-decay", "0.01"),
    "adam-b32-e1-b95": _recipe("adam", 32, 0.003, 1, *LINEAR, "--beta2", "0.99"),
    "momentum-b16-e1": _recipe("momentum", 16, 0.02, 1, *LINEAR),
    "momentum-b32-e1": _recipe("momentum", 32, 0.03, 1, *LINEAR),
    "sgd-b1-e1": _recipe("sgd", 1, 0.02, 1, *LINEAR),
    "adam-b1-e1": _recipe("adam", 1, 0.0003, 1, *LINEAR),
    "adam-b4-e1": _recipe("adam", 4, 0.001, 1, *LINEAR),
    # two epochs: the rate down over both
    "adam-b32-e2": _recipe("adam", 32, 0.003, 2, *LINEAR),
    "adam-b32-e2-cos": _recipe("adam", 32, 0.003, 2, *COSINE),
    "adam-b16-e2": _recipe("adam", 16, 0.002, 2, *LINEAR),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bench/figures/drop_in_search.py", description=__doc__.split("\n")[0]
    )
    add = parser.add_argument
    add("--data", default=str(SHARED_MNIST), help="MNIST idx files")
    add("--log", default="bench/results/drop_in_search.jsonl", help="JSON lines, appended")
    add("--recipes", nargs="*", default=None, help="names to run (default: all)")
    add("--seeds", nargs="+", type=int, default=[1], help="one run per recipe and seed")
    add("--workers", type=int, default=0, help="hogwild's workers (0: every physical core)")
    add("--control", type=int, default=6400, help="examples of the example's loop timed")
    add("--list", action="store_true", help="print the recipes and exit")
    add("--summary", action="store_true", help="print the log's summary and exit")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.recipes or ()) - set(RECIPES))
    if unknown:
        parser.error(f"--recipes: unknown {unknown}; known: {sorted(RECIPES)}")
    if args.control < 64:
        parser.error(f"--control must be >= 64 examples, got {args.control}")
    return args


def example_examples_per_s(data: str, examples: int, seed: int) -> float:
    """The example's own loop (Adadelta, batch 64, every core) on its first ``examples``
    training examples: examples per second of training, the control for hogwild's rate."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from bench.peers.examples_mnist import net, train_epoch
    from bench.peers.torch_mnist import load_split

    torch.manual_seed(seed)
    images, labels = load_split(data, "train")
    images, labels = images[:examples], labels[:examples]
    loader = DataLoader(
        TensorDataset(torch.from_numpy(images), torch.from_numpy(labels)), 64, shuffle=True
    )
    model = net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    started = time.perf_counter()
    train_epoch(model, loader, optimizer)
    return len(labels) / (time.perf_counter() - started)


def summarise(runs: list[dict]) -> list[dict]:
    """Per recipe, over the seeds the log holds: the seeds, the lowest test accuracy after each
    epoch, the seeds that reached the target and the largest examples any seed needed (the
    recipe's examples to target only when every seed reached it), and the mean expected ratio."""
    by_recipe: dict[str, list[dict]] = {}
    for run in runs:
        if "error" not in run:
            by_recipe.setdefault(run["recipe"], []).append(run)
    rows = []
    for name, group in by_recipe.items():
        curves = [run["test_accuracy_per_epoch"] for run in group]
        reached = [run["examples_to_target"] for run in group if run["examples_to_target"]]
        ratios = [run["expected_ratio"] for run in group if run["expected_ratio"]]
        rows.append(
            {
                "recipe": name,
                "seeds": sorted(run["seed"] for run in group),
                "min_accuracy_per_epoch": [min(epoch) for epoch in zip(*curves, strict=False)],
                "seeds_reached": len(reached),
                "examples_to_target": max(reached) if len(reached) == len(group) else None,
                "mean_expected_ratio": sum(ratios) / len(ratios) if ratios else None,
            }
        )
    return rows


def read_log(log: Path) -> list[dict]:
    """The log's runs, in the order they ended (none when it does not exist yet)."""
    if not log.exists():
        return []
    text = log.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def run_one(args: argparse.Namespace, name: str, seed: int) -> dict:
    flags = [*RECIPES[name], "--seed", str(seed), "--workers", str(args.workers)]
    recipe_args = drop_in.parse_args(["--data", args.data, *flags])
    started = time.perf_counter()
    try:
        ours = drop_in.run_hogwild(recipe_args, 0, 0)
    except (*JOB_ERRORS, HogwildError) as exc:  # a failed or refused recipe is a result too
        return {"recipe": name, "seed": seed, "flags": flags, "error": repr(exc)}
    control = example_examples_per_s(args.data, args.control, seed)
    reached = drop_in.examples_to_target(ours["epochs"], recipe_args, 0)
    speed_ratio = ours["examples_per_s"] / control
    record = {
        "recipe": name,
        "seed": seed,
        "flags": flags,
        "test_accuracy_per_epoch": [e["test_accuracy"] for e in ours["epochs"]],
        "train_s_per_epoch": [e["train_s"] for e in ours["epochs"]],
        "examples_to_target": reached,
        "seconds_to_target": ours["seconds_to_target"],
        "hogwild_examples_per_s": ours["examples_per_s"],
        "example_examples_per_s": control,
        "control_examples": args.control,
        "workers": ours["workers"],
        # the ratio drop_in.py would report at these two rates (training seconds only)
        "expected_ratio": (EXAMPLE_EXAMPLES_TO_TARGET / reached * speed_ratio if reached else None),
        "torch_test_accuracy": ours["torch_test_accuracy"],
        "wall_s": round(time.perf_counter() - started, 1),
    }
    return record


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.list:
        for name, flags in RECIPES.items():
            print(name, " ".join(flags))
        return
    log = Path(args.log)
    if args.summary:
        print(json.dumps({"summary": summarise(read_log(log))}))
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    done = {(run["recipe"], run["seed"]) for run in read_log(log)}
    stamp = {"source": source(), "versions": versions()}
    for name in args.recipes or list(RECIPES):
        for seed in args.seeds:
            if (name, seed) in done:
                continue
            print(f"drop_in_search: {name} seed {seed} ...", file=sys.stderr, flush=True)
            record = {**run_one(args, name, seed), **stamp}
            line = json.dumps(record)
            print(line, flush=True)
            with log.open("a", encoding="utf-8") as out:
                out.write(line + "\n")
    print(json.dumps({"summary": summarise(read_log(log))}), flush=True)


if __name__ == "__main__":
    main()
