"""What each ``hogwild`` command does, once its command line parsed: train a job (in worker
processes, or partitioned), run a cluster job or one of its roles, evaluate a checkpoint, show a
config, plot runs, print the machine and a job's plan, list or sweep shared memory, run a
benchmark script of the source tree, and run this host's partitions of a partitioned replica.

Each is a function of the parsed arguments (and the ``--section.key=value`` overrides) that returns
the exit status; :mod:`hogwild.cli` dispatches to them and turns their errors into one line and a
status. :data:`program` says whether hogwild is this process's program (``hogwild`` run, not a
script calling :func:`hogwild.cli.main`): only then do ``train`` and a cluster replica fork their
workers' forkserver from themselves.

``hogwild bench NAME ...`` runs the figure script ``bench/figures/<BENCHMARK_SCRIPTS[NAME]>.py`` of
the source tree (the benchmarks are scripts beside the package, not part of it), forwarding the
remaining arguments to its ``main``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hogwild.errors import HogwildError

if TYPE_CHECKING:
    from hogwild.config import Config

BENCHMARK_SCRIPTS = {"cores": "adam_fig8_cores"}  # a benchmark's name -> its bench/figures/ file
program = False  # whether hogwild is this process's program (hogwild.cli.run), not a script


def resolve_job(args: argparse.Namespace, overrides: dict[str, str], command: str) -> Config:
    """The job: ``--config`` (or the bundled job), then the flags, then the overrides."""
    from hogwild.cli_flags import apply_flags, flag_overrides
    from hogwild.config import load_config

    flags = flag_overrides(args, command)
    if getattr(args, "no_progress", None):
        flags["output.progress"] = ("--no-progress", False)
    if command == "train" and "ps.servers" in flags and "train.parameters" not in overrides:
        flags["train.parameters"] = (flags["ps.servers"][0], "ps")
    return apply_flags(load_config(args.config), flags, overrides)


def train_command(args: argparse.Namespace, overrides: dict[str, str]) -> int:
    """``hogwild train``: one job (in worker processes, or partitioned); prints its summary."""
    from hogwild.training.api import train

    _configure_logging(args)
    config = resolve_job(args, overrides, "train")
    partitioned = config.model.partitions > 1
    if partitioned and (args.model or args.target or args.loss != "cross_entropy"):
        raise HogwildError("--partitions K > 1 trains the job's own model on MNIST idx data")
    if not partitioned and args.loss != "cross_entropy" and not args.model:
        raise HogwildError("--loss goes with --model (a job's own model sets its last layer)")
    if config.train.start_method == "forkserver" and not args.model and program:
        # the workers' (or the partitions') forkserver forked from here, before any thread (a
        # --model's PyTorch starts its own): no second interpreter importing numba
        # (zygote.fork_server). Only where hogwild is the program: a script calling main()
        # would have its whole process (its threads' locks, a GPU's state) copied into the server.
        from hogwild.training.zygote import import_and_fork_server

        # else (it logs why) the gang starts one afresh
        import_and_fork_server(f"pid {os.getpid()}, hogwild train")
    if partitioned:
        from hogwild.partition.runtime import train_partitioned

        result = train_partitioned(
            config, args.data, resume=bool(args.resume), overwrite=bool(args.overwrite)
        )
    else:
        job, data, test_data, target = None, args.data, None, args.target
        if args.model:
            from hogwild.data.tables import is_table, read_table
            from hogwild.training.api import TEST_FRACTION
            from hogwild.training.torch_bridge import from_torch, load_module

            shape = config.model.input
            if is_table(data):  # a tabular model: its input is the file's features
                data, test_data = read_table(data, target, TEST_FRACTION, config.train.seed)
                features, target = data[0].shape[1:], None
                if math.prod(shape) != math.prod(features):  # not a --model.input of its own
                    shape = features
            module = load_module(args.model)
            job, config = config, from_torch(module, shape, loss=args.loss)
        result = train(
            config,
            data,
            test_data=test_data,
            job=job,
            target=target,
            resume=bool(args.resume),
            overwrite=bool(args.overwrite),
        )
    metrics = result.metrics
    summary = {k: metrics[k] for k in ("test_accuracy", "examples_per_s", "wall_s", "epochs")}
    print(json.dumps(summary))
    return 0


def _configure_logging(args) -> None:
    from hogwild.logs import configure_logging

    configure_logging(getattr(args, "log_level", None) or "info")


def cluster_command(args: argparse.Namespace, overrides: dict[str, str]) -> int:
    """``hogwild cluster``: a cluster job, one of its roles (``replica``, ``member``), or
    ``status``."""
    if args.cluster_command == "replica":
        from hogwild.cluster.replica import run_replica

        args.overrides = overrides
        # a role started as a fresh interpreter (the Ray launcher's, a spawned local one) forks
        # its workers' forkserver from itself, as a role forked from the role server does; only
        # where hogwild is the program (see the same test in train_command)
        args.fork_workers_server = program
        return run_replica(args)
    if args.cluster_command == "member":
        from hogwild.cluster.replica import run_member

        args.overrides = overrides
        return run_member(args)
    if args.cluster_command == "status":
        from hogwild.cluster.status import print_status

        return print_status(args.target, as_json=args.json, job=args.job, keys=args.keys)
    from hogwild.cluster.driver import ClusterDriver
    from hogwild.data.plan import load_data, with_source

    _configure_logging(args)
    config = resolve_job(args, overrides, "cluster")
    data = load_data(config, args.data)
    config = with_source(config, data)
    driver = ClusterDriver(config, data, resume=bool(args.resume), overwrite=bool(args.overwrite))
    final = driver.run()
    print(json.dumps({k: v for k, v in final.items() if k not in ("event", "config")}))
    return 0


def config_show_command(args: argparse.Namespace, overrides: dict[str, str]) -> int:
    """``hogwild config show``: the resolved job as TOML."""
    from hogwild.cli_flags import apply_flags
    from hogwild.config import load_config
    from hogwild.config.toml_text import config_to_toml

    config = apply_flags(load_config(args.config), {}, overrides)
    print(config_to_toml(config), end="")
    return 0


def plot_command(args: argparse.Namespace) -> int:
    """``hogwild plot``: runs' loss and accuracy drawn into one image."""
    from hogwild.training.curves import plot_runs

    written = plot_runs(args.runs, args.out)
    print(f"wrote {written}")
    return 0


