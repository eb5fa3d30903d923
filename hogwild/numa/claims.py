"""The CPUs other live hogwild jobs have pinned workers to, so that two jobs do not share cores.

A hyperparameter sweep starts several ``hogwild train`` jobs on one machine at once; planned
alone, each would pin its workers from the first core on, and two jobs' workers would share
cores while others sat idle. Workers name themselves ``hogwild-w<N>`` (the kernel's process
name, ``/proc/PID/comm``), so a new job finds the CPUs that live workers are pinned to (an
affinity of exactly one CPU) and plans its own workers on the others first. Nothing is written
anywhere: what is taken is read from the running processes, so a job that dies releases its
cores with its processes.

Two jobs planning at the same instant would both see the same free cores; :func:`placement_lock`
(an advisory ``flock`` on a file in the temporary directory) makes a job's planning and the
pinning of its workers one step (the kernels are compiled inside it too: a second job then finds
them in numba's cache), for at most ``timeout_s`` seconds of waiting.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from pathlib import Path

import psutil

WORKER_NAME_PREFIX = "hogwild-w"
LOCK_POLL_S = 0.05


def pinned_by_other_jobs() -> dict[int, int]:
    """CPU -> pid of a live hogwild worker pinned to it alone (workers of this process excluded)."""
    me = os.getpid()
    taken: dict[int, int] = {}
    for process in psutil.process_iter(["pid", "name"]):
        if not (process.info["name"] or "").startswith(WORKER_NAME_PREFIX):
            continue
        try:
            if process.ppid() == me:
                continue
            cpus = process.cpu_affinity()
        except psutil.Error:
            continue
        if len(cpus) == 1:
            taken.setdefault(cpus[0], process.info["pid"])
    return taken


def lock_path() -> Path:
    """The lock file: one per user, in the temporary directory."""
    return Path(tempfile.gettempdir()) / f"hogwild-placement-{os.getuid()}.lock"


@contextlib.contextmanager
def placement_lock(timeout_s: float = 300.0):
    """Hold the machine's placement lock while inside (proceed without it after ``timeout_s``).

    Yields:
        True if the lock is held, False if another job held it for longer than ``timeout_s``
        (the job then plans from what it sees, as it would without the lock).
    """
    try:
        fd = os.open(lock_path(), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield False
        return
    held = False
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break
                time.sleep(LOCK_POLL_S)
        yield held
    finally:
        if held:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
