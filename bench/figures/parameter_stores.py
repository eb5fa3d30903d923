"""The parameter stores side by side: Adam's one shared copy against copies (per worker or node).

Trains the bundled Adam MNIST model with the real engine (:class:`hogwild.training.trainer.Trainer`)
with ``train.parameters = "replicate"`` and ``"shared"``, alternately, ``--pairs`` times (the
order swapped every pair), on ``--examples`` real MNIST examples for two epochs with a constant
learning rate, and takes each run's second-epoch training rate, the seconds its compute loops
waited for the store, and its accuracy on 2,000 test examples. The copies exchange at their
full cadence from the first example (``train.cadence_ramp = 0``): the start's ramp is a start
effect this benchmark's two epochs would otherwise measure part of.

``--replicas worker`` (the default) gives every worker its own copy on the machine as it is.
``--replicas node`` makes one copy per NUMA node; on a machine with fewer nodes than
``--workers`` (this one has one) the plan then comes from a sysfs tree that puts each of the
first ``--workers`` usable CPUs on a node of its own (``$HOGWILD_SYSFS``), so the exchange scheme
runs as it would on a multi-node machine, with the pages on the one real node. Beside the rates
it times one exchange of the model's parameters (:func:`hogwild.store.kernels.exchange_ranges`)
and gives its share of a replica's training between two exchanges.

Run: ``python bench/figures/parameter_stores.py [--examples 20000] [--pairs 5] [--out FILE]``; it
prints one JSON line: per mode the median, min and max examples/s and accuracy, the median of the
per-pair ratios replicate/shared, and the exchange cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.support.machine import describe_machine, usable_cores, versions
from bench.support.paper_job import PAPER_OVERRIDES
from bench.support.paths import SHARED_MNIST

MODES = ("replicate", "shared")
TEST_EXAMPLES = 2000


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bench/figures/parameter_stores.py", description=__doc__
    )
    add = parser.add_argument
    add("--examples", type=int, default=20000, metavar="N", help="training examples per epoch")
    add("--pairs", type=int, default=5, metavar="P", help="runs of each mode (default 5)")
    add("--workers", type=int, default=2, metavar="N", help="workers (default 2)")
    add("--replicas", choices=("worker", "node"), default="worker", help="a copy per ...")
    add("--n-push", type=int, default=None, metavar="K", help="default: the config's")
    add("--n-fetch", type=int, default=None, metavar="K", help="default: the config's")
    add("--fc-push", choices=("auto", "deltas", "vectors"), default=None, help="replicate")
    add("--data", metavar="DIR", help=f"MNIST idx files (default {SHARED_MNIST} if present)")
    add("--out", metavar="FILE", help="also write the JSON line to this file")
    args = parser.parse_args(argv)
    if not 1 <= args.examples <= 60000 or args.pairs < 1:
        parser.error("--examples must be in 1..60000 and --pairs >= 1")
    if not 2 <= args.workers <= usable_cores():
        parser.error(f"--workers must be in 2..{usable_cores()} (the usable CPUs)")
    args.data = args.data or (str(SHARED_MNIST) if SHARED_MNIST.is_dir() else "mnist")
    return args


def node_per_worker_topology(workers: int, root: Path) -> str | None:
    """A sysfs tree with one node per worker, or None when the real machine has enough nodes."""
    from hogwild.numa.topology import read_topology

    if read_topology().n_nodes >= workers:
        return None
    cpus = sorted(os.sched_getaffinity(0))[:workers]
    for node, cpu in enumerate(cpus):
        topology = root / "devices/system/cpu" / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "core_id").write_text(f"{cpu}\n")
        (topology / "physical_package_id").write_text("0\n")
        node_dir = root / "devices/system/node" / f"node{node}"
        node_dir.mkdir(parents=True)
        (node_dir / "cpulist").write_text(f"{cpu}\n")
    (root / "devices/system/cpu/online").write_text(",".join(map(str, cpus)) + "\n")
    return str(root)


def train_once(config, data) -> dict:
    """The second epoch's examples/s and the final test accuracy of one job."""
    from hogwild.training.trainer import Trainer

    result = Trainer(config, data).run()
    return {
        "examples_per_s": result.history[-1]["examples_per_s"],
        "store_wait_s": result.history[-1]["store_wait_s"],
        "test_accuracy": result.metrics["test_accuracy"],
    }


