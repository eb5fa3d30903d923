"""``hogwild bench cores``: Adam's Fig. 8 (throughput against cores) beside PyTorch's Hogwild.

Project Adam (Chilimbi et al., OSDI 2014, section 4.2, Fig. 8) plots model-training throughput
against the number of cores training one shared model. This benchmark trains the bundled Adam
MNIST model (756,000 connections; without the default job's dropout layers, which the peer does
not have) on real MNIST with 1, 2, ... workers, at batch 1 (Adam's
per-example SGD) and batch 32, and sets each figure beside its yardsticks from the same run:

- **ours**: the real engine end to end, :class:`hogwild.training.trainer.Trainer` on ``--examples``
  examples for ``1 + ceil(warmup / examples)`` epochs; the earlier epochs are the warm-up (kernels
  loaded, pages touched) and the figure is the last epoch's training rate (evaluation excluded),
  the copies at their full cadence from the start (``train.cadence_ramp = 0``: the ramp is a
  start effect, over by the first 16,128 examples of each copy).
  A probe samples each worker's private memory (USS) during that epoch: ``worker_private_mb`` is
  its largest value, ``worker_private_growth_mb`` its change over the epoch (0 if the steady state
  allocates nothing per example), ``worker_beyond_runtime_mb`` what exceeds an idle process that
  loaded the same interpreter, numba and kernels (``worker_runtime_mb``).
- **control**: N independent processes, pinned as the workers are, each training a *private*
  copy of the model on its shard with the same kernel (``train_chunk``) and the same fully
  connected update interval as ours with N workers: what N cores of this machine give to work of
  the same kind when nothing is shared. The machine's two virtual cores
  sometimes deliver one core's worth for tens of seconds; ``control_speedup`` says how much
  scaling the machine offered while ours was measured.
- **peer**: PyTorch Hogwild as in pytorch/examples ``mnist_hogwild``
  (:mod:`bench.peers.cores_torch_hogwild`), with the same model, data split and worker counts, and
  its private-model control.
- **peak**: float32 sgemm GFLOP/s of N single-threaded numpy processes
  (:mod:`bench.support.machine`); ``fraction_of_peak`` is 6 x connections FLOPs per trained example
  times ours' examples/s over the peak of as many processes as workers.

``--set KEY=VALUE`` applies a config override to every run (e.g. ``train.parameters=shared``:
Adam's one copy written by every worker, instead of the default store's copy per worker).

Every measurement is repeated ``--repeats`` times, ours, control and peer interleaved (in an
order rotated per repetition) so slow phases of the machine hit all alike; the medians are
reported with their min/max. Worker counts are measured in the order given; with
``--time-budget S`` none after the first is started after S seconds (the first always runs, so
the record has a base), and the record names those left out (for a sweep on a machine lent for a
fixed time: ``bench/figures/adam_fig8_cores_device.sh``). It prints one JSON line; ``--out`` also
writes it to a file and ``--plot`` draws Fig. 8 (:mod:`bench.support.plot_adam_fig8`).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from functools import partial
from pathlib import Path

if not __package__:  # run by path (``python bench/figures/NAME.py``): the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # on sys.path (bench/README.md)

from bench.peers.cores_private_copies import measure_control
from bench.support.machine import (
    MB,
    Gang,
    MemoryProbe,
    describe_machine,
    sgemm_gflops,
    usable_cores,
    versions,
)
from bench.support.paper_job import PAPER_OVERRIDES
from bench.support.paths import SHARED_MNIST
from bench.support.record import emit_record

FLOPS_PER_CONNECTION = 6  # forward 2 (multiply-add), backward 4 (errors and weight gradients)
TEST_EXAMPLES = 500  # the trainer evaluates after every epoch; untimed, so keep it short


def _int_list(text: str) -> list[int]:
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 1,2, got {text!r}")
    return values


def parse_args(argv: list[str] | None, prog: str) -> argparse.Namespace:
    """The benchmark's command line."""
    cores = usable_cores()
    parser = argparse.ArgumentParser(
        prog=prog, description="Adam Fig. 8: training throughput against worker processes."
    )
    add = parser.add_argument
    workers = list(range(1, cores + 1))
    add("--workers", type=_int_list, default=workers, metavar="N,N", help=f"default 1..{cores}")
    add("--batches", type=_int_list, default=[1, 32], metavar="B,B", help="default 1,32")
    add("--examples", type=int, default=10000, metavar="N", help="timed, per run (default 10000)")
    add("--warmup", type=int, default=2000, metavar="N", help="before timing (default 2000)")
    add("--repeats", type=int, default=3, metavar="R", help="medians of R runs (default 3)")
    add("--data", metavar="DIR", help=f"MNIST idx files (default {SHARED_MNIST} if present)")
    add("--seed", type=int, default=1, help="seeds the weights and the data order")
    add(
        "--update-every",
        type=int,
        default=None,
        metavar="K",
        help="batch 1: fully connected updates every K examples (default: the config's)",
    )
    add(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for every run, e.g. train.parameters=shared (repeatable)",
    )
    add(
        "--time-budget",
        type=float,
        default=None,
        metavar="S",
        help="start no worker count after the first once S seconds have passed",
    )
    add(
        "--sgemm-s",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds each sgemm peak measurement multiplies (default 1; a smoke run's 0.1)",
    )
    add("--plot", metavar="FILE", help="draw Fig. 8 into this PNG file")
    add("--out", metavar="FILE", help="also write the JSON line to this file")
    args = parser.parse_args(argv)
    if not 1 <= args.examples <= 60000:
        parser.error("--examples must be between 1 and 60000 (MNIST's training set)")
    if args.update_every is not None and args.update_every < 1:
        parser.error("--update-every must be >= 1")
    if any("=" not in item for item in args.set):
        parser.error("--set takes KEY=VALUE, e.g. train.parameters=shared")
    if args.time_budget is not None and args.time_budget <= 0:
        parser.error("--time-budget must be a positive number of seconds")
    if args.warmup < 0 or args.repeats < 1:
        parser.error("--warmup must be >= 0 and --repeats >= 1")
    if args.sgemm_s <= 0:
        parser.error(f"--sgemm-s must be a positive number of seconds, got {args.sgemm_s}")
    if max(args.workers) > args.examples:
        parser.error("--examples must be at least the largest worker count")
    if args.data is None:
        args.data = str(SHARED_MNIST) if SHARED_MNIST.is_dir() else "mnist"
    return args


# -- ours: the real engine ------------------------------------------------------------------------


def measure_ours(config, data, workers: int, *, batch: int, examples: int, warmup: int) -> dict:
    """Examples per second of the engine's last epoch, and its workers' private memory."""
    from hogwild.training.trainer import Trainer

    warm_epochs = max(1, -(-warmup // examples))
    job = config.override(
        {
            "train.workers": workers,
            "train.batch": batch,
            "train.subset": examples,
            "train.epochs": warm_epochs + 1,
            "optim.schedule": "constant",
            # the steady state's rate: the start's cadence ramp (copies exchanging every few
            # examples for their first 16,128 at most) is a start effect, as the compile is
            "train.cadence_ramp": 0,
            "output.progress": False,
        }
    )
    probes: list[MemoryProbe] = []

    class ProbedTrainer(Trainer):
        """The trainer as it is, with the memory probe running through the timed epoch."""

        def _train_epoch(self, epoch: int) -> dict:
            if epoch != warm_epochs:
                return super()._train_epoch(epoch)
            probes.append(MemoryProbe([process.pid for process in self.gang.processes]))
            probes[0].start()
            try:
                return super()._train_epoch(epoch)
            finally:
                probes[0].stop()

    last_epoch = ProbedTrainer(job, data).run().history[-1]
    return {"examples_per_s": last_epoch["examples_per_s"], **probes[0].report()}


def _runtime_process(config_dict: dict, batch: int, *, ready) -> float:
    """USS (MB) of a process that loaded what a worker loads (numba, kernels), untrained."""
    import psutil

    from hogwild.config import config_from_dict
    from hogwild.model.compile import compile_kernels
    from hogwild.model.network import build_network

    compile_kernels(build_network(config_from_dict(config_dict).model), batch)  # from the cache
    ready()
    return psutil.Process().memory_full_info().uss / MB


# -- the run --------------------------------------------------------------------------------------


def run_measurements(
    args: argparse.Namespace, config, data, order, deadline: float | None = None
) -> tuple[dict, dict, dict]:
    """Every repetition of every measurement, interleaved; samples, memory probes and sgemm.

    Worker counts are measured in the order given; none is started after ``deadline`` (a
    ``time.monotonic()`` value), so a sweep on a lent machine ends with the counts it finished.
    """
    from bench.peers.cores_torch_hogwild import measure_peer, peer_gang
    from hogwild.training.job import shard_bounds
    from hogwild.training.placement import worker_placements

    images, labels, n = data.train_images, data.train_labels, len(data.train_labels)
    samples: dict[tuple, list[float]] = {}
    memory: dict[tuple, list[dict]] = {}
    sgemm: dict[int, list[float]] = {}
    for index, workers in enumerate(args.workers):
        if index and deadline is not None and time.monotonic() > deadline:
            print(
                f"bench cores: --time-budget spent; not measured: {args.workers[index:]}",
                file=sys.stderr,
                flush=True,
            )
            break
        shards = shard_bounds(n, workers)
        cpus = [[p.cpu] for p in worker_placements(workers, config.train.placement)]
        with Gang(workers, cpus, name="bench-control") as control, peer_gang(workers) as peer:
            common = (images, labels, order, shards)
            measures = {
                "ours": partial(measure_ours, config, data, workers, examples=n),
                "control": partial(measure_control, control, config, *common),
                "peer": partial(measure_peer, peer, *common, shared=True, seed=args.seed),
            }
            if workers > 1:  # one process: a private and a shared model are the same
                measures["peer_control"] = partial(
                    measure_peer, peer, *common, shared=False, seed=args.seed
                )
            for rep in range(args.repeats):
                sgemm.setdefault(workers, []).append(
                    sgemm_gflops(workers, seconds=args.sgemm_s)["total"]
                )
                names = list(measures)
                names = names[rep % len(names) :] + names[: rep % len(names)]
                for batch in args.batches:
                    line = []
                    for name in names:
                        answer = measures[name](batch=batch, warmup=args.warmup)
                        rate = answer["examples_per_s"]
                        samples.setdefault((batch, workers, name), []).append(rate)
                        if name == "ours":
                            memory.setdefault((batch, workers), []).append(answer)
                        line.append(f"{name} {rate:,.0f}")
                    print(
                        f"bench cores: repeat {rep + 1}/{args.repeats}, batch {batch}, "
                        f"{workers} worker(s): {', '.join(line)} examples/s",
                        file=sys.stderr,
                        flush=True,
                    )
    for extra in sorted({1, usable_cores()} - set(sgemm)):
        sgemm[extra] = [
            sgemm_gflops(extra, seconds=args.sgemm_s)["total"] for _ in range(args.repeats)
        ]
    return samples, memory, sgemm


def _stats(values: list[float]) -> tuple[float | None, list[float] | None]:
    if not values:
        return None, None
    return statistics.median(values), [min(values), max(values)]


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarise(args, network, samples, memory, peak, runtime_mb: float) -> list[dict]:
    """One row per batch size and worker count: medians, ranges, speedups and ratios."""
    from hogwild.model.context import TrainingContext

    names = ("ours", "control", "peer", "peer_control")
    flops = FLOPS_PER_CONNECTION * network.connections
    rows = []
    for batch in args.batches:
        base = {name: _stats(samples.get((batch, 1, name), []))[0] for name in names}
        context_mb = TrainingContext.allocate(network, batch).nbytes / MB
        for workers in args.workers:
            stats = {name: _stats(samples.get((batch, workers, name), [])) for name in names}
            if workers == 1:
                stats["peer_control"] = stats["peer"]
            ours, peer, control = stats["ours"][0], stats["peer"][0], stats["control"][0]
            speedup, control_speedup = _ratio(ours, base["ours"]), _ratio(control, base["control"])
            probes = memory[(batch, workers)]
            private_mb = max(p["worker_private_mb"] for p in probes)
            rows.append(
                {
                    "batch": batch,
                    "workers": workers,
                    "examples_per_s": ours,
                    "examples_per_s_range": stats["ours"][1],
                    "connections_per_s": ours * network.connections,
                    "speedup": speedup,
                    "peer_examples_per_s": peer,
                    "peer_examples_per_s_range": stats["peer"][1],
                    "ratio_vs_peer": _ratio(ours, peer),
                    "peer_speedup": _ratio(peer, base["peer"]),
                    "fraction_of_peak": ours * flops / (peak[workers] * 1e9),
                    "peak_gflops": peak[workers],
                    "control_examples_per_s": control,
                    "control_examples_per_s_range": stats["control"][1],
                    "control_speedup": control_speedup,
                    "scaling_vs_control": _ratio(speedup, control_speedup),
                    "peer_control_examples_per_s": stats["peer_control"][0],
                    "peer_control_speedup": _ratio(stats["peer_control"][0], base["peer"]),
                    "worker_private_mb": private_mb,
                    "worker_beyond_runtime_mb": private_mb - runtime_mb,
                    "worker_private_growth_mb": max(p["worker_private_growth_mb"] for p in probes),
                    "context_mb": context_mb,
                }
            )
    return rows


def measure(args: argparse.Namespace) -> dict:
    """Run the benchmark and return its JSON record (without the command and wall time)."""
    import hogwild
    from hogwild.data.mnist import MnistData, load_mnist
    from hogwild.model.compile import compile_kernels
    from hogwild.model.network import build_network
    from hogwild.training.job import epoch_permutation

    overrides = dict(item.split("=", 1) for item in args.set)
    overrides["train.seed"] = args.seed
    if args.update_every is not None:
        overrides["train.update_every"] = args.update_every
    # The peer's network (Adam's model without the default job's dropout) on the schedule of the
    # committed figures; --set wins.
    config = hogwild.load_config().override({**PAPER_OVERRIDES, **overrides})
    network = build_network(config.model)
    deadline = None if args.time_budget is None else time.monotonic() + args.time_budget
    mnist = load_mnist(args.data, progress=False)
    n = args.examples
    images, labels = mnist.train_images[:n], mnist.train_labels[:n]
    test = slice(0, TEST_EXAMPLES)
    data = MnistData(images, labels, mnist.test_images[test], mnist.test_labels[test], mnist.source)
    warm_epochs = max(1, -(-args.warmup // n))
    order = epoch_permutation(args.seed, warm_epochs, n)  # ours' timed epoch uses this order
    for batch in args.batches:
        compile_kernels(network, batch)
    with Gang(1, name="bench-runtime") as gang:  # the interpreter's and numba's share of a worker
        runtime_mb = gang.run(_runtime_process, [(config.to_dict(), 1)])[1][0]
    samples, memory, sgemm = run_measurements(args, config, data, order, deadline)
    requested = args.workers
    args.workers = [workers for workers in requested if (args.batches[0], workers) in memory]
    peak = {workers: statistics.median(values) for workers, values in sgemm.items()}
    return {
        "benchmark": "cores",
        "connections": network.connections,
        "flops_per_example": FLOPS_PER_CONNECTION * network.connections,
        "machine": describe_machine(),
        "versions": versions(),
        "sgemm_gflops": {
            "per_core": peak[1],
            "all_cores": peak[usable_cores()],
            "by_processes": {str(k): peak[k] for k in sorted(peak)},
        },
        "settings": {
            **{key: getattr(args, key) for key in ("examples", "warmup", "repeats", "seed")},
            **{"workers": args.workers, "batches": args.batches, "data": str(mnist.source)},
            "ours_warmup_examples": warm_epochs * n,
            "lr": config.optim.lr,
            "update_every": config.train.update_every,
            "parameters": config.train.parameters,
            "overrides": args.set,
            "workers_not_measured": [w for w in requested if w not in args.workers],
            "time_budget_s": args.time_budget,
            "sgemm_s": args.sgemm_s,
            "peer_optimizer": "SGD(lr=0.01, momentum=0.5)",
        },
        "worker_runtime_mb": runtime_mb,
        "results": summarise(args, network, samples, memory, peak, runtime_mb),
    }


def main(
    argv: list[str] | None = None, prog: str = "python bench/figures/adam_fig8_cores.py"
) -> int:
    """Run the benchmark; prints one JSON line and returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv, prog)
    from hogwild.errors import HogwildError

    started = time.perf_counter()
    try:
        record = measure(args)
    except (HogwildError, RuntimeError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # the peer is part of every run
        print(f"{prog}: error: {exc}; the peer needs pip install 'hogwild[peer]'", file=sys.stderr)
        return 2
    record["wall_s"] = time.perf_counter() - started
    record["command"] = shlex.join([*prog.split(), *argv])
    emit_record(record, args.out)
    if args.plot:
        from bench.support.plot_adam_fig8 import plot_cores

        plot_cores(record, args.plot)
    return 0


if __name__ == "__main__":
    from bench.figures.adam_fig8_cores import (
        main as _main,  # spawn children then find the functions by this name
    )

    sys.exit(_main())
