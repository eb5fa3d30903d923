"""Which pinned workers :func:`hogwild.numa.claims.pinned_by_other_jobs` counts as taken.

Real processes named as workers name themselves (``hogwild-w<N>``) and pinned to one CPU: one
that is this process's own child is this job's and not counted; one below a child that is not
this process's forkserver (a ``hogwild train`` subprocess's worker) belongs to another job and
is.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from hogwild.numa.claims import pinned_by_other_jobs

WAIT_S = 60.0

WORKER = textwrap.dedent(
    """
    import ctypes, os, sys
    ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b"hogwild-w7"), 0, 0, 0)  # PR_SET_NAME
    os.sched_setaffinity(0, {CPU})
    print(os.getpid(), flush=True)
    sys.stdin.read()  # until the test closes the pipe
    """
)


def _worker_source(cpu: int) -> str:
    return WORKER.replace("CPU", str(cpu))


def _job_with_a_worker(cpu: int) -> str:
    """A child that is a job of its own: it starts the worker and waits for it."""
    return (
        "import subprocess, sys\n"
        f"sys.exit(subprocess.call([sys.executable, '-c', {_worker_source(cpu)!r}]))\n"
    )


def _run(source: str) -> tuple[subprocess.Popen, int]:
    process = subprocess.Popen(
        [sys.executable, "-c", source], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    return process, int(process.stdout.readline())


def _end(process: subprocess.Popen) -> None:
    process.stdin.close()
    try:
        process.wait(WAIT_S)
    finally:
        process.kill()
        process.wait()
        process.stdout.close()


def test_a_worker_of_a_job_this_process_started_counts_as_taken_its_own_child_does_not():
    cpu = max(os.sched_getaffinity(0))
    job, grandchild = _run(_job_with_a_worker(cpu))
    try:
        assert pinned_by_other_jobs().get(cpu) == grandchild
    finally:
        _end(job)
    own, child = _run(_worker_source(cpu))
    try:
        assert child not in pinned_by_other_jobs().values()
    finally:
        _end(own)
