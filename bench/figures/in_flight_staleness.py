"""Examples in flight without partitions: is a partitioned run's divergence the stale weights?

A partitioned replica with ``train.in_flight = N`` (:mod:`hogwild.partition.process`) runs an
example's forward pass on the weights of that moment and its backward pass, and its update, up to
N - 1 other examples' updates later. This script reproduces only that delay, on the whole model
in one process with the engine's kernels (no partitions, no exchange, no processes): example e is
forwarded on the current weights into slot ``e % N``; the example that slot held (forwarded N - 1
updates before) is backpropagated and applied just before. With N = 1 it is per-example SGD, the
unpartitioned job's. If a size and learning rate diverge here with N in flight as they do
partitioned, the cause is the delay (the learning rate too large for it), not the partitioning.

Each run trains one epoch of the first ``--examples`` examples (the paper job's model grown by
``--factors``: ``bench/support/grown_model.py``) and evaluates the first ``--test`` test
images; each record gives ``factor``, ``connections``, ``in_flight``, ``lr``,
``test_accuracy``, ``finite`` (whether every weight stayed finite) and ``learned`` (accuracy at
least ``--learned-floor``).

Run: ``python bench/figures/in_flight_staleness.py --factors 4,16 --in-flight 1,2,4 --lrs
0.003,0.00075 --out bench/results/in_flight_staleness.json`` (``--quick``: a tiny smoke run).
It prints one JSON line.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

import numpy as np

from bench.support.grown_model import grown_overrides
from bench.support.machine import describe_machine, versions
from bench.support.paper_job import PAPER_OVERRIDES
from bench.support.record import emit_record, stamp


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="in_flight_staleness.py", description=__doc__)
    parser.add_argument("--factors", default="4,16", help="feature-map multipliers")
    parser.add_argument("--in-flight", default="1,2,4", help="examples in flight to compare")
    parser.add_argument("--lrs", default="0.003", help="learning rates to compare")
    parser.add_argument("--examples", type=int, default=400, help="training examples (1 epoch)")
    parser.add_argument("--test", type=int, default=1000, help="test images evaluated")
    parser.add_argument("--learned-floor", type=float, default=0.5, help="accuracy that learned")
    parser.add_argument("--data", default=None, help="MNIST idx directory (default: the usual)")
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run")
    parser.add_argument("--out", help="write the JSON line here too")
    args = parser.parse_args(argv)
    if args.quick:
        args.factors, args.in_flight, args.examples, args.test = "1", "1,4", 100, 200
    args.factors = [int(f) for f in args.factors.split(",") if f]
    args.in_flight = [int(n) for n in args.in_flight.split(",") if n]
    args.lrs = [float(lr) for lr in args.lrs.split(",") if lr]
    if min(args.factors, default=0) < 1 or min(args.in_flight, default=0) < 1 or not args.lrs:
        parser.error("--factors and --in-flight must list positive integers, --lrs rates")
    return args


def train_with_delay(mnist, factor: int, in_flight: int, lr: float, args) -> dict:
    """One epoch with ``in_flight`` examples in flight on the whole model; its record."""
    from hogwild.config import load_config
    from hogwild.model.layer_kernels import argmax
    from hogwild.model.network import COL_OUT, build_network
    from hogwild.model.passes import FC_ACCUMULATE, backward_batch, forward_batch, load_example
    from hogwild.model.update import apply_update
    from hogwild.optim.rules import RULE_CODES
    from hogwild.training.job import epoch_permutation, subset_indices
    from hogwild.training.resume import starting_point

    overrides = {
        **PAPER_OVERRIDES,
        **grown_overrides(factor),
        "optim.lr": lr,
    }
    config = load_config(None, overrides)
    network = build_network(config.model, 10)
    params, velocity, _, _ = starting_point(config, network, 10, False, lambda _: None)
    images = mnist.train_images.reshape(len(mnist.train_images), -1)
    chosen = subset_indices(config.train.seed, len(images), args.examples)
    images, labels = images[chosen], mnist.train_labels[chosen]
    order = epoch_permutation(config.train.seed, 0, len(images))
    size, n = network.act_size, in_flight
    act, dact = np.zeros((n, size), np.float32), np.zeros((n, size), np.float32)
    aux = np.zeros((n, size), np.int32)
    scratch = np.zeros(network.scratch_size, np.float32)
    grad, target = np.zeros_like(params), np.zeros(1, np.int64)
    slot_label = [0] * n
    rule, wd = RULE_CODES[config.optim.rule], config.optim.weight_decay
    ops = network.ops

    def backward_and_update(s: int) -> None:
        target[0] = slot_label[s]
        backward_batch(
            ops, params, act[s : s + 1], dact[s : s + 1], aux[s : s + 1], scratch, grad,
            target, 1, FC_ACCUMULATE, 0.0, 1.0,
        )  # fmt: skip
        apply_update(ops, params, velocity, grad, lr, 1.0, 0.0, wd, rule, True)

    for e, index in enumerate(order):
        s = e % n
        if e >= n:  # the slot's previous example, forwarded n - 1 updates ago
            backward_and_update(s)
        load_example(images[index], act[s], config.data.mean, config.data.std)
        slot_label[s] = int(labels[index])
        forward_batch(ops, params, act[s : s + 1], aux[s : s + 1], scratch, 1, True)
    for e in range(len(order), len(order) + min(n, len(order))):
        backward_and_update(e % n)

    test_images = mnist.test_images.reshape(len(mnist.test_images), -1)[: args.test]
    out, correct = int(ops[-1, COL_OUT]), 0
    row, row_aux = np.zeros((1, size), np.float32), np.zeros((1, size), np.int32)
    for image, label in zip(test_images, mnist.test_labels[: args.test], strict=True):
        load_example(image, row[0], config.data.mean, config.data.std)
        forward_batch(ops, params, row, row_aux, scratch, 1, False)
        correct += int(argmax(row[0], out, 10) == label)
    accuracy = correct / len(test_images)
    return {
        "factor": factor,
        "connections": network.connections,
        "in_flight": in_flight,
        "lr": lr,
        "test_accuracy": accuracy,
        "finite": bool(np.isfinite(params).all()),
        "learned": accuracy >= args.learned_floor,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    started = time.perf_counter()
    from hogwild.data.mnist import default_data_dir, load_mnist

    mnist = load_mnist(args.data or default_data_dir())
    runs = []
    for factor in args.factors:
        for lr in args.lrs:
            for n in args.in_flight:
                found = train_with_delay(mnist, factor, n, lr, args)
                runs.append(found)
                print(
                    f"x{factor} lr {lr:g} in flight {n}: accuracy {found['test_accuracy']:.3f}"
                    f"{'' if found['finite'] else ' (weights not finite)'}",
                    file=sys.stderr,
                    flush=True,
                )
    record = {
        "benchmark": "in_flight_staleness",
        "results": runs,
        "settings": {
            "factors": args.factors,
            "in_flight": args.in_flight,
            "lrs": args.lrs,
            "examples": args.examples,
            "test": args.test,
            "learned_floor": args.learned_floor,
            "quick": args.quick,
        },
        "machine": describe_machine(),
        "versions": versions(),
    }
    emit_record(stamp(record, __file__, argv, started), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
