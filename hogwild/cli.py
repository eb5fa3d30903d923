"""The ``hogwild`` command line: ``train``, ``cluster``, ``eval``, ``data``, ``info``, ``config``,
``plot``, ``shm`` and ``bench``; plugins add theirs (``ps``).

Every failure a user can cause is a :class:`~hogwild.errors.HogwildError`; the CLI prints its
message on one line and exits with status 2 (1 for a worker that died, 4 for a parameter server
that stopped the job's bucket, 130 for Ctrl-C), never a traceback. Any config key can be set as
``--section.key=value`` after the named flags; the flags themselves, their hidden old spellings
and the errors that name them are in :mod:`hogwild.cli_flags`.

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
import math
import os
import re
import signal
import sys
from pathlib import Path

from hogwild.errors import EXIT_STOPPED, HogwildError, StoppedError, Terminated, WorkerDiedError

INTERRUPTED = "hogwild: interrupted; workers stopped and shared memory removed"  # on Ctrl-C

_OVERRIDE = re.compile(r"^--([a-z_]+(?:\.[a-z_0-9]+)+)=(.*)$")
_program = False  # whether hogwild is this process's program (run), not a script calling main
PLUGIN_COMMANDS = "hogwild.commands"
BENCHMARKS = {"cores": "Adam Fig. 8: training throughput against cores, beside PyTorch Hogwild"}
BENCHMARK_SCRIPTS = {"cores": "adam_fig8_cores"}  # a benchmark's name -> its bench/figures/ file


def _parser() -> argparse.ArgumentParser:
    from hogwild.cli_flags import (
        HogwildParser,
        add_train_only_flags,
        add_training_flags,
    )

    parser = HogwildParser(
        prog="hogwild",
        description="Project Adam's lock-free multi-process training engine for CPUs.",
    )
    parser.add_argument("--version", action="version", version=f"hogwild {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=HogwildParser)

    train = sub.add_parser(
        "train",
        help="train a model",
        description="Train a model with lock-free worker processes on shared weights. "
        "Any config key can be set as --section.key=value (e.g. --optim.momentum=0.5).",
    )
    add_training_flags(train, "train")
    add_train_only_flags(train)

    evaluate = sub.add_parser("eval", help="evaluate a checkpoint on the test set")
    evaluate.add_argument("checkpoint", help="checkpoint directory, .json or .safetensors file")
    evaluate.add_argument(
        "--data",
        metavar="SOURCE",
        help="an LMDB image cache, a directory of MNIST idx files, 'mnist', or a .npz or CSV "
        "file (its test split, as training chose it) (default: the checkpoint's data.source)",
    )
    evaluate.add_argument(
        "--target",
        metavar="COLUMN",
        help="with --data FILE.csv: the label or target column; the rows training held back "
        "(the checkpoint's seed) are evaluated",
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
    info.add_argument(
        "--config", metavar="FILE", help="job config (TOML) (default: the bundled job)"
    )

    config = sub.add_parser(
        "config",
        help="show the job a config resolves to",
        description="Print the resolved job as TOML: the bundled job, or --config FILE "
        "(a file without [model] layers is layered over the bundled job), with any "
        "--section.key=value overrides. The output is itself a complete config.",
    )
    config_sub = config.add_subparsers(dest="config_command", required=True)
    show = config_sub.add_parser("show", help="print the resolved job as TOML")
    show.add_argument(
        "--config", metavar="FILE", help="job config (TOML) (default: the bundled job)"
    )
    show.set_defaults(overrides_ok=True)

    plot = sub.add_parser(
        "plot",
        help="plot runs' loss and accuracy (needs matplotlib: the bench extra)",
        description="Plot the test accuracy and the train and test loss of one or more runs "
        "against epochs and against seconds, the runs side by side in each panel.",
    )
    plot.add_argument(
        "runs", nargs="+", metavar="RUN_OR_METRICS",
        help="a metrics file (--metrics), or a run directory holding metrics.jsonl",
    )  # fmt: skip
    plot.add_argument("--out", required=True, help="the image to write (.png, .svg, .pdf)")
    info.add_argument(
        "--partitions", type=int, metavar="K",
        help="also print the plan of a replica split over K partitions (default: the job's "
        "model.partitions)",
    )  # fmt: skip

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
    _add_partition_host_command(sub)
    _add_plugin_commands(sub)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hogwild")
    except PackageNotFoundError:  # run from a source tree that was not installed
        return "unknown (not installed)"


def _add_cluster_command(sub) -> None:
    from hogwild.cli_flags import add_cluster_only_flags, add_training_flags

    cluster = sub.add_parser(
        "cluster",
        help="train with data servers, model replicas and parameter servers (Adam's system)",
        description="Start a job's parameter servers, data servers and model replicas (on this "
        "host, or a Ray cluster), train (Downpour across replicas), stop them all. Any config "
        "key can be set as --section.key=value; the roles are [cluster] in the job config.",
    )
    add_training_flags(cluster, "cluster")
    add_cluster_only_flags(cluster)
    cluster.set_defaults(overrides_ok=True)
    # ``replica`` is started by a launcher, not by users: it parses but is not listed.
    actions = cluster.add_subparsers(dest="cluster_command", metavar="{status}")
    status = actions.add_parser("status", help="the status table of a running job")
    status.add_argument("target", help="the job's run directory (--checkpoint-dir) or HOST:PORT")
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    status.add_argument("--job", help="the job's name (with HOST:PORT)")
    status.add_argument("--keys", help="the job's CURVE key directory (with HOST:PORT)")
    replica = actions.add_parser("replica")
    replica.add_argument("--index", type=int, required=True)
    replica.add_argument("--incarnation", type=int, default=0)  # the driver's count of its starts
    replica.add_argument("--bind", default="127.0.0.1")
    replica.add_argument("--keys", default=None)
    member = actions.add_parser("member")  # a synchronous worker group's replica process
    member.add_argument("--index", type=int, required=True)
    member.add_argument("--coordinator", required=True)  # its group's HOST:PORT
    member.add_argument("--incarnation", type=int, default=0)  # its group's (fencing token)
    member.add_argument("--bind", default="127.0.0.1")
    member.add_argument("--keys", default=None)


def _add_partition_host_command(sub) -> None:
    from hogwild.partition.frames import WAIT_S

    host = sub.add_parser(
        "partition-host",
        help="run this host's partitions of a partitioned replica (model.partition_hosts)",
        description="Bind HOST:PORT (this host's entry in the job's model.partition_hosts), wait "
        "for the job's leader (the host of partition 0, started with `hogwild train`), run this "
        "host's partitions until the leader stops them, then exit. docs/partitioning.md.",
    )
    host.add_argument("--bind", required=True, metavar="HOST:PORT",
                      help="this host's address as model.partition_hosts gives it")  # fmt: skip
    host.add_argument("--keys", default=None, metavar="DIR",
                      help="the job's CURVE key directory (cluster.keys; needed beyond "
                      "loopback)")  # fmt: skip
    host.add_argument("--wait-s", type=float, default=WAIT_S,
                      help=f"seconds to wait for the leader (default {WAIT_S:.0f})")  # fmt: skip
    host.add_argument("--leader-role", default="", metavar="ROLE",
                      help="the leader's role in the job's roster (a cluster job's spread "
                      "replica, e.g. 'replica 0'): the only one it takes a job from")  # fmt: skip
    host.set_defaults(run=_partition_host)


def _partition_host(args) -> int:
    from hogwild.partition.follower import run_cli

    return run_cli(args)


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


def _resolve(args, overrides: dict[str, str], command: str):
    """The job: ``--config`` (or the bundled job), then the flags, then the overrides."""
    from hogwild.cli_flags import apply_flags, flag_overrides
    from hogwild.config import load_config

    flags = flag_overrides(args, command)
    if getattr(args, "no_progress", None):
        flags["output.progress"] = ("--no-progress", False)
    if command == "train" and "ps.servers" in flags and "train.parameters" not in overrides:
        flags["train.parameters"] = (flags["ps.servers"][0], "ps")
    return apply_flags(load_config(args.config), flags, overrides)


def _train(args, overrides: dict[str, str]) -> int:
    from hogwild.training.api import train

    _configure_logging(args)
    config = _resolve(args, overrides, "train")
    partitioned = config.model.partitions > 1
    if partitioned and (args.model or args.target or args.loss != "cross_entropy"):
        raise HogwildError("--partitions K > 1 trains the job's own model on MNIST idx data")
    if not partitioned and args.loss != "cross_entropy" and not args.model:
        raise HogwildError("--loss goes with --model (a job's own model sets its last layer)")
    if config.train.start_method == "forkserver" and not args.model and _program:
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


def _cluster(args, overrides: dict[str, str]) -> int:
    if args.cluster_command == "replica":
        from hogwild.cluster.replica import run_replica

        args.overrides = overrides
        # a role started as a fresh interpreter (the Ray launcher's, a spawned local one) forks
        # its workers' forkserver from itself, as a role forked from the role server does; only
        # where hogwild is the program (see the same test in _train)
        args.fork_workers_server = _program
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
    config = _resolve(args, overrides, "cluster")
    data = load_data(config, args.data)
    config = with_source(config, data)
    driver = ClusterDriver(config, data, resume=bool(args.resume), overwrite=bool(args.overwrite))
    final = driver.run()
    print(json.dumps({k: v for k, v in final.items() if k not in ("event", "config")}))
    return 0


def _config_show(args, overrides: dict[str, str]) -> int:
    from hogwild.cli_flags import apply_flags
    from hogwild.config import load_config
    from hogwild.config.toml_text import config_to_toml

    config = apply_flags(load_config(args.config), {}, overrides)
    print(config_to_toml(config), end="")
    return 0


def _plot(args) -> int:
    from hogwild.training.curves import plot_runs

    written = plot_runs(args.runs, args.out)
    print(f"wrote {written}")
    return 0


def _eval(args) -> int:
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
        if config.model.partition_hosts:
            from hogwild.partition.hosts import HostGroups

            groups = HostGroups.from_hosts(config.model.partition_hosts, plan.k)
            if groups.n_groups > 1:
                print(groups.describe(plan))
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
    except StoppedError as exc:  # a cluster driver does not restart this one: said on one line
        print(f"hogwild: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_STOPPED
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


def _refuse_unknown_options(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """An option the command does not have is an error naming it, before argparse parses.

    Otherwise its value would be read as a positional argument (``cluster --workers-per 2``
    reported ``2`` as an invalid subcommand), and a near miss deserves a suggestion.
    """
    from difflib import get_close_matches

    from hogwild.cli_flags import option_strings

    command = parser_of(parser, argv[:1])
    if command is None:
        return
    known = option_strings(command) | {"-h", "--help", "--version"}
    for arg in argv[1:]:
        name = arg.split("=", 1)[0]
        if not name.startswith("--") or name in known or _OVERRIDE.match(arg):
            continue
        close = get_close_matches(name, sorted(known), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        command.error(
            f"unrecognized argument {name}{hint} (flags must be "
            "spelled in full; config keys are --section.key=value)"
        )


def parser_of(parser: argparse.ArgumentParser, path: list[str]):
    """The subcommand parser at ``path`` (``["cluster"]``), or None."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and path and path[0] in action.choices:
            return action.choices[path[0]]
    return None


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
        _refuse_unknown_options(parser, argv)
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
    if args.command == "config":
        return _config_show(args, overrides)
    if args.command == "plot":
        return _plot(args)
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

    global _program
    _program = True
    collect_garbage_less_often()
    code = main()
    forget_caught_interrupts()  # main caught every Ctrl-C: its status is the exit status
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    run()
