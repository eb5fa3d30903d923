"""A process's command line as ``ps`` shows it, changed without changing its name.

A process forked from a preloaded one (a cluster role from the role server, a workers' forkserver
from a replica or a trainer) would show the command line of the process it was forked from:
whatever finds a process by its command line (a run directory, a role's kind) would find the
wrong one. :func:`set_title` gives it its own. ``setproctitle`` also renames the process (its
``comm``, what ``ps -o comm`` and ``psutil``'s ``name()`` show, and what a worker sets to its own
name later); the name is put back as it was.
"""

from __future__ import annotations

import contextlib
import ctypes

PR_SET_NAME = 15


def set_title(title: str) -> None:
    """``title`` as this process's command line, its name (``comm``) left as it was."""
    import setproctitle

    with open("/proc/self/comm", "rb") as comm:
        name = comm.read().rstrip(b"\n")
    setproctitle.setproctitle(title)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
