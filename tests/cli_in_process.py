"""Run a ``hogwild`` command through the command line's entry inside the test's process.

For commands that start no process of their own (``eval``, ``plot``, and a ``train`` refused
before any worker starts: a bad config, data or model file; in the test's process ``train``
forks no workers' server either, which only the program does): as a subprocess each such
command costs an interpreter start and hogwild's imports (PyTorch's too, for a model from a file),
more than the work it does, and the same argv through :func:`hogwild.cli.main` runs the same
code. :func:`hogwild.cli.main` installs its SIGTERM handler for the rest of the process's life
(a program's entry may); the test process's own handler is put back after the command, so a later
test in the same process still sees the handler it started with. A command may also set
variables for the processes it would start (``hogwild train`` its log level, for its roles): the
environment is put back too.
"""

from __future__ import annotations

import os
import signal


def hogwild_cli(capsys, *args) -> tuple[int, str, str]:
    """``hogwild ARGS`` in this process: its exit status, stdout and stderr (``capsys``: pytest's
    fixture; what was printed before the command is not counted as its)."""
    from hogwild.cli import main

    capsys.readouterr()
    previous, environment = signal.getsignal(signal.SIGTERM), dict(os.environ)
    try:
        code = main([str(a) for a in args])
    finally:
        signal.signal(signal.SIGTERM, previous)
        if dict(os.environ) != environment:
            os.environ.clear()
            os.environ.update(environment)
    out, err = capsys.readouterr()
    return code, out, err
