"""hogwild as a drop-in trainer: pytorch/examples' MNIST network trained by hogwild through
``hogwild.from_torch``, beside the example's own training loop, to the same test accuracy.

The network is the example's (:func:`bench.peers.examples_mnist.net`: two 3x3 convolutions of
32 and 64 maps, max-pool, dropout, 128 units, dropout), built once with the same seed for both
sides. The example trains it with its own loop (Adadelta, batch 64, torch on every core); hogwild
trains the same module, read by ``from_torch`` with its initial weights, with worker processes on
every physical core: by default per-example SGD at lr 0.01 on a per-epoch cosine over 4 epochs
(the recipe flags ``--rule --batch --lr --schedule --smooth --warmup-epochs --momentum --beta2
--weight-decay --hogwild-epochs`` set the others ``drop_in_search.py`` tries). Both read the
same MNIST idx files and normalise with the same mean and std.
Each side trains epoch by epoch and is tested after every epoch; the seconds counted are those
spent training (the test passes are not). The record has, for each side, the seconds to the
target test accuracy (``hogwild_seconds_to_target``, ``example_seconds_to_target``; None when
not reached within its epochs), examples/s and the per-epoch curve, and ``ratio`` = the
example's seconds over hogwild's (the target is ratio >= 2). hogwild's trained weights are loaded
back into the module with ``hogwild.to_torch`` and tested in torch too
(``hogwild_torch_test_accuracy``: what a PyTorch user gets back).

    python bench/figures/drop_in.py --out bench/results/drop_in.json
    python bench/figures/drop_in.py --quick       # a smoke run: small slices, one epoch each,
                                                  # torch on one thread
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.peers.examples_mnist import net, run_example, test_accuracy
from bench.support.machine import describe_machine, versions
from bench.support.paths import SHARED_MNIST
from bench.support.record import emit_record, fresh_numba_cache, stamp


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from hogwild.data.mnist import default_data_dir

    parser = argparse.ArgumentParser(
        prog="python bench/figures/drop_in.py", description=__doc__.split("\n")[0]
    )
    add = parser.add_argument
    default_data = SHARED_MNIST if SHARED_MNIST.exists() else default_data_dir()
    add("--data", default=str(default_data), help="MNIST idx files")
    add("--target", type=float, default=0.99, help="test accuracy to reach")
    add("--example-epochs", type=int, default=8, help="the example's epochs at most")
    add("--hogwild-epochs", type=int, default=4, help="hogwild's epochs (its schedule's length)")
    add("--workers", type=int, default=0, help="hogwild's workers (0: every physical core)")
    # hogwild's recipe: per-example SGD on a per-epoch cosine, the one that reaches 99.0 %; Adam
    # on minibatches of 16 with a smooth linear decay (--batch 16 --lr 0.002 --rule adam
    # --schedule linear --smooth --hogwild-epochs 3) ends short of it (docs/benchmarks.md)
    add("--batch", type=int, default=1, help="hogwild's examples per update")
    add("--lr", type=float, default=0.01, help="hogwild's learning rate")
    add("--rule", default="sgd", help="hogwild's optim.rule (sgd, momentum, adam, adamw)")
    add("--schedule", default="cosine", help="hogwild's optim.schedule")
    add(
        "--smooth",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="hogwild's optim.smooth: the rate moves within each epoch towards the next's",
    )
    add("--weight-decay", type=float, default=0.0, help="hogwild's optim.weight_decay")
    add("--warmup-epochs", type=int, default=0, help="hogwild's optim.warmup_epochs")
    add("--momentum", type=float, default=0.9, help="hogwild's optim.momentum (Adam's beta1)")
    add("--beta2", type=float, default=0.999, help="hogwild's optim.beta2 (Adam)")
    add("--seed", type=int, default=1, help="the network's initial weights (both sides)")
    add(
        "--quick",
        action="store_true",
        help="smoke run: 1,000 / 1,000 examples, one epoch each, torch on one thread",
    )
    add("--out", help="also write the JSON line here")
    args = parser.parse_args(argv)
    if args.quick:
        args.example_epochs = args.hogwild_epochs = 1
    if min(args.example_epochs, args.hogwild_epochs, args.batch) < 1 or args.workers < 0:
        parser.error("epochs and --batch must be >= 1, --workers >= 0")
    return args


def run_hogwild(args: argparse.Namespace, train_subset: int, test_subset: int) -> dict:
    """hogwild on the example's network; the per-epoch curve and the torch-side accuracy."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import hogwild
    from bench.peers.torch_mnist import load_split
    from hogwild.data.mnist import MnistData, load_mnist

    torch.manual_seed(args.seed)
    module = net()
    mnist = load_mnist(args.data, download=False, progress=False)
    if test_subset:
        mnist = MnistData(
            mnist.train_images,
            mnist.train_labels,
            mnist.test_images[:test_subset],
            mnist.test_labels[:test_subset],
            mnist.source,
        )
    result = hogwild.train(
        hogwild.from_torch(module, (1, 28, 28)),
        data=mnist,
        epochs=args.hogwild_epochs,
        workers=args.workers,
        batch=args.batch,
        lr=args.lr,
        seed=args.seed,
        subset=train_subset,
        progress=False,
        overrides={
            "optim.rule": args.rule,
            "optim.schedule": args.schedule,
            "optim.warmup_epochs": args.warmup_epochs,
            "optim.weight_decay": args.weight_decay,
            "optim.momentum": args.momentum,
            "optim.beta2": args.beta2,
            "optim.smooth": args.smooth,
        },
    )
    epochs, trained, reached = [], 0.0, None
    for record in result.history:
        trained += record["train_s"]
        epochs.append(
            {
                "epoch": record["epoch"] + 1,
                "train_s": trained,
                "test_accuracy": record["test_accuracy"],
            }
        )
        if reached is None and record["test_accuracy"] >= args.target:
            reached = trained
    hogwild.to_torch(result, module)
    images, labels = load_split(args.data, "test")
    if test_subset:
        images, labels = images[:test_subset], labels[:test_subset]
    loader = DataLoader(TensorDataset(torch.from_numpy(images), torch.from_numpy(labels)), 1000)
    return {
        "epochs": epochs,
        "seconds_to_target": reached,
        "examples_per_s": result.metrics["examples_per_s"],
        "workers": result.metrics["workers"],
        "test_accuracy": result.metrics["test_accuracy"],
        "torch_test_accuracy": test_accuracy(module, loader),
    }