def eval_command(args: argparse.Namespace) -> int:
    """``hogwild eval``: a checkpoint evaluated on a test set."""
    from hogwild.signals import interrupts_not_lost
    from hogwild.training.api import evaluate

    with interrupts_not_lost():  # the prediction kernels load here, through numba's callbacks
        result = evaluate(args.checkpoint, args.data, target=args.target)
    if args.json:
        print(json.dumps(result))
    elif result["test_accuracy"] is None:  # a regression
        print(
            f"{result['checkpoint']} (epoch {result['epoch'] + 1}): test mse "
            f"{result['test_mse']:.6g}, test mae {result['test_mae']:.6g} "
            f"on {result['examples']:,} examples"
        )
    else:
        print(
            f"{result['checkpoint']} (epoch {result['epoch'] + 1}): test accuracy "
            f"{result['test_accuracy'] * 100:.2f}%, test loss {result['test_loss']:.4f} "
            f"on {result['examples']:,} examples"
        )
    return 0


def info_command(args: argparse.Namespace, overrides: dict[str, str]) -> int:
    """``hogwild info``: the machine, the placement a job would use, its partition plan."""
    from hogwild.config import load_config
    from hogwild.model.network import model_network
    from hogwild.numa.placement import default_worker_count, plan_workers
    from hogwild.numa.report import format_machine_report
    from hogwild.store.registry import store_class
    from hogwild.training.placement import machine_topology

    if args.partitions is not None:
        overrides = {**overrides, "model.partitions": args.partitions}
    config = load_config(args.config, overrides)
    train = config.train
    topology = machine_topology()
    workers = 1 if train.sync else train.workers or default_worker_count(topology)
    plan = plan_workers(topology, workers, policy=train.placement)
    store = store_class(train.parameters)(config, model_network(config.model), plan)
    report = format_machine_report(
        topology, plan, getattr(store, "plan", None), policy=train.placement
    )
    print(report + f"\nParameter store {train.parameters!r}: {store.summary()}")
    if config.model.partitions > 1:
        from hogwild.numa.caches import read_caches
        from hogwild.partition.plan import plan_partitions

        plan = plan_partitions(model_network(config.model), config.model.partitions)
        print(plan.describe(read_caches()))
        if config.model.partition_hosts:
            from hogwild.partition.hosts import HostGroups

            groups = HostGroups.from_hosts(config.model.partition_hosts, plan.k)
            if groups.n_groups > 1:
                print(groups.describe(plan))
    return 0


def shm_command(args: argparse.Namespace) -> int:
    """``hogwild shm ls|gc``: hogwild's shared-memory segments, listed or swept."""
    from hogwild.shm.sweeper import format_segments, list_segments, sweep

    if args.shm_command == "ls":
        print(format_segments(list_segments()))
        return 0
    removed = sweep(dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    print(f"{verb} {len(removed)} segment(s)" + "".join(f"\n  {name}" for name in removed))
    return 0


def bench_dir() -> Path:
    """The ``bench/`` folder of the source tree hogwild was installed from (editable)."""
    import hogwild

    return Path(hogwild.__file__).resolve().parents[1] / "bench"


def bench_command(name: str, argv: list[str]) -> int:
    """``hogwild bench NAME ARGS``: the source tree's figure script for NAME, given ARGS."""
    folder, script = bench_dir(), BENCHMARK_SCRIPTS[name]
    path = folder / "figures" / f"{script}.py"
    if not path.is_file():
        raise HogwildError(
            f"hogwild bench {name} needs the source tree: {path} not found "
            "(hogwild was installed without it; clone the repository and pip install -e .)"
        )
    if str(folder.parent) not in sys.path:
        sys.path.insert(0, str(folder.parent))  # spawned children inherit it
    module = importlib.import_module(f"bench.figures.{script}")
    return module.main(argv, prog=f"hogwild bench {name}")


def partition_host_command(args: argparse.Namespace) -> int:
    """``hogwild partition-host``: this host's partitions of a partitioned replica."""
    from hogwild.partition.follower import run_cli

    return run_cli(args)
