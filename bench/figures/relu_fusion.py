"""The relu fused into the max-pool after it, against the two layers apart, on one core.

:func:`hogwild.model.network.fuse_relu_into_pools` lets each max-pool that follows a relu do the
relu's work (Adam section 3.2.4's fused kernels), which saves one pass forward and one backward
over the unpooled block. This benchmark trains the bundled default job's model with the engine's
kernel (``train_chunk``, one thread pinned to one core, in this process) on real MNIST from two
op tables of the same build: the fused one (what every job runs) and the unfused one
(``fuse=False``, the control), each run from the same initial parameters and kernel seed,
alternating run by run in an order rotated per round, so slow phases of the machine hit both
alike. It prints one JSON line: per batch size the medians of examples/s with their min/max, the
ratio of the medians and the median of each round's ratio; ``--out`` also writes it to a file.

    python bench/figures/relu_fusion.py --out bench/results/fusion.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.support.machine import describe_machine, versions
from bench.support.paths import SHARED_MNIST
from bench.support.record import command_line, emit_record, source


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bench/figures/relu_fusion.py", description=__doc__.split("\n")[0]
    )
    add = parser.add_argument
    add(
        "--data",
        default=str(SHARED_MNIST) if SHARED_MNIST.exists() else None,
        help="MNIST directory (default: ../shared/datasets/mnist, else hogwild's download)",
    )
    add("--examples", type=int, default=3000, help="examples trained per timed run")
    add(
        "--batches",
        type=lambda s: [int(b) for b in s.split(",")],
        default=[1, 32],
        help="batch sizes, comma separated",
    )
    add("--repeats", type=int, default=21, help="rounds; each runs both tables once per batch")
    add("--out", help="also write the JSON line here")
    args = parser.parse_args(argv)
    if args.examples < 1 or args.repeats < 1 or min(args.batches) < 1:
        parser.error("--examples, --repeats and every batch size must be positive")
    return args


class Trainer:
    """One op table's network, its parameters and a training context per batch size."""

    def __init__(self, config, fuse: bool) -> None:
        from hogwild.model.init import initialise
        from hogwild.model.network import build_network

        self.config = config
        self.network = build_network(config.model, fuse=fuse)
        self.initial = np.zeros(self.network.n_params, dtype=np.float32)
        initialise(self.network, self.initial, config.model.init, 1.0, config.train.seed)
        self.params = self.initial.copy()
        self.velocity = np.zeros_like(self.params)

    def rate(self, images, labels, batch: int, update_every: int) -> float:
        """Examples/s of one pass over ``images`` in minibatches of ``batch``, from the initial
        parameters and the job's kernel seed each time: both tables do the same arithmetic on
        the same values (their results are equal bit for bit), only the kernels differ."""
        from hogwild.model.context import TrainingContext
        from hogwild.model.random import seed_kernels
        from hogwild.optim.rules import RULE_CODES

        self.params[:] = self.initial
        self.velocity[:] = 0.0
        seed_kernels(self.config.train.seed)
        optim = self.config.optim
        context = TrainingContext.allocate(self.network, batch, update_every)
        order = np.arange(len(labels), dtype=np.int64)
        started = time.perf_counter()
        context.train_chunk(
            self.network.ops,
            self.params,
            self.velocity,
            images,
            labels,
            order,
            0,
            len(order),
            batch=batch,
            lr=optim.lr,
            mu=0.0,
            wd=optim.weight_decay,
            rule=RULE_CODES["sgd"],
            mean=self.config.data.mean,
            std=self.config.data.std,
            update_every=update_every,
        )
        return len(order) / (time.perf_counter() - started)


def measure(args: argparse.Namespace) -> dict:
    import hogwild
    from bench.peers.cores_private_copies import job_update_every
    from hogwild.data.mnist import load_mnist

    config = hogwild.load_config()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as a worker is pinned
    mnist = load_mnist(args.data, progress=False)
    images = np.ascontiguousarray(mnist.train_images[: args.examples].reshape(-1, 784))
    labels = np.ascontiguousarray(mnist.train_labels[: args.examples])
    trainers = {"fused": Trainer(config, True), "unfused": Trainer(config, False)}
    results = []
    for batch in args.batches:
        as_one_worker = job_update_every(config.override({"train.batch": batch}), 1)
        every = as_one_worker.train.update_every if batch == 1 else 1
        for trainer in trainers.values():  # compile and warm: not timed
            trainer.rate(images[:256], labels[:256], batch, every)
        rates: dict[str, list[float]] = {name: [] for name in trainers}
        for round_ in range(args.repeats):
            names = list(trainers) if round_ % 2 == 0 else list(reversed(trainers))
            for name in names:
                rates[name].append(trainers[name].rate(images, labels, batch, every))
        median = {name: statistics.median(values) for name, values in rates.items()}
        results.append(
            {
                "batch": batch,
                "update_every": every,
                **{f"{name}_examples_per_s": median[name] for name in trainers},
                **{f"{name}_range": [min(v), max(v)] for name, v in rates.items()},
                "fused_over_unfused": median["fused"] / median["unfused"],
                # each round's two runs are neighbours in time: their ratio cancels slow phases
                "fused_over_unfused_per_round": statistics.median(
                    f / u for f, u in zip(rates["fused"], rates["unfused"], strict=True)
                ),
            }
        )
    return {
        "benchmark": "fusion",
        "results": results,
        "settings": {"examples": args.examples, "repeats": args.repeats, "data": str(mnist.source)},
        "machine": describe_machine(),
        "versions": versions(),
        "source": source(),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    record = measure(args)
    record["command"] = command_line(__file__, argv)
    emit_record(record, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