def examples_to_target(epochs: list[dict], args: argparse.Namespace, train_subset: int):
    """Training examples seen by the end of the first epoch at the target (None: not reached)."""
    for record in epochs:
        if record["test_accuracy"] >= args.target:
            return record["epoch"] * (train_subset or 60000)
    return None


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    started = time.perf_counter()
    train_subset, test_subset = (1000, 1000) if args.quick else (0, 0)
    if args.quick:
        # a smoke run shares its cores (the suite runs beside it): torch's threads on every core
        # spin at each barrier while another process holds a core, costing the example's epoch
        # far more CPU than one thread does; the record says the threads it ran on
        import torch

        torch.set_num_threads(1)
    with fresh_numba_cache():
        print("drop_in: hogwild on the example's network ...", file=sys.stderr, flush=True)
        ours = run_hogwild(args, train_subset, test_subset)
    print("drop_in: the example's own loop ...", file=sys.stderr, flush=True)
    example = run_example(
        args.data,
        target=args.target,
        max_epochs=args.example_epochs,
        seed=args.seed,
        train_subset=train_subset,
        test_subset=test_subset,
    )
    ratio = None
    if ours["seconds_to_target"] and example["seconds_to_target"]:
        ratio = example["seconds_to_target"] / ours["seconds_to_target"]
    record = {
        "benchmark": "drop_in",
        "target_accuracy": args.target,
        "hogwild_seconds_to_target": ours["seconds_to_target"],
        "example_seconds_to_target": example["seconds_to_target"],
        # the load-independent half of the ratio: training examples seen before the target
        "hogwild_examples_to_target": examples_to_target(ours["epochs"], args, train_subset),
        "example_examples_to_target": examples_to_target(example["epochs"], args, train_subset),
        "ratio": ratio,
        "target_ratio": 2.0,
        "hogwild_examples_per_s": ours["examples_per_s"],
        "example_examples_per_s": example["examples_per_s"],
        "hogwild_test_accuracy": ours["test_accuracy"],
        "hogwild_torch_test_accuracy": ours["torch_test_accuracy"],
        "example_test_accuracy": example["test_accuracy"],
        "hogwild_epochs": ours["epochs"],
        "example_epochs": example["epochs"],
        "settings": {
            "quick": args.quick,
            "train_examples": train_subset or 60000,
            "test_examples": test_subset or 10000,
            "hogwild": {
                "workers": ours["workers"],
                "batch": args.batch,
                "lr": args.lr,
                "rule": args.rule,
                "schedule": args.schedule,
                "smooth": args.smooth,
                "weight_decay": args.weight_decay,
                "warmup_epochs": args.warmup_epochs,
                "momentum": args.momentum,
                "beta2": args.beta2,
                "epochs": args.hogwild_epochs,
            },
            "example": {
                "optimizer": "Adadelta(lr=1.0), StepLR(gamma=0.7)",
                "batch": 64,
                "threads": example["threads"],
                "max_epochs": args.example_epochs,
            },
            "seed": args.seed,
        },
        "machine": describe_machine(),
        "versions": versions(),
    }
    emit_record(stamp(record, __file__, argv, started), args.out)


if __name__ == "__main__":
    main()
