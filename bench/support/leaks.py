"""What a run left behind: ``/dev/shm/hogwild*`` segments, processes and listening ports.

The benchmarks' version of the test suite's leak check (tests/conftest.py), for runs that are
not this process's children alone: :class:`LeakCheck` lists the segments before a run; after it,
:meth:`LeakCheck.count` takes every process the run ever had (a
:class:`bench.support.process_watch.Watcher` records them) and the ports its roles listened on,
waits (bounded) for those processes to be gone, and counts

- ``segments``: new ``/dev/shm/hogwild*`` entries named for one of the run's jobs (``ps.job``,
  :mod:`hogwild.shm.naming`), whoever owns them, or whose owner (recorded in the name, with its
  start time) was one of the run's processes, alive or not: the owner of a segment left behind
  by a SIGKILLed process is dead, and the segment is still a leak. Segments of other jobs and
  other owners (a test or benchmark running beside this one) are not counted, even where one of
  them got a pid the run's dead processes had;
- ``processes``: the run's processes still alive (zombies do not count);
- ``ports``: listening TCP sockets of the run's live processes, or on the run's ports where the
  socket's process cannot be told (a port of the run taken since by a process beside it is
  that process's).

It only counts: the caller decides what to remove.
"""

from __future__ import annotations

import os
import time

import psutil

from hogwild.shm import sweeper
from hogwild.shm.naming import START_TIME_TOLERANCE_S, parse_segment_name, sanitize_job

EXIT_WAIT_S = 20.0


def shm_entries() -> set[str]:
    try:
        return {e for e in os.listdir(sweeper.SHM_DIR) if e.startswith("hogwild")}
    except FileNotFoundError:
        return set()


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for proc in processes:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:
            continue
    return out


def listening(ports: set[int], pids: set[int]) -> list[str]:
    """``HOST:PORT (pid)`` of every listening TCP socket of ``pids``, or on ``ports`` whose
    process is not known."""
    found = []
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status != psutil.CONN_LISTEN:
            continue
        if conn.pid in pids or (conn.pid is None and conn.laddr.port in ports):
            found.append(f"{conn.laddr.ip}:{conn.laddr.port} (pid {conn.pid})")
    return sorted(found)


class LeakCheck:
    """Segments before a run; :meth:`count` after it (see the module docstring)."""

    def __init__(self) -> None:
        self.before = shm_entries()

    def count(
        self, processes: list[psutil.Process], ports: set[int], jobs: tuple[str, ...] = ()
    ) -> dict:
        """What the run left: ``processes`` (every one it had), ``ports`` (those it listened
        on), ``jobs`` (the ``ps.job`` names its jobs ran under)."""
        deadline = time.monotonic() + EXIT_WAIT_S
        while alive(processes) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = alive(processes)
        started = _start_times(processes)
        names = {sanitize_job(job) for job in jobs}
        segments = []
        for entry in sorted(shm_entries() - self.before):
            owner = parse_segment_name(entry)
            if owner is None:
                continue
            start = started.get(owner.pid)
            ours = start is not None and abs(owner.start_time - start) <= START_TIME_TOLERANCE_S
            if owner.job in names or ours:
                segments.append(entry)
        sockets = listening(ports, {p.pid for p in left})
        return {
            "segments": len(segments),
            "processes": len(left),
            "ports": len(sockets),
            "detail": {
                "segments": segments,
                "processes": [_describe(p) for p in left],
                "ports": sockets,
            },
        }


def _start_times(processes: list[psutil.Process]) -> dict[int, float]:
    """pid -> start time of each process (psutil keeps it once read, so a dead one's too)."""
    out = {}
    for proc in processes:
        try:
            out[proc.pid] = proc.create_time()
        except psutil.Error:
            continue
    return out


def _describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} {' '.join(proc.cmdline())[:100]}"
    except psutil.Error:
        return str(proc.pid)
