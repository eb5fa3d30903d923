"""The ``hogwild`` program: parse a command line, run its command, and turn what went wrong into
one line and an exit status.

The commands are ``train``, ``cluster``, ``eval``, ``data``, ``info``, ``config``, ``plot``,
``shm``, ``bench`` and ``partition-host``; plugins add theirs (``ps``). Their grammar is
:mod:`hogwild.cli_parser` (the flags shared by ``train`` and ``cluster``: :mod:`hogwild.cli_flags`),
what each does :mod:`hogwild.cli_commands`, and ``hogwild data ingest|preview|info|verify`` (LMDB
image caches) :mod:`hogwild.data.cli_data`.

Every failure a user can cause is a :class:`~hogwild.errors.HogwildError`; the CLI prints its
message on one line and exits with status 2 (1 for a worker that died, 4 for a parameter server
that stopped the job's bucket, 130 for Ctrl-C, 143 for SIGTERM), never a traceback. Any config key
can be set as ``--section.key=value`` after the named flags.
"""

from __future__ import annotations

import gc
import signal
import sys

from hogwild import cli_commands
from hogwild.cli_commands import (
    bench_command,
    cluster_command,
    config_show_command,
    eval_command,
    info_command,
    plot_command,
    shm_command,
    train_command,
)
from hogwild.cli_parser import (
    BENCHMARKS,
    OVERRIDE,
    build_parser,
    refuse_unknown_options,
    split_overrides,
)
from hogwild.errors import EXIT_STOPPED, HogwildError, StoppedError, Terminated, WorkerDiedError

INTERRUPTED = "hogwild: interrupted; workers stopped and shared memory removed"  # on Ctrl-C


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


def _dispatch(argv: list[str]) -> int:
    parser = build_parser()
    forward = len(argv) >= 2 and argv[0] == "bench" and argv[1] in BENCHMARKS
    if forward:
        args, extra = parser.parse_known_args(argv[:2])
    else:
        # Config overrides are taken out before argparse sees them: it reads an option whose
        # value holds a space (an inline TOML array of layers) as a positional argument, which
        # a subcommand's own positional would then swallow.
        given = [arg for arg in argv if OVERRIDE.match(arg)]
        refuse_unknown_options(parser, argv)
        args, extra = parser.parse_known_args([arg for arg in argv if not OVERRIDE.match(arg)])
        extra += given
    takes_overrides = args.command in ("train", "info") or getattr(args, "overrides_ok", False)
    overrides = split_overrides(extra, parser) if takes_overrides else {}
    if extra and not takes_overrides:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if forward:
        return bench_command(argv[1], argv[2:])
    if getattr(args, "run", None) is not None:
        if takes_overrides:
            args.overrides = overrides
        return args.run(args)
    if args.command == "train":
        return train_command(args, overrides)
    if args.command == "eval":
        return eval_command(args)
    if args.command == "data":
        from hogwild.data.cli_data import run_data_command

        return run_data_command(args)
    if args.command == "info":
        return info_command(args, overrides)
    if args.command == "cluster":
        return cluster_command(args, overrides)
    if args.command == "config":
        return config_show_command(args, overrides)
    if args.command == "plot":
        return plot_command(args)
    return shm_command(args)


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

    cli_commands.program = True
    collect_garbage_less_often()
    code = main()
    forget_caught_interrupts()  # main caught every Ctrl-C: its status is the exit status
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    run()
