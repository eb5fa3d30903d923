"""Starting and reaping the child processes of the multi-process tests.

Shared by the atomics, pool and queue stress tests: a context for a start method (with the
modules a forkserver should preload, so each child does not compile them again), the children's
start line compiled once in the parent, and a bounded run of one process per argument tuple that
kills stragglers instead of hanging the suite.

Every kernel a child calls, the parent calls first (with arguments that change nothing): numba
writes it to its on-disk cache, and the children load it from there instead of each compiling
the same code at the same time on the same cores.
"""

from __future__ import annotations

import multiprocessing as mp
import time

START_LINE_POLL_S = 0.001


def start_context(method: str, *preload: str) -> mp.context.BaseContext:
    """The ``spawn`` or ``forkserver`` context; a forkserver preloads ``preload``, then
    initialises numba's target (:mod:`hogwild.numba_target`) so that no child does it again."""
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload([*preload, "hogwild.numba_target"])
    return ctx


def compile_start_line(words) -> None:
    """Compile the atomics a start line calls from Python (``atomic_add`` of a count, then
    ``atomic_load`` of it, on an int64 array of shared words), without changing a word."""
    from hogwild.shm.atomics import atomic_add, atomic_load

    atomic_add(words, 0, 0)
    atomic_load(words, 0)


def start_line(words, index: int, n_procs: int, timeout: float = 30.0) -> None:
    """Count this process in at ``words[index]`` and return once ``n_procs`` have counted in
    (or ``timeout`` passed), so that the children race from one instant.

    It polls with a short sleep rather than spinning: under ``spawn`` the children start one
    after another, each importing for about a second, and on two cores a child spinning at the
    line would take the core from the one still importing. A millisecond's poll still lets
    every child go within a millisecond of the last, far shorter than the race that follows.
    """
    from hogwild.shm.atomics import atomic_add, atomic_load

    atomic_add(words, index, 1)
    deadline = time.monotonic() + timeout
    while atomic_load(words, index) < n_procs and time.monotonic() < deadline:
        time.sleep(START_LINE_POLL_S)


def run_processes(ctx, target, args_list, timeout: float = 60.0) -> list[int]:
    """Start one process per args tuple, wait for all (killing stragglers); their exit codes."""
    procs = [ctx.Process(target=target, args=args) for args in args_list]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            proc.join(max(0.1, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    return [proc.exitcode for proc in procs]
