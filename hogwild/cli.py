"""The ``hogwild`` command line: ``train``, ``eval``, ``data``, ``info``, ``shm`` and ``bench``.

Every failure a user can cause is a :class:`~hogwild.errors.HogwildError`; the CLI prints its
message on one line and exits with status 2 (1 for a worker that died, 130 for Ctrl-C), never a
traceback. Any config key can be set as ``--section.key=value`` after the named flags.

``hogwild data ingest|preview|info|verify`` builds and inspects LMDB image caches
(:mod:`hogwild.data.cli_data`); ``train --data CACHE`` trains from one.

``hogwild bench NAME ...`` runs the figure script ``bench/figures/<BENCHMARKS[NAME]>.py`` of the
source tree (the benchmarks are scripts beside the package, not part of it), forwarding the
remaining arguments to its ``main``.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import re
import signal
import sys
from pathlib import Path

from hogwild.errors import HogwildError, Terminated, WorkerDiedError

INTERRUPTED = "hogwild: interrupted; workers stopped and shared memory removed"  # on Ctrl-C

_OVERRIDE = re.compile(r"^--([a-z_]+(?:\.[a-z_0-9]+)+)=(.*)$")
PLUGIN_COMMANDS = "hogwild.commands"
BENCHMARKS = {"cores": "Adam Fig. 8: training throughput against cores, beside PyTorch Hogwild"}
BENCHMARK_SCRIPTS = {"cores": "adam_fig8_cores"}  # a benchmark's name -> its bench/figures/ file


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hogwild",
        description="Project Adam's lock-free multi-process training engine for CPUs.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser(
        "train",
        help="train a model",
        description="Train a model with lock-free worker processes on shared weights. "
        "Any config key can be set as --section.key=value (e.g. --optim.momentum=0.5).",
    )
    train.add_argument("--config", help="job config (TOML); default: Adam's MNIST model")
    train.add_argument(
        "--data",
        help="an LMDB image cache (hogwild data ingest), a directory of MNIST idx files, "
        "or 'mnist' (default: data.source of the config)",
    )
    train.add_argument("--workers", type=int, help="worker processes (default: physical cores)")
    train.add_argument(
        "--partitions", type=int, help="split one replica's layers over K processes (Adam 3.2)"
    )
    train.add_argument("--epochs", type=int, help="passes over the training set")
    train.add_argument("--batch", type=int, help="examples per update (default 1)")
    train.add_argument("--lr", type=float, help="learning rate")
    train.add_argument("--sync", action="store_true", default=None, help="one worker, synchronous")
    train.add_argument(
        "--epoch-fraction",
        type=float,
        help="end an epoch once this fraction of workers finished their shard (Adam: 0.75)",
    )
    train.add_argument("--seed", type=int, help="random seed")
    train.add_argument("--subset", type=int, help="train on the first N examples only")
    train.add_argument("--checkpoint-dir", help="write a checkpoint here at every epoch end")
    train.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    train.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the checkpoints already in --checkpoint-dir (another run's)",
    )
    train.add_argument("--metrics", help="write JSON-lines metrics to this file")
    train.add_argument(
        "--ps",
        metavar="HOST:PORT[,...]",
        help="train through running parameter servers (sets ps.servers and, unless given, "
        "train.parameters=ps)",
    )
    train.add_argument("--no-progress", action="store_true", help="no progress output")

    evaluate = sub.add_parser("eval", help="evaluate a checkpoint on the test set")
    evaluate.add_argument("checkpoint", help="checkpoint directory, .json or .safetensors file")
    evaluate.add_argument(
        "--data", help="an LMDB image cache, a directory of MNIST idx files, or 'mnist'"
    )
    evaluate.add_argument("--json", action="store_true", help="print one JSON line")

    from hogwild.data.cli_data import add_data_commands

    add_data_commands(sub)
    info = sub.add_parser(
        "info",
        help="the machine's topology and the placement plan a job would use",
        description="The machine's NUMA topology and where a job's workers and shared "
        "parameters would go. Takes a job's --config and --section.key=value overrides "
        "(train.workers, train.placement, train.parameters, train.replicas).",
    )
    info.add_argument("--config", help="job config (TOML); default: Adam's MNIST model")
    info.add_argument(
        "--partitions", type=int, help="print the plan of a replica split over K partitions"
    )

    shm = sub.add_parser("shm", help="list or remove hogwild shared-memory segments")
    shm_sub = shm.add_subparsers(dest="shm_command", required=True)
    shm_sub.add_parser("ls", help="list segments with their owner and size")
    gc = shm_sub.add_parser("gc", help="remove segments whose owner process is dead")
    gc.add_argument("--dry-run", action="store_true", help="only say what would be removed")

    bench = sub.add_parser(
        "bench",
        help="run a benchmark (needs the source tree)",
        description="Run a benchmark script of bench/; each prints one JSON line. "
        "Arguments after the benchmark's name go to it (see hogwild bench NAME --help).",
    )
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    for name, text in BENCHMARKS.items():
        bench_sub.add_parser(name, help=text, add_help=False)
    _add_cluster_command(sub)
    _add_plugin_commands(sub)
    return parser


def _add_cluster_command(sub) -> None:
    cluster = sub.add_parser(
        "cluster",
        help="train with data servers, model replicas and parameter servers (Adam's system)",
        description="Start a job's parameter servers, data servers and model replicas (on this "
        "host, or a Ray cluster), train (Downpour across replicas), stop them all. Any config "
        "key can be set as --section.key=value; the roles are [cluster] in the job config.",
    )
    cluster.add_argument("--config", help="job config (TOML); default: Adam's MNIST model")
    cluster.add_argument("--data", help="an LMDB image cache, a directory of MNIST idx files")
    cluster.add_argument("--epochs", type=int, help="passes over the training set")
    cluster.add_argument("--replicas", type=int, help="model replicas (cluster.replicas)")
    cluster.add_argument("--workers-per-replica", type=int, help="worker processes per replica")
    cluster.add_argument("--ps", type=int, help="parameter servers (cluster.ps)")
    cluster.add_argument("--data-servers", type=int, help="data servers (cluster.data_servers)")
    cluster.add_argument("--launcher", help="local (this host, the default) or ray")
    cluster.add_argument("--ray-address", help="the Ray cluster to join (launcher ray)")
    cluster.add_argument("--checkpoint-dir", help="checkpoints (and the job's run directory)")
    cluster.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    cluster.add_argument("--overwrite", action="store_true", help="replace the checkpoints there")
    cluster.add_argument("--metrics", help="write JSON-lines metrics to this file")
    cluster.add_argument("--no-progress", action="store_true", help="no progress output")
    cluster.set_defaults(overrides_ok=True)
    actions = cluster.add_subparsers(dest="cluster_command")
    status = actions.add_parser("status", help="the status table of a running job")
    status.add_argument("target", help="the job's run directory (--checkpoint-dir) or HOST:PORT")
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    replica = actions.add_parser("replica", help="(started by a launcher) one model replica")
    replica.add_argument("--index", type=int, required=True)
    replica.add_argument("--bind", default="127.0.0.1")
    replica.add_argument("--keys", default=None)


def _add_plugin_commands(sub) -> None:
    """Subcommands registered by plugins (entry-point group ``hogwild.commands``).

    Each entry point is a ``register(subparsers)`` that adds its parser and sets the default
    ``run`` to a function of the parsed arguments returning the exit status. A plugin that cannot
    be imported costs its own command only: it is listed with the reason.
    """
    from hogwild.entry_points import PluginMissing, load, names

    for name in names(PLUGIN_COMMANDS):
        try:
            register = load(PLUGIN_COMMANDS, name)
        except PluginMissing as exc:
            broken = sub.add_parser(name, help=f"unavailable: {exc}")
            broken.set_defaults(run=_unavailable(name, exc))
            continue
        register(sub)


def _unavailable(name: str, exc: Exception):
    def run(args) -> int:
        raise HogwildError(f"hogwild {name} is unavailable: {exc}")  # says what to install

    return run


def _split_overrides(extra: list[str], parser: argparse.ArgumentParser) -> dict[str, str]:
    overrides = {}
    for arg in extra:
        match = _OVERRIDE.match(arg)
        if not match:
            parser.error(f"unrecognized argument {arg!r} (config keys are --section.key=value)")
        overrides[match.group(1)] = match.group(2)
    return overrides


def _train(args, overrides: dict[str, str]) -> int:
    from hogwild.training.api import resolve_config, train

    if args.ps:
        overrides = {"train.parameters": "ps", **overrides, "ps.servers": args.ps}
    if args.partitions is not None:
        overrides = {**overrides, "model.partitions": args.partitions}
    if resolve_config(args.config, overrides).model.partitions > 1:
        from hogwild.partition.runtime import train_partitioned

        train = train_partitioned  # same arguments: one replica in K partition processes
    result = train(
        args.config,
        args.data,
        resume=args.resume,
        overwrite=args.overwrite,
        overrides=overrides,
        workers=args.workers,
        epochs=args.epochs,
        batch=args.batch,
        lr=args.lr,
        sync=args.sync,
        epoch_fraction=args.epoch_fraction,
        seed=args.seed,
        subset=args.subset,
        checkpoint_dir=args.checkpoint_dir,
        metrics=args.metrics,
        progress=False if args.no_progress else None,
    )
    metrics = result.metrics
    summary = {k: metrics[k] for k in ("test_accuracy", "examples_per_s", "wall_s", "epochs")}
    print(json.dumps(summary))
    return 0


def _cluster(args, overrides: dict[str, str]) -> int:
    if args.cluster_command == "replica":
        from hogwild.cluster.replica import run_replica

        args.overrides = overrides
        return run_replica(args)
    if args.cluster_command == "status":
        from hogwild.cluster.status import print_status

        return print_status(args.target, as_json=args.json)
    from hogwild.cluster.driver import ClusterDriver
    from hogwild.data.plan import load_data
    from hogwild.training.api import resolve_config, with_source

    flags = {
        "cluster.replicas": args.replicas,
        "cluster.workers_per_replica": args.workers_per_replica,
        "cluster.ps": args.ps,
        "cluster.data_servers": args.data_servers,
        "cluster.launcher": args.launcher,
        "cluster.ray_address": args.ray_address,
    }
    config = resolve_config(
        args.config,
        {**{k: v for k, v in flags.items() if v is not None}, **overrides},
        epochs=args.epochs,
        checkpoint_dir=args.checkpoint_dir,
        metrics=args.metrics,
        progress=False if args.no_progress else None,
    )
    data = load_data(config, args.data)
    config = with_source(config, data)
    driver = ClusterDriver(config, data, resume=args.resume, overwrite=args.overwrite)
    final = driver.run()
    print(json.dumps({k: v for k, v in final.items() if k not in ("event", "config")}))
    return 0


def _eval(args) -> int:
    from hogwild.signals import interrupts_not_lost
    from hogwild.training.api import evaluate

    with interrupts_not_lost():  # the prediction kernels load here, through numba's callbacks
        result = evaluate(args.checkpoint, args.data)
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{result['checkpoint']} (epoch {result['epoch'] + 1}): test accuracy "
            f"{result['test_accuracy'] * 100:.2f}%, test loss {result['test_loss']:.4f} "
            f"on {result['examples']:,} examples"
        )
    return 0


def _info(args, overrides: dict[str, str]) -> int:
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
    return 0


def _shm(args) -> int:
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


def _bench(name: str, argv: list[str]) -> int:
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


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    from hogwild.signals import install_terminate_handler

    command = None
    try:
        install_terminate_handler()  # first of all: SIGTERM takes Ctrl-C's cleanup path
        argv = sys.argv[1:] if argv is None else list(argv)
        command = argv[0] if argv else None
        return _dispatch(argv)
    except WorkerDiedError as exc:
        print(f"hogwild: error: {exc}", file=sys.stderr)
        return 1
    except HogwildError as exc:
        print(f"hogwild: error: {exc}", file=sys.stderr)
        return 2
    except Terminated:
        print(
            "hogwild: terminated (SIGTERM); workers stopped and shared memory removed",
            file=sys.stderr,
        )
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        if command == "data":
            print("hogwild: interrupted; rerun the same command to resume", file=sys.stderr)
        else:
            print(INTERRUPTED, file=sys.stderr)
        return 130


def _dispatch(argv: list[str]) -> int:
    parser = _parser()
    forward = len(argv) >= 2 and argv[0] == "bench" and argv[1] in BENCHMARKS
    if forward:
        args, extra = parser.parse_known_args(argv[:2])
    else:
        # Config overrides are taken out before argparse sees them: it reads an option whose
        # value holds a space (an inline TOML array of layers) as a positional argument, which
        # a subcommand's own positional would then swallow.
        given = [arg for arg in argv if _OVERRIDE.match(arg)]
        args, extra = parser.parse_known_args([arg for arg in argv if not _OVERRIDE.match(arg)])
        extra += given
    takes_overrides = args.command in ("train", "info") or getattr(args, "overrides_ok", False)
    overrides = _split_overrides(extra, parser) if takes_overrides else {}
    if extra and not takes_overrides:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if forward:
        return _bench(argv[1], argv[2:])
    if getattr(args, "run", None) is not None:
        if takes_overrides:
            args.overrides = overrides
        return args.run(args)
    if args.command == "train":
        return _train(args, overrides)
    if args.command == "eval":
        return _eval(args)
    if args.command == "data":
        from hogwild.data.cli_data import run_data_command

        return run_data_command(args)
    if args.command == "info":
        return _info(args, overrides)
    if args.command == "cluster":
        return _cluster(args, overrides)
    return _shm(args)


def run() -> None:
    """The ``hogwild`` program: :func:`main`, then exit with its status.

    The cyclic garbage collector runs less often in it (see
    :func:`hogwild.runtime.collect_garbage_less_often`). Once :func:`main` returned, everything
    still alive is taken out of its sight (``gc.freeze``): the interpreter's last full
    collection on the way out walks every object, most of them numba's compiler and type
    registries and the kernels' code, which made a visible part of each server's and job's stop,
    for memory the process is about to give back anyway. Nothing hogwild owns is released by that
    collection: every segment, socket and process has been released by its owner before
    :func:`main` returns.
    """
    from hogwild.runtime import collect_garbage_less_often
    from hogwild.signals import forget_caught_interrupts

    collect_garbage_less_often()
    code = main()
    forget_caught_interrupts()  # main caught every Ctrl-C: its status is the exit status
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    run()
