"""What a fresh worker forkserver imports once (:data:`hogwild.training.zygote.PRELOAD`), so that
every worker it forks starts past it: :mod:`hogwild.training.worker_imports`, with Ctrl-C ignored
first.

The server ignores Ctrl-C anyway once it serves (its children's owner stops them); ignored from
the start, a Ctrl-C to the process group while it imports prints no traceback from here. Nothing
else should import this module: a process that forks workers' servers from itself imports
:mod:`hogwild.training.worker_imports`, which leaves its signals alone.
"""

# ruff: noqa: E402 - the import comes after Ctrl-C is ignored
import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)

import hogwild.training.worker_imports  # noqa: F401
