"""The ``hogwild`` command line's grammar: its commands, their options, and the errors a command
line that does not parse gets.

:func:`build_parser` builds the parser of every command (``train``, ``cluster``, ``eval``,
``data``, ``info``, ``config``, ``plot``, ``shm``, ``bench``, ``partition-host``, and those the
plugins register under the entry-point group :data:`PLUGIN_COMMANDS`); the flags shared by
``train`` and ``cluster``, their hidden old spellings and the errors that name them are in
:mod:`hogwild.cli_flags`. A config key given as ``--section.key=value`` matches :data:`OVERRIDE`
(:func:`hogwild.cli._dispatch` takes those out before argparse parses, and
:func:`split_overrides` reads them), and an option the command does not have is refused naming
it, with a suggestion (:func:`refuse_unknown_options`). What each command then does is
:mod:`hogwild.cli_commands` (``data``'s: :mod:`hogwild.data.cli_data`; a plugin's: the ``run``
its parser sets); :mod:`hogwild.cli` runs them.
"""

from __future__ import annotations

import argparse
import re

from hogwild.cli_commands import partition_host_command
from hogwild.errors import HogwildError

OVERRIDE = re.compile(r"^--([a-z_]+(?:\.[a-z_0-9]+)+)=(.*)$")
PLUGIN_COMMANDS = "hogwild.commands"
BENCHMARKS = {"cores": "Adam Fig. 8: training throughput against cores, beside PyTorch Hogwild"}


def build_parser() -> argparse.ArgumentParser:
    """The parser of every ``hogwild`` command, the plugins' included."""
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
    host.set_defaults(run=partition_host_command)


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


def split_overrides(extra: list[str], parser: argparse.ArgumentParser) -> dict[str, str]:
    """The ``--section.key=value`` arguments as ``{key: value}``; anything else is a usage
    error of ``parser``."""
    overrides = {}
    for arg in extra:
        match = OVERRIDE.match(arg)
        if not match:
            parser.error(f"unrecognized argument {arg!r} (config keys are --section.key=value)")
        overrides[match.group(1)] = match.group(2)
    return overrides


def refuse_unknown_options(parser: argparse.ArgumentParser, argv: list[str]) -> None:
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
        if not name.startswith("--") or name in known or OVERRIDE.match(arg):
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