def run_pairs(args, base, data, samples: dict[str, list[dict]]) -> None:
    """Train both modes alternately, ``args.pairs`` times, appending to ``samples``."""
    for pair in range(args.pairs):
        order = MODES if pair % 2 == 0 else MODES[::-1]
        for mode in order:
            answer = train_once(base[mode], data)
            samples[mode].append(answer)
            print(
                f"bench parameters: pair {pair + 1}/{args.pairs}, {mode}: "
                f"{answer['examples_per_s']:,.0f} examples/s, "
                f"accuracy {answer['test_accuracy'] * 100:.2f} %",
                file=sys.stderr,
                flush=True,
            )


def exchange_seconds(n_params: int, repeats: int = 200) -> float:
    """Median seconds of one exchange between a copy and the home copy of ``n_params`` floats."""
    from hogwild.store.kernels import exchange_ranges

    rng = np.random.default_rng(0)
    home = rng.standard_normal(n_params).astype(np.float32)
    copy, base = home.copy(), home.copy()
    everything = np.array([[0, n_params]], dtype=np.int64)
    exchange_ranges(home, copy, base, everything)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        exchange_ranges(home, copy, base, everything)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(args: argparse.Namespace) -> dict:
    import hogwild
    from hogwild.data.mnist import MnistData, load_mnist
    from hogwild.model.network import build_network
    from hogwild.store.registry import cadences
    from hogwild.training.placement import SYSFS_ENV

    mnist = load_mnist(args.data, progress=False)
    n = args.examples
    data = MnistData(
        mnist.train_images[:n],
        mnist.train_labels[:n],
        mnist.test_images[:TEST_EXAMPLES],
        mnist.test_labels[:TEST_EXAMPLES],
        mnist.source,
    )
    common = {
        "train.workers": args.workers,
        "train.epochs": 2,
        "optim.schedule": "constant",
        "output.progress": False,
    }
    # the steady state's exchanges: no start's ramp (a start effect, like the first epoch's compile)
    copies = {"train.parameters": "replicate", "train.replicas": args.replicas,
              "train.cadence_ramp": 0}  # fmt: skip
    for key in ("n_push", "n_fetch", "fc_push"):
        if getattr(args, key) is not None:
            copies[f"train.{key}"] = getattr(args, key)
    config = hogwild.load_config().override({**PAPER_OVERRIDES, **common})  # the figures' job
    base = {
        "replicate": config.override(copies),
        "shared": config.override({"train.parameters": "shared"}),
    }
    samples: dict[str, list[dict]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="hogwild-bench-sysfs-") as tmp:
        tree = None
        if args.replicas == "node":
            tree = node_per_worker_topology(args.workers, Path(tmp))
        if tree:
            os.environ[SYSFS_ENV] = tree
        try:
            run_pairs(args, base, data, samples)
        finally:
            os.environ.pop(SYSFS_ENV, None)
    rates = {m: [s["examples_per_s"] for s in samples[m]] for m in MODES}
    ratios = [r / i for r, i in zip(rates["replicate"], rates["shared"], strict=True)]
    replicate = base["replicate"].train
    n_push, n_fetch = cadences(base["replicate"])  # 0: the store's own
    n_params = build_network(base["replicate"].model).n_params
    seconds = exchange_seconds(n_params)
    every = min(n_push, n_fetch)
    per_worker_rate = statistics.median(rates["replicate"]) / args.workers
    return {
        "benchmark": "parameters",
        "machine": describe_machine(),
        "versions": versions(),
        "settings": {
            "examples": n,
            "pairs": args.pairs,
            "workers": args.workers,
            "n_push": n_push,
            "n_fetch": n_fetch,
            "fc_push": replicate.fc_push,
            "replicas": args.replicas,
            "topology": "one node per worker (sysfs tree)" if tree else "the machine's own",
            "test_examples": TEST_EXAMPLES,
        },
        "results": {
            mode: {
                "examples_per_s": statistics.median(rates[mode]),
                "examples_per_s_min": min(rates[mode]),
                "examples_per_s_max": max(rates[mode]),
                "test_accuracy": statistics.median(s["test_accuracy"] for s in samples[mode]),
                "store_wait_s": statistics.median(s["store_wait_s"] for s in samples[mode]),
                "samples": samples[mode],
            }
            for mode in MODES
        },
        "replicate_over_shared": statistics.median(ratios),
        "exchange_ms": seconds * 1e3,
        "exchange_share": seconds / (every / per_worker_rate),
        "parameters": n_params,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    record = measure(args)
    line = json.dumps(record)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
